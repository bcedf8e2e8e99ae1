"""One line per phase on stderr, with timings; stdout stays free for results and --json."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Phases:
    def __init__(self, total: int, *, quiet: bool = False):
        self.total = total
        self.index = 0
        self.quiet = quiet
        self.started = time.perf_counter()
        self.timings: dict[str, float] = {}

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)

    @contextmanager
    def phase(self, name: str, detail: str = ""):
        self.index += 1
        begin = time.perf_counter()
        yield
        self.timings[name] = round(time.perf_counter() - begin, 3)
        suffix = f": {detail}" if detail else ""
        self.say(f"[{self.index}/{self.total}] {name}{suffix} ({self.timings[name]:.2f}s)")

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started
