"""`python -m trainer selftest`: each torch hazard reproduced with its mitigation off, then the mitigation proven."""

from __future__ import annotations

import json
import time

NAME = "selftest"


def add_parser(sub) -> None:
    sub.add_parser(NAME, help="reproduce each torch hazard with its mitigation off, then prove the "
                              "mitigation removes it (JSON; exit 1 when one fails)")


def run(args) -> int:
    """Prove each hazard mitigation in this interpreter (what `envkit warm-cache` records for doctor)."""
    import torch

    from trainer.safety.selftest import run_all

    started = time.perf_counter()
    results = run_all()
    print(json.dumps({"torch": str(torch.__version__), "results": results,
                      "seconds": round(time.perf_counter() - started, 2)}))
    return 0 if all(result["passed"] for result in results.values()) else 1
