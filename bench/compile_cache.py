"""Time to the first finished training step in a fresh process: empty cache vs warm vs imported export.

    python bench/compile_cache.py [--python PATH] [--preset tiny] [--repeat 3] [--bucket N]

The warm cache is made by the trainer's warm-up (what `envkit warm-cache` runs), which also exports
torch's Mega-Cache blob; "imported" loads that blob into an empty dir first (`envkit cache
import`). Also the fingerprinting rate on a synthetic cache of the qwen3_8b preset's size
(32 MB, 210 files).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from envkit.cache.fingerprint import files_digest, scan  # noqa: E402


def cache_env(cache_dir: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(PROJECT), TORCHINDUCTOR_CACHE_DIR=str(cache_dir / "inductor"),
                TRITON_CACHE_DIR=str(cache_dir / "triton"), PYTHONUNBUFFERED="1")


def trainer_args(args) -> list[str]:
    extra = ["--preset", args.preset]
    if args.bucket:
        config = json.loads(subprocess.run([args.python, "-m", "trainer", "describe", "--preset", args.preset],
                                           capture_output=True, text=True, check=True, cwd=PROJECT,
                                           env=cache_env(Path(tempfile.gettempdir()))).stdout)["full_config"]
        config["data"]["buckets"] = [args.bucket]
        path = Path(tempfile.mkdtemp(prefix="envkit-bench-cfg-")) / "config.json"
        path.write_text(json.dumps(config))
        extra = ["--config", str(path)]
    return extra


def first_step_seconds(args, extra: list[str], cache_dir: Path) -> float:
    """Start a training run and return when its first step row lands in metrics.jsonl."""
    out = Path(tempfile.mkdtemp(prefix="envkit-bench-run-"))
    started = time.perf_counter()
    proc = subprocess.Popen([args.python, "-m", "trainer", "train", *extra, "--out", str(out), "--steps", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cache_env(cache_dir), cwd=PROJECT)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and '"loss"' in metrics.read_text():
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    if proc.poll() is not None and proc.returncode != 0:
        sys.exit(f"trainer failed: {proc.stderr.read().decode()[-2000:]}")
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
    files_digest(scan(tmp))
    seconds = time.perf_counter() - started
    shutil.rmtree(tmp)
    return 32 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch (a managed venv's)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--bucket", type=int, help="only this length bucket")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    extra = trainer_args(args)
    work = Path(tempfile.mkdtemp(prefix="envkit-bench-cache-"))
    warm_dir, blob = work / "warm", work / "mega-cache.bin"
    started = time.perf_counter()
    subprocess.run([args.python, "-m", "trainer", "warmup", *extra, "--out", str(work / "w"), "--export", str(blob)],
                   check=True, capture_output=True, env=cache_env(warm_dir), cwd=PROJECT)
    warmup_s = time.perf_counter() - started
    times: dict[str, list[float]] = {"cold": [], "warm": [], "imported": []}
    load_s = []
    for index in range(args.repeat):
        times["cold"].append(first_step_seconds(args, extra, work / f"cold-{index}"))
        times["warm"].append(first_step_seconds(args, extra, warm_dir))
        imported = work / f"imported-{index}"
        started = time.perf_counter()
        digest = hashlib.sha256(blob.read_bytes()).hexdigest()  # a blob this script just made itself
        subprocess.run([args.python, "-m", "trainer", "load-cache", str(blob), "--sha256", digest], check=True,
                       capture_output=True, env=cache_env(imported), cwd=PROJECT)
        load_s.append(time.perf_counter() - started)
        times["imported"].append(first_step_seconds(args, extra, imported))
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    files = scan(warm_dir)
    result = {"preset": args.preset, "bucket": args.bucket, "repeat": args.repeat, "first_step_s": medians,
              "warm_over_cold": round(medians["warm"] / medians["cold"], 3),
              "imported_over_cold": round(medians["imported"] / medians["cold"], 3),
              "load_blob_s": round(statistics.median(load_s), 2), "initial_warmup_s": round(warmup_s, 1),
              "export_bytes": blob.stat().st_size, "cache_files": len(files),
              "cache_bytes": sum(size for size, _ in files.values()),
              "fingerprint_mb_per_s": round(fingerprint_rate(), 1), "all": times}
    print(json.dumps(result))
    print(f"first finished step ({args.preset}, median of {args.repeat}): cold {medians['cold']:.1f} s, warm "
          f"{medians['warm']:.1f} s ({result['warm_over_cold']:.0%}), imported {medians['imported']:.1f} s "
          f"({result['imported_over_cold']:.0%}, after {result['load_blob_s']:.1f} s of loading the blob); "
          f"fingerprint {result['fingerprint_mb_per_s']} MB/s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
