"""`python -m trainer convert-gguf`: a GGUF model file dequantized into a Hugging Face model dir."""

from __future__ import annotations

import json
from pathlib import Path

NAME = "convert-gguf"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="dequantize a GGUF model file into a Hugging Face model dir (safetensors, "
                                  "tokenizer, chat template); needs the convert-cpu lock's gguf and accelerate")
    p.add_argument("--gguf", required=True, help="the .gguf file")
    p.add_argument("--out", required=True, help="the model dir to write (must not exist)")


def run(args) -> int:
    from trainer.targets.gguf import convert

    print(json.dumps(convert(Path(args.gguf), Path(args.out))))
    return 0
