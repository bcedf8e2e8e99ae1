"""Faults put in on purpose, kept out of the layouts' own parameters: `--fail-at` (a worker that raises,
hangs or falls behind) and a bench's `--unwarmed` (a bucket nobody warmed). A normal run has none."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from trainer.common.errors import TrainerInputError


class InjectedFailure(RuntimeError):
    """Raised on purpose by --fail-at, to test that a failing worker ends the whole run."""


@dataclass(frozen=True)
class Faults:
    fail_at: tuple[str, int, int, str] | None = None  # (target|drafter, worker index, step, raise|stall|slow)
    unwarmed: frozenset[int] = frozenset()  # buckets the warm-up leaves out

    @classmethod
    def parse(cls, fail_at: str | None = None, unwarmed: tuple[int, ...] = ()) -> "Faults":
        """`fail_at` as KIND:INDEX:STEP[:stall|slow]."""
        spec = None
        if fail_at:
            kind, index, step, *how = (fail_at.split(":") + ["", "", ""])[:4]
            how = how[0] or "raise"
            if kind not in ("target", "drafter") or not index.isdigit() or not step.isdigit() or \
                    how not in ("raise", "stall", "slow") or fail_at.count(":") > 3:
                raise TrainerInputError(f"--fail-at takes target|drafter:INDEX:STEP[:stall|slow], not {fail_at!r}")
            spec = (kind, int(index), int(step), how)
        return cls(spec, frozenset(unwarmed))

    def inject(self, kind: str, index: int, step: int, stop: threading.Event) -> bool:
        """At the worker and step named by --fail-at: raise, hang until the run stops (then True: the worker
        leaves), or fall behind."""
        if not self.fail_at or self.fail_at[:3] != (kind, index, step):
            return False
        if self.fail_at[3] == "stall":  # a worker that hangs: the others must not wait forever
            stop.wait()
            return True
        if self.fail_at[3] == "slow":  # a worker far behind the others: memory must stay bounded
            time.sleep(2.0)
            return False
        raise InjectedFailure(f"--fail-at {kind}:{index}:{step}")


NONE = Faults()
