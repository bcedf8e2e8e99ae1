"""Child processes that die with their parent (Linux's PR_SET_PDEATHSIG; a no-op elsewhere): a killed
envkit must not leave a warm-up, an install or a trainer running on without the lock or the supervisor
that owns it, and a killed trainer launcher must not leave torchrun's agent holding GPUs. Torch-free:
envkit imports it too."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """preexec_fn: the kernel sends `signum` to the child when its parent exits."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):
        pass


def killed_with_parent() -> None:
    """preexec_fn for a child that must not outlive its parent even for a moment of clean-up (SIGKILL)."""
    die_with_parent(signal.SIGKILL)
