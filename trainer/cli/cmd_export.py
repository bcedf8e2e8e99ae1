"""`python -m trainer export`: the DFlash serving format (config.json, model.safetensors, target/) from a
checkpoint."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from trainer.export.place import check_out

NAME = "export"


class Stop(Exception):
    """SIGTERM during an export: unwinds through export(), which removes its temporary directory."""


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="write the DFlash serving format (SGLang, vLLM, dflash) from a checkpoint")
    p.add_argument("--ckpt", required=True, help="RUN_DIR/checkpoint.pt")
    p.add_argument("--out", required=True, help="directory to create (refused when not empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace a previous export at --out")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype (default: the training dtype)")


def run(args) -> int:
    """Write the DFlash serving format (config.json, model.safetensors, target/) from a checkpoint."""
    check_out(Path(args.out).absolute(), args.force)  # a refused --out costs no torch import, no checkpoint read
    from trainer.export.dflash import export

    def terminate(signum, frame):
        raise Stop  # unwinds through export(), which removes its temporary directory

    signal.signal(signal.SIGTERM, terminate)
    try:
        print(json.dumps(export(Path(args.ckpt), Path(args.out), force=args.force, dtype=args.dtype)))
    except Stop:
        print("Error: export stopped by SIGTERM; nothing was written", file=sys.stderr)
        return 143
    return 0
