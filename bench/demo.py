"""`envkit train --preset tiny` on a fresh machine state (new ENVKIT_HOME, cache and runs dirs; uv's
package cache warm): the whole main job, with each phase's time.

    python bench/demo.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="envkit-bench-demo-"))
    env = dict(os.environ, ENVKIT_HOME=str(work / "home"), ENVKIT_CACHE_DIR=str(work / "cache"),
               ENVKIT_RUNS_DIR=str(work / "runs"))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "envkit", "train", "--preset", "tiny", "--name", "demo"],
                          capture_output=True, text=True, env=env)
    total = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"demo failed ({proc.returncode}):\n{proc.stderr}")
    record = json.loads((work / "runs" / "demo" / "run.json").read_text())
    log = (work / "runs" / "demo" / "train.log").read_text()
    phases = dict(record["preflight_s"])
    phases["train (trainer process)"] = round(total - sum(phases.values()) - 0, 1)
    generated = re.search(r"from the target in ([\d.]+)s", log)
    summary = record["summary"]
    result = {"total_s": round(total, 1), "phases_s": phases,
              "data_generation_s": float(generated[1]) if generated else None,
              "loss": [round(summary["loss_start"], 3), summary["loss_end"]],
              "tau": [summary["tau_start"], summary["tau_end"]],
              "baselines": [summary["baseline_repeat_tau"], summary["baseline_copy_tau"]]}
    print(json.dumps(result))
    for name, seconds in phases.items():
        print(f"{name:28} {seconds:7.1f} s")
    print(f"{'total':28} {total:7.1f} s   loss {result['loss'][0]} -> {result['loss'][1]}, tau "
          f"{result['tau'][0]} -> {result['tau'][1]} (baselines {result['baselines']})")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
