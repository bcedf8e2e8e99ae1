"""Time to the first finished training step in a fresh process: empty cache vs warm vs imported export.

    python bench/compile_cache.py [--venv PATH] [--preset tiny] [--repeat 3]

Also the fingerprinting rate on a synthetic cache of the qwen3_8b preset's size (32 MB, 210 files).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envkit import cache, paths  # noqa: E402
from envkit.venv import Venv  # noqa: E402


def first_step_seconds(venv: Venv, preset: str, cache_dir: Path) -> float:
    """Start a training run and return when its first step row lands in metrics.jsonl."""
    out = Path(tempfile.mkdtemp(prefix="envkit-bench-run-"))
    env = cache.trainer_env(venv, cache_dir)
    started = time.perf_counter()
    proc = subprocess.Popen([str(venv.python), "-m", "trainer", "train", "--preset", preset, "--out", str(out),
                             "--steps", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and '"loss"' in metrics.read_text():
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    proc.kill()
    proc.wait()
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def fingerprint_rate() -> float:
    tmp = Path(tempfile.mkdtemp(prefix="envkit-bench-fp-"))
    for i in range(210):
        target = tmp / "inductor" / f"{i % 30:02d}" / f"entry{i}.bin"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(os.urandom(32_000_000 // 210))
    started = time.perf_counter()
    files = cache.scan(tmp)
    cache.files_digest(files)
    seconds = time.perf_counter() - started
    shutil.rmtree(tmp)
    return 32 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", default=str(paths.default_venv("cpu")))
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    venv = Venv(Path(args.venv)).require()
    work = Path(tempfile.mkdtemp(prefix="envkit-bench-cache-"))
    os.environ["ENVKIT_CACHE_DIR"] = str(work / "warm")
    warmed = cache.warm(venv, args.preset, quiet=True)
    bundle = work / "export.envkit-cache"
    cache.export(venv, bundle, args.preset, quiet=True)
    times: dict[str, list[float]] = {"cold": [], "warm": [], "imported": []}
    for index in range(args.repeat):
        cold = work / f"cold-{index}"
        times["cold"].append(first_step_seconds(venv, args.preset, cold))
        times["warm"].append(first_step_seconds(venv, args.preset, Path(warmed.cache_dir)))
        os.environ["ENVKIT_CACHE_DIR"] = str(work / f"imported-{index}")
        imported = cache.import_(venv, bundle, args.preset)
        times["imported"].append(first_step_seconds(venv, args.preset, Path(imported["cache_dir"])))
        os.environ["ENVKIT_CACHE_DIR"] = str(work / "warm")
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    result = {"preset": args.preset, "repeat": args.repeat, "first_step_s": medians,
              "warm_over_cold": round(medians["warm"] / medians["cold"], 3),
              "imported_over_cold": round(medians["imported"] / medians["cold"], 3),
              "export_bytes": bundle.stat().st_size, "cache_files": warmed.files, "cache_bytes": warmed.bytes,
              "fingerprint_mb_per_s": round(fingerprint_rate(), 1), "all": times}
    print(json.dumps(result))
    print(f"first finished step ({args.preset}, median of {args.repeat}): cold {medians['cold']:.1f} s, warm "
          f"{medians['warm']:.1f} s ({result['warm_over_cold']:.0%}), imported {medians['imported']:.1f} s "
          f"({result['imported_over_cold']:.0%}); fingerprint {result['fingerprint_mb_per_s']} MB/s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
