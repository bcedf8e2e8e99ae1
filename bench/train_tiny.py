"""The tiny preset end to end on this machine's CPU: wall time, loss, and tau against both baselines by
both methods (the greedy decoding walk serving sees, and teacher-forced positions), packed and not.

    python bench/train_tiny.py [--steps N] [--no-packing]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--packing", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="envkit-bench-tiny-"))
    cmd = [sys.executable, "-m", "trainer", "train", "--preset", "tiny", "--out", str(out)]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    cmd.append("--packing" if args.packing else "--no-packing")
    started = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT, check=True)
    wall = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    import torch

    result = {"wall_s": round(wall, 1), "torch": torch.__version__, "threads": torch.get_num_threads(), **summary}
    print(json.dumps(result))
    print(f"tiny (packing {'on' if args.packing else 'off'}): {summary['steps']} steps in {wall:.0f} s; loss "
          f"{summary['loss_start']:.2f} -> {summary['loss_end']:.2f} (x{summary['loss_end'] / summary['loss_start']:.2f})\n"
          f"  walk tau {summary['walk_tau']:.2f} (repeat-anchor {summary['walk_repeat_tau']:.2f}, copy "
          f"{summary['walk_copy_tau']:.2f}; {summary['walk_prompts']} prompts, {summary['walk_near_ties']} near-ties)\n"
          f"  teacher-forced tau {summary['tau_start']:.2f} -> {summary['tau_end']:.2f} (repeat-anchor "
          f"{summary['baseline_repeat_tau']:.2f}, copy {summary['baseline_copy_tau']:.2f})")


if __name__ == "__main__":
    main()
