"""Checkpoints written atomically: a crash while writing leaves the previous one loadable."""

from __future__ import annotations

import stat
from pathlib import Path

import torch

from trainer.errors import TrainerInputError
from trainer.files import atomic_write


def save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda handle: torch.save(state, handle), mode=0o666)


# What every checkpoint the trainer writes holds, and the type of each.
REQUIRED = {"config": dict, "step": int, "drafter": dict, "layer_ids": list, "mask_token_id": int}


def load(path: Path) -> dict:
    """Tensors, numbers, strings and containers only: a checkpoint is never a way to run code. A link, a FIFO,
    a pickle of anything else or a state without the trainer's keys is a TrainerInputError."""
    path = Path(path)
    try:
        info = path.lstat()
    except OSError:
        raise TrainerInputError(f"checkpoint {path} does not exist; give the checkpoint.pt of a run") from None
    if not stat.S_ISREG(info.st_mode):
        raise TrainerInputError(f"checkpoint {path} is not a regular file (a link, FIFO or device); refusing to read it")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for anything but plain data, RuntimeError for a damaged zip, ...
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise TrainerInputError(f"checkpoint {path} is not a weights-only checkpoint of this trainer ({reason}); "
                                f"nothing in it was run") from None
    _check_state(path, state)
    return state


def _check_state(path: Path, state) -> None:
    if not isinstance(state, dict):
        raise TrainerInputError(f"checkpoint {path} holds a {type(state).__name__}, not a trainer state")
    for key, kind in REQUIRED.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise TrainerInputError(f"checkpoint {path} has no valid {key!r} ({kind.__name__}); it was not written "
                                    f"by this trainer or is damaged")
    bad = [name for name, tensor in state["drafter"].items()
           if not isinstance(name, str) or not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point()
           or not bool(torch.isfinite(tensor).all())]
    if bad:
        raise TrainerInputError(f"checkpoint {path}: drafter weight {str(bad[0])[:80]!r} is not a finite floating-point "
                                f"tensor; the checkpoint is damaged")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in state["layer_ids"]):
        raise TrainerInputError(f"checkpoint {path}: layer_ids must be layer numbers, not {state['layer_ids']!r:.80}")
