"""The tiny preset end to end on this machine's CPU: wall time, loss and tau against both baselines.

    python bench/train_tiny.py [--steps N]
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
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="envkit-bench-tiny-"))
    cmd = [sys.executable, "-m", "trainer", "train", "--preset", "tiny", "--out", str(out)]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT, check=True)
    wall = time.perf_counter() - started
    summary = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith('{"summary"')))
    import torch

    result = {"wall_s": round(wall, 1), "torch": torch.__version__, "threads": torch.get_num_threads(), **summary}
    print(json.dumps(result))
    print(f"tiny: {summary['steps']} steps in {wall:.0f} s; loss {summary['loss_start']:.2f} -> {summary['loss_end']:.2f} "
          f"(x{summary['loss_end'] / summary['loss_start']:.2f}); tau {summary['tau_start']:.2f} -> {summary['tau_end']:.2f}; "
          f"repeat-anchor {summary['baseline_repeat_tau']:.2f}, copy {summary['baseline_copy_tau']:.2f}")


if __name__ == "__main__":
    main()
