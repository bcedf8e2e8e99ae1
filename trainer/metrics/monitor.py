"""Compile health: recompiles and eager fallbacks after warm-up, read from dynamo's own counters.

A compiled function that silently runs eager (HAZARDS.md H1 with the error disabled, H3's recompile
limit) looks like "throughput fell 4x and memory swings"; these counters make it loud.
"""

from __future__ import annotations

from contextlib import contextmanager


def _counters():
    from torch._dynamo.utils import counters

    return counters


def snapshot() -> dict[str, int]:
    counters = _counters()
    frames = counters["frames"]
    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        # A frame dynamo took up but did not compile runs eager (the recompile limit, an unsupported construct).
        "eager_frames": int(frames.get("total", 0)) - int(frames.get("ok", 0)),
    }


def inductor_cache_counters() -> dict[str, int]:
    counters = _counters()["inductor"]
    return {name: int(counters.get(name, 0)) for name in
            ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")} | {
        name: int(_counters()["aot_autograd"].get(name, 0)) for name in ("autograd_cache_hit", "autograd_cache_miss")}


class CompileMonitor:
    """Counts what dynamo compiled or gave up on since `mark_warm()` (the end of warm-up)."""

    def __init__(self):
        self.baseline = snapshot()

    def mark_warm(self) -> None:
        self.baseline = snapshot()

    @contextmanager
    def excluding(self):
        """Leave out what a block compiles on purpose (evaluation: eager flex_attention runs through
        torch.compile with an eager backend, one dynamo graph per shape)."""
        before = snapshot()
        try:
            yield
        finally:
            after = snapshot()
            for key in self.baseline:
                self.baseline[key] += after[key] - before[key]

    def since_warm(self) -> dict[str, int]:
        now = snapshot()
        return {"recompiles": now["graphs"] - self.baseline["graphs"],
                "eager_fallbacks": now["eager_frames"] - self.baseline["eager_frames"],
                "graph_breaks": now["graph_breaks"] - self.baseline["graph_breaks"]}
