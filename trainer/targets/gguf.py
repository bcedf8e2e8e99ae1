"""A GGUF file (a pretrained model shipped quantized: llama.cpp's format) to an ordinary Hugging Face model dir:
transformers dequantizes it to float (`gguf_file=`, with the `gguf` and `accelerate` packages of the convert-cpu
lock), then the weights go to safetensors beside the tokenizer and its chat template. Run once per file by envkit
(`envkit target fetch chat`, `envkit target convert FILE.gguf`); the dir then loads like any local target.
"""

from __future__ import annotations

from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.common.hf_logging import quiet_transformers


def convert(gguf: Path, out: Path) -> dict:
    """Write the HF dir for `gguf` into `out` (which must not exist); returns what it holds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.model.target import check_family

    quiet_transformers()
    if not gguf.is_file():
        raise TrainerInputError(f"{gguf}: not a file")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise TrainerInputError(f"{gguf} could not be read as a GGUF model ({str(exc)[:300]})") from None
    check_family(model.config)
    # Newer transformers (5.17 here) keep a GGUF model marked quantized and refuse to save it, though its weights
    # are dequantized floats by now: the marks go, so it saves as the plain model it is.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if not tokenizer.chat_template:
        raise TrainerInputError(f"{gguf} holds no chat template; an instruct target needs one")
    return {"model_type": model.config.model_type, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": model.config.vocab_size, "tied_embeddings": bool(model.config.tie_word_embeddings),
            "chat_template": True, "files": sorted(p.name for p in out.iterdir())}
