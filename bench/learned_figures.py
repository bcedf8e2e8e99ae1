"""The spread of every figure a model learns in the test suite, over fresh runs: the margins its assertions carry are
chosen from it (tests/README.md), so that CI never rejects good work at random.

    .venv/bin/python bench/learned_figures.py --seeds 0 1 2 3 4 [--runs 1] [--tests NODEID ...] [--out figures.jsonl]

Each run is pytest on the learned-figure tests in a fresh base temp: a fresh cpu venv, fresh targets (code_tiny
trained anew), fresh trained runs and a fresh serve venv, as CI builds them. On one machine a seed's runs are
bit-identical; another machine's rounding takes training elsewhere, as another seed does, so each seed
(ENVKIT_TEST_SEED: the targets' and the drafters' seeds, tests/helpers.py) stands for another machine. The tests
append what they measured to $ENVKIT_TEST_FIGURES (tests/helpers.py: record_figure); this prints, per figure,
each run's values and the min / median / max of the ratio each assertion checks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/envkit/test_serve.py::test_the_recipe_through_two_venvs",
    "tests/trainer/test_code_target.py::test_code_preset_builds_a_loadable_target_and_its_drafter_beats_the_rules",
    "tests/trainer/test_code_target.py::test_a_tap_error_costs_acceptance_on_the_trained_target",
    "tests/trainer/test_export.py::test_tiny_run_exports_a_drafter_the_reference_serves_losslessly",
    "tests/trainer/test_packing.py::test_packing_removes_padding_and_learns_as_well",
]

# figure -> (what the assertion compares, the ratio it reads from a row)
RATIOS = {
    "recipe: regenerated drafter on held-out openings": ("walk / max(copy, repeat)",
                                                          lambda r: r["walk"] / max(r["copy"], r["repeat"])),
    "code: walk vs the better rule": ("walk / max(copy, repeat)", lambda r: r["walk"] / max(r["copy"], r["repeat"])),
    "code: tap ablation": ("zeroed / right; tap0 / right", lambda r: (r["zeroed"] / r["right"], r["tap0"] / r["right"])),
    "tiny demo: walk vs copy": ("walk / copy", lambda r: r["walk"] / r["copy"]),
    "packing: tau packed vs unpacked": ("packed / unpacked; packed / copy",
                                        lambda r: (r["packed"] / r["unpacked"], r["packed"] / r["copy"])),
}


def run_once(index: int, seed: int, tests: list[str], figures: Path) -> float:
    base = Path(tempfile.mkdtemp(prefix=f"envkit-figures-{index}-"))
    env = dict(os.environ, ENVKIT_TEST_FIGURES=str(figures), ENVKIT_TEST_SEED=str(seed))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "--basetemp", str(base), *tests], cwd=PROJECT, env=env)
    seconds = time.monotonic() - started
    print(f"run {index} (seed {seed}): pytest exit {proc.returncode} in {seconds:.0f}s", flush=True)
    subprocess.run(["rm", "-rf", str(base)])
    return seconds


def summarize(figures: Path) -> None:
    rows = [json.loads(line) for line in figures.read_text().splitlines() if line.strip()]
    for name, (label, ratio) in RATIOS.items():
        values = [ratio(row) for row in rows if row["figure"] == name]
        seeds = [row.get("seed", 0) for row in rows if row["figure"] == name]
        if not values:
            continue
        print(f"\n{name} ({label}), {len(values)} runs, seeds {seeds}")
        columns = list(zip(*values)) if isinstance(values[0], tuple) else [values]
        for column in columns:
            shown = ", ".join(f"{v:.2f}" for v in column)
            print(f"  {shown}  (min {min(column):.2f}, median {statistics.median(column):.2f}, max {max(column):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="one machine's stand-ins")
    parser.add_argument("--runs", type=int, default=1, help="runs of each seed (bit-identical on one machine)")
    parser.add_argument("--tests", nargs="*", default=TESTS)
    parser.add_argument("--out", type=Path, default=Path("learned-figures.jsonl"))
    parser.add_argument("--summarize", action="store_true", help="only print the summary of --out")
    args = parser.parse_args()
    if not args.summarize:
        for index, seed in enumerate(seed for seed in args.seeds for _ in range(args.runs)):
            run_once(index, seed, args.tests, args.out.absolute())
    summarize(args.out)


if __name__ == "__main__":
    main()
