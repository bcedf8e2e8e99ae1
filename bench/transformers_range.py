"""The trainer across transformers versions: the same tiny and code runs, walk and export under each interpreter
given (each a venv with the same torch and another transformers), figures side by side.

    python3 bench/transformers_range.py .venv-5.6/bin/python .venv-5.15/bin/python .venv-5.25/bin/python

The tiny run is the demo's (1,000 steps, compiled); the code run is shorter (--code-steps, eager) but the same
under every version. Every run shares one ENVKIT_HOME, so code_tiny is built once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
KEYS = ("walk_tau", "walk_repeat_tau", "walk_copy_tau", "walk_degenerate", "tau_end", "loss_end")


def run(python: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pythons", nargs="+")
    parser.add_argument("--code-steps", type=int, default=300)
    parser.add_argument("--work", default="/tmp/envkit-transformers-range")
    args = parser.parse_args()
    work = Path(args.work)
    env = dict(os.environ, PYTHONPATH=str(PROJECT), ENVKIT_HOME=str(work / "home"), PYTHONUNBUFFERED="1")
    rows = []
    for python in args.pythons:
        version = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        for preset, extra in (("tiny", []), ("code", ["--steps", str(args.code_steps), "--no-compile"])):
            out = work / f"{preset}-{version}"
            started = time.perf_counter()
            trained = run(python, "train", "--preset", preset, "--out", str(out), *extra, env=env)
            seconds = time.perf_counter() - started
            if trained.returncode != 0:
                rows.append({"transformers": version, "preset": preset, "error": trained.stderr[-500:]})
                continue
            summary = json.loads((out / "summary.json").read_text())
            exported = run(python, "export", "--ckpt", str(out / "checkpoint.pt"), "--out", str(out / "export"),
                           "--force", env=env)
            warnings = [line for line in (trained.stdout + trained.stderr).splitlines() if "Warning" in line]
            rows.append({"transformers": version, "preset": preset, **{k: summary.get(k) for k in KEYS},
                         "export": exported.returncode == 0, "warning_lines": len(warnings), "seconds": round(seconds)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'transformers':<13}{'preset':<7}" + "".join(f"{k:>16}" for k in KEYS) + f"{'export':>8}{'warnings':>9}")
    for row in rows:
        if "error" in row:
            print(f"{row['transformers']:<13}{row['preset']:<7} FAILED: {row['error'][-200:]}")
            continue
        print(f"{row['transformers']:<13}{row['preset']:<7}" + "".join(f"{str(row[k]):>16}" for k in KEYS)
              + f"{str(row['export']):>8}{row['warning_lines']:>9}")


if __name__ == "__main__":
    main()
