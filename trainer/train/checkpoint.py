"""Checkpoints written atomically: a crash while writing leaves the previous one loadable."""

from __future__ import annotations

import io
import os
import random
import stat
from pathlib import Path

import torch

from trainer.common.errors import TrainerInputError
from trainer.common.files import atomic_write


def save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    atomic_write(path, lambda handle: torch.save(state, handle), mode=0o666)


def remove_stale_temps(path: Path) -> None:
    """The temp files of earlier writes of this checkpoint that a SIGKILL left (atomic_write cleans up on any
    failure it lives through, not on one it does not): a run dir has one writer, so none is in use."""
    for temp in path.parent.glob(f".{path.name}.*.tmp"):
        if temp.is_file() and not temp.is_symlink() and temp.lstat().st_uid == os.getuid():
            temp.unlink(missing_ok=True)


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
    state["drafter"] = _current_names(state["drafter"])
    return state


def to_bytes(state: dict) -> bytes:
    """A state as the bytes of a checkpoint file: what a rank sends another instead of a pickle."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes, source: str) -> dict:
    """A state received as bytes, read exactly as a checkpoint file is: weights-only, keys and types checked.
    Whoever sent it (the rendezvous does not authenticate its members) gets data here, never code."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for anything but plain data, RuntimeError for a damaged zip, ...
        raise TrainerInputError(f"the state received from {source} is not a weights-only trainer state "
                                f"({str(exc).strip()[:200] or type(exc).__name__}); nothing in it was run") from None
    _check_state(Path(source), state)
    return state


def check_compatible(path: Path, state: dict, config: dict) -> None:
    """A checkpoint resumes only the run it was written by: the same drafter and target (its weights' shapes)."""
    for section in ("drafter", "target"):
        saved, wanted = state["config"].get(section), config.get(section)
        if saved != wanted:
            differing = sorted(k for k in set(saved or {}) | set(wanted or {})
                               if (saved or {}).get(k) != (wanted or {}).get(k)) if isinstance(saved, dict) else [section]
            raise TrainerInputError(f"checkpoint {path} was written by a run of another config ({section}."
                                    f"{differing[0] if differing else '?'} differs); resume it with its own "
                                    f"config.json, or start a new run")


def restore_rng(path: Path, rng) -> None:
    """The torch and Python random states a checkpoint carries; a malformed one is an input error."""
    try:
        if not (isinstance(rng, dict) and isinstance(rng.get("torch"), torch.Tensor)
                and rng["torch"].dtype == torch.uint8):
            raise ValueError("no torch ByteTensor state")
        python = rng.get("python")
        if not isinstance(python, tuple):
            raise ValueError("no Python random state")
        torch.set_rng_state(rng["torch"])
        random.setstate(python)
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise TrainerInputError(f"checkpoint {path}: its random state is malformed ({str(exc)[:120]}); "
                                f"the checkpoint is damaged") from None


# The drafter's parameters before they took the reference DFlash model's names (envkit 0.1.0 checkpoints up to
# 2026-12-07): a checkpoint that holds them is read under today's names, so older runs still resume and export.
_FIRST_NAMES = {"fuse.": "fc.", "fuse_norm.": "hidden_norm.", "final_norm.": "norm.",
                "input_norm.": "input_layernorm.", "post_norm.": "post_attention_layernorm.",
                **{f"{p}_proj.": f"self_attn.{p}_proj." for p in "qkvo"},
                **{f"{p}_norm.": f"self_attn.{p}_norm." for p in "qk"},
                **{f"{p}_proj.": f"mlp.{p}_proj." for p in ("gate", "up", "down")}}


def _current_name(name: str) -> str:
    layer, rest = "", name
    if name.startswith("layers."):
        index, _, rest = name[len("layers."):].partition(".")
        layer = f"layers.{index}."
    first = next((old for old in _FIRST_NAMES if rest.startswith(old)), None)
    return layer + (_FIRST_NAMES[first] + rest[len(first):] if first else rest)


def _current_names(drafter: dict) -> dict:
    return {_current_name(name): tensor for name, tensor in drafter.items()}


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
    if "rng" in state and not isinstance(state["rng"], dict):
        raise TrainerInputError(f"checkpoint {path}: its random state is malformed; the checkpoint is damaged")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in state["layer_ids"]):
        raise TrainerInputError(f"checkpoint {path}: layer_ids must be layer numbers, not {state['layer_ids']!r:.80}")
