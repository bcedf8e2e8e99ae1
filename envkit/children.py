"""Child processes that die with envkit: a killed envkit must not leave a warm-up, an install or a
trainer running on without the lock or the supervisor that owns it."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to the child when its parent exits (Linux; a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
