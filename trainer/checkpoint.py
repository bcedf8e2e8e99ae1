"""Checkpoints written atomically: a crash while writing leaves the previous one loadable."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: Path) -> dict:
    """Tensors, numbers, strings and containers only: a checkpoint is never a way to run code."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; give the checkpoint.pt of a run")
    return torch.load(path, map_location="cpu", weights_only=True)
