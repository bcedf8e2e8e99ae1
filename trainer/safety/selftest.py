"""Self-tests of the trainer's hazard mitigations (trainer/common/mitigations.py), run in the managed venv.

Each test reproduces its hazard with the mitigation off, then runs the trainer's own mitigation
code and checks the failure is gone. A test passes only when the mitigated case works; whether
the stock case failed is reported beside it (`reproduced`), since a newer torch may have fixed
the hazard. Tests use tiny inputs and dynamo's eager backend, so the whole suite takes seconds.
Order matters: `threadsafe.install()` is process-wide and irreversible, so the H1 stock case runs
before it.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trainer.common.mitigations import MITIGATIONS, WARM_LOCK_ENV
from trainer.config.schema import tiny
from trainer.data.datasets import bucket_for
from trainer.metrics.monitor import CompileMonitor
from trainer.model.drafter import BACKENDS, pick_attention
from trainer.safety import threadsafe


@dataclass(frozen=True)
class Outcome:
    passed: bool  # the mitigated case works
    reproduced: bool  # the stock case failed as the hazard says (False: this torch is not affected)
    detail: str


class Blocking(torch.nn.Module):
    """A module whose forward, under torch.fx.symbolic_trace, holds the trace open until released."""

    def __init__(self, tracing: threading.Event, release: threading.Event):
        super().__init__()
        self.tracing, self.release = tracing, release

    def forward(self, x):
        self.tracing.set()
        self.release.wait(timeout=1.0)  # the gated case waits here: the other thread cannot run until then
        return x + 1


def _under_foreign_trace(call, gate: threadsafe.CompileGate | None = None) -> str:
    """Run `call` in this thread while another thread symbolically traces; 'ok' or the error it raised."""
    tracing, release = threading.Event(), threading.Event()

    def trace():
        if gate is None:
            torch.fx.symbolic_trace(Blocking(tracing, release))
            return
        with gate.exclusive():
            torch.fx.symbolic_trace(Blocking(tracing, release))

    tracer = threading.Thread(target=trace, name="selftest-tracer")
    tracer.start()
    tracing.wait(timeout=10)
    try:
        if gate is None:
            call()
        else:
            with gate.shared():
                call()
        return "ok"
    except Exception as exc:  # the hazard's failure is the result here, not an error of the self-test
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        release.set()
        tracer.join()


def compiled_call_under_foreign_trace() -> Outcome:
    x = torch.ones(4)
    stock_fn = torch.compile(lambda t: t * 2, backend="eager")
    stock_fn(x)  # warmed: the race is about calling compiled code, not compiling it
    stock = _under_foreign_trace(lambda: stock_fn(x))
    threadsafe.install()
    # A wrapper made after install() binds the thread-aware check (HAZARDS.md H1).
    fixed_fn = torch.compile(lambda t: t * 3, backend="eager")
    fixed_fn(x)
    fixed = _under_foreign_trace(lambda: fixed_fn(x))
    return Outcome(fixed == "ok", stock != "ok", f"stock: {stock}; with install(): {fixed}")


def module_call_under_foreign_trace() -> Outcome:
    linear = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    stock = _under_foreign_trace(lambda: linear(x))
    fixed = _under_foreign_trace(lambda: linear(x), gate=threadsafe.CompileGate())
    return Outcome(fixed == "ok", stock != "ok", f"stock: {stock}; under the compile gate: {fixed}")


def dynamo_settings_in_worker_thread() -> Outcome:
    threadsafe.apply_dynamo_settings()
    wanted = dict(threadsafe.DYNAMO_SETTINGS)
    seen: dict[str, dict] = {}

    def read(label: str, apply: bool):
        if apply:
            threadsafe.apply_dynamo_settings()
        seen[label] = {name: getattr(torch._dynamo.config, name) for name in wanted}

    for label, apply in (("stock", False), ("fixed", True)):
        worker = threading.Thread(target=read, args=(label, apply))
        worker.start()
        worker.join()
    return Outcome(seen["fixed"] == wanted, seen["stock"] != wanted,
                   f"a worker thread sees {seen['stock']} without and {seen['fixed']} with apply_dynamo_settings()")


def bucketed_shapes_compile_once() -> Outcome:
    lengths, buckets = [5, 9, 13, 17, 33, 40], [16, 64]

    def graphs_for(sizes) -> int:
        fn = torch.compile(lambda t: t.sum(), backend="eager", dynamic=False)
        monitor = CompileMonitor()
        for size in sizes:
            fn(torch.ones(size))
        return monitor.since_warm()["recompiles"]

    stock = graphs_for(lengths)
    fixed = graphs_for([bucket_for(length, buckets) for length in lengths])
    return Outcome(fixed <= len(buckets), stock > len(buckets),
                   f"{len(lengths)} lengths compiled {stock} graphs raw, {fixed} padded to buckets {buckets}")


def private_compile_cache() -> Outcome:
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    stock = default_cache_dir()
    stock_shared = Path(stock).is_relative_to(tempfile.gettempdir())
    in_use = Path(cache_dir())  # torch itself sets TORCHINDUCTOR_CACHE_DIR to its default when it is unset
    if in_use == Path(stock):
        return Outcome(False, stock_shared, f"torch uses its default cache dir {stock}: run the self-test through "
                                            f"`envkit warm-cache`, which gives it a private one")
    private = in_use.parent  # the env key's dir envkit made
    info = private.stat()
    mode = stat.S_IMODE(info.st_mode)
    ok = info.st_uid == os.getuid() and mode & 0o077 == 0 and bool(os.environ.get("TRITON_CACHE_DIR"))
    return Outcome(ok, stock_shared, f"default {stock}; in use {in_use} in {private} (mode {mode:o})")


def warm_lock_is_held() -> Outcome:
    reproduced = torch.__version__ < "2.11"  # TorchVersion compares as a version; the race was fixed in 2.11.0
    lock_path = os.environ.get(WARM_LOCK_ENV)
    if not lock_path:
        return Outcome(False, reproduced, f"{WARM_LOCK_ENV} is not set: run the self-test through `envkit warm-cache`")
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Outcome(True, reproduced, f"a second warmer would wait: {lock_path} is held")
        fcntl.flock(handle, fcntl.LOCK_UN)
    return Outcome(False, reproduced, f"{lock_path} is not held during warm-up: warmers would not serialise")


def cpu_attention_has_backward() -> Outcome:
    from torch.nn.attention.flex_attention import flex_attention


    q, k, v = (torch.randn(1, 1, 16, 8, requires_grad=True) for _ in range(3))
    try:
        flex_attention(q, k, v).sum().backward()
        stock = "ok"
    except NotImplementedError as exc:
        stock = f"NotImplementedError: {str(exc).splitlines()[0]}"
    backend, attention = pick_attention(tiny(), torch.device("cpu"))
    anchors = torch.tensor([[2, 5]])
    prepared = attention.prepare(anchors, 8, 4)
    q, k, v = (torch.randn(1, 1, 8, 8, requires_grad=True), torch.randn(1, 1, 16, 8, requires_grad=True),
               torch.randn(1, 1, 16, 8, requires_grad=True))
    attention.attend(q, k, v, prepared).sum().backward()
    ok = backend == "sdpa" and attention is BACKENDS["sdpa"] and q.grad is not None and bool(q.grad.isfinite().all())
    return Outcome(ok, stock != "ok", f"flex on CPU: {stock}; the trainer picks {backend} on CPU, backward ran")


def eager_fallback_is_counted() -> Outcome:
    saved = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 1
    try:
        monitor = CompileMonitor()
        fn = torch.compile(lambda t: t + 1, backend="eager", dynamic=False)
        results = [fn(torch.ones(size)) for size in (3, 4, 5)]  # the 2nd shape exceeds the limit: eager, silently
    finally:
        torch._dynamo.config.recompile_limit = saved
    silent = all(bool((r == 2).all()) for r in results)
    counted = monitor.since_warm()["eager_fallbacks"]
    return Outcome(counted > 0, silent, f"past the recompile limit the function ran eager without an error; "
                                        f"the monitor counted {counted} eager fallback(s)")


SELFTESTS = {
    "compiled_call_under_foreign_trace": compiled_call_under_foreign_trace,
    "module_call_under_foreign_trace": module_call_under_foreign_trace,
    "dynamo_settings_in_worker_thread": dynamo_settings_in_worker_thread,
    "bucketed_shapes_compile_once": bucketed_shapes_compile_once,
    "private_compile_cache": private_compile_cache,
    "warm_lock_is_held": warm_lock_is_held,
    "cpu_attention_has_backward": cpu_attention_has_backward,
    "eager_fallback_is_counted": eager_fallback_is_counted,
}


def run_all() -> dict[str, dict]:
    """Every hazard's self-test, in table order; an error inside a test fails that test, not the others."""
    results = {}
    for hazard, mitigation in MITIGATIONS.items():
        try:
            outcome = SELFTESTS[mitigation.selftest]()
        except Exception as exc:
            outcome = Outcome(False, False, f"the self-test raised {type(exc).__name__}: {exc}")
        results[hazard] = {"selftest": mitigation.selftest, **asdict(outcome)}
    return results
