"""Compiled training in several threads without PyTorch's process-global tracing races (HAZARDS.md).

`install()` (idempotent, before anything is compiled):
- H1: on torch < 2.14 the FX tracing flag is a module global, so a symbolic trace in one thread
  makes `torch.compile`d calls in every other thread raise (or run eager). The replacement check
  answers per thread: the tracing thread still sees its own trace, others do not. On torch >=
  2.14 the flag is already thread-local and nothing is installed.
- H3: dynamo's config is thread-local (torch >= 2.12); `apply_dynamo_settings()` runs at the start
  of every worker thread.
- H2/H4: FX patches nn.Module.__call__ for the whole process while it traces, which no flag can
  fix. The `CompileGate` is a readers/writer lock: forward/backward passes hold it shared, anything
  that may compile (a shape not warmed yet) holds it exclusively, so no trace overlaps another
  thread's module calls. After warm-up it is never taken exclusively.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

import torch

_state = threading.local()
_install_lock = threading.Lock()
_installed: dict[str, str] | None = None

# What the trainer needs in every thread that compiles or runs compiled code (H3).
DYNAMO_SETTINGS = {
    # Buckets x replicas graphs must fit; the default 8 silently falls back to eager beyond it.
    "recompile_limit": 64,
    "accumulated_recompile_limit": 1024,
    # A compiled call under a foreign trace must fail loudly, never run eager in silence (H8).
    "error_on_nested_fx_trace": True,
}


def tracing_in_this_thread() -> bool:
    return getattr(_state, "trace_depth", 0) > 0


def _thread_aware_is_fx_symbolic_tracing() -> bool:
    return tracing_in_this_thread() and not torch.compiler.is_compiling()


def install() -> dict[str, str]:
    """Install the H1 replacement (when this torch needs it); return what is in place per hazard."""
    global _installed
    with _install_lock:
        if _installed is not None:
            return _installed
        import torch.fx._symbolic_trace as symbolic_trace

        if hasattr(symbolic_trace, "_is_fx_tracing_flag"):
            original_trace = symbolic_trace.Tracer.trace

            @functools.wraps(original_trace)
            def trace(self, *args, **kwargs):
                _state.trace_depth = getattr(_state, "trace_depth", 0) + 1
                try:
                    return original_trace(self, *args, **kwargs)
                finally:
                    _state.trace_depth -= 1

            symbolic_trace.Tracer.trace = trace
            # compile_wrapper looks this name up when torch.compile wraps a function: hence "before compiling".
            symbolic_trace.is_fx_symbolic_tracing = _thread_aware_is_fx_symbolic_tracing
            h1 = "thread-aware FX tracing check installed"
        else:
            h1 = f"not needed: torch {torch.__version__} keeps the FX tracing flag per thread"
        _installed = {"H1": h1, "H2": "compile gate", "H3": "dynamo settings applied per thread",
                      "H4": "buckets compiled before threads start"}
        return _installed


def apply_dynamo_settings(*, strict: bool = False) -> None:
    """Dynamo settings for the calling thread (they do not carry over from the main thread, H3)."""
    for name, value in DYNAMO_SETTINGS.items():
        setattr(torch._dynamo.config, name, value)
    # --strict-compile: hitting the limit raises instead of silently running eager.
    torch._dynamo.config.fail_on_recompile_limit_hit = strict


class CompileGate:
    """Readers/writer lock; writers (possible compiles) wait for readers to drain and go first."""

    def __init__(self, *, enabled: bool = True):
        self.enabled = enabled
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.warmed: set = set()
        self.exclusive_entries = 0  # compiles after warm-up (a healthy run keeps this at 0)

    @contextmanager
    def shared(self, timeout: float = 600.0):
        if not self.enabled:
            yield
            return
        with self._cond:
            if not self._cond.wait_for(lambda: not self._writer and not self._writers_waiting, timeout):
                raise TimeoutError("compile gate: waited too long for a compile in another thread")
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout: float = 600.0):
        if not self.enabled:
            yield
            return
        with self._cond:
            self._writers_waiting += 1
            try:
                if not self._cond.wait_for(lambda: not self._writer and self._readers == 0, timeout):
                    raise TimeoutError("compile gate: waited too long for other threads' passes to finish")
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    @contextmanager
    def for_shape(self, shape_key):
        """Shared for a warmed shape; exclusive (and remembered) for a new one, which may compile."""
        if shape_key in self.warmed:
            with self.shared():
                yield False
            return
        with self.exclusive():
            self.exclusive_entries += 1
            yield True
            self.warmed.add(shape_key)
