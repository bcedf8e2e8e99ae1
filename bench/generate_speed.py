"""Generating training data from the target: the KV cache growing in place against transformers' DynamicCache.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/generate_speed.py [--sequences 512] [--repeats 3]

The tiny preset's random target and data config (sampled continuations), on CUDA when there is one. Each run is a
fresh process, as a training run generates its data once (a second generation in one process reuses the memory
the first one's caches freed, and DynamicCache's copies then cost less). Prints one JSON line: the median seconds
of each cache, their ratio, and whether the two generated the same tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

CACHES = ("dynamic_cache", "growing_cache")


def generate_once(cache: str, sequences: int) -> dict:
    import torch

    from trainer.config.schema import tiny
    from trainer.data import datasets, decode_cache
    from trainer.model.target import build_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tiny()
    target = build_target(cfg.target, device=device).eval()
    if cache == "dynamic_cache":
        decode_cache.growing_cache = decode_cache.DynamicCache  # generate() asks the module for its cache
    started = time.perf_counter()
    data = datasets.generate(target, cfg.data, sequences, 1, cfg.seed + 1, cfg.drafter.block_size, device)
    seconds = time.perf_counter() - started
    digest = hashlib.sha256(json.dumps([s.input_ids for s in data.sequences]).encode()).hexdigest()
    return {"seconds": seconds, "tokens": digest, "device": device, "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=CACHES, help=argparse.SUPPRESS)  # a child: one generation, one JSON line
    args = parser.parse_args()
    if args.one:
        print(json.dumps(generate_once(args.one, args.sequences)))
        return
    runs = {cache: [] for cache in CACHES}
    for _ in range(args.repeats):
        for cache in CACHES:  # alternating, so a slower minute of the machine falls on both
            proc = subprocess.run([sys.executable, __file__, "--one", cache, "--sequences", str(args.sequences)],
                                  capture_output=True, text=True, check=True, env=os.environ)
            runs[cache].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    seconds = {cache: statistics.median(run["seconds"] for run in runs[cache]) for cache in CACHES}
    print(json.dumps({"device": runs["growing_cache"][0]["device"], "torch": runs["growing_cache"][0]["torch"],
                      "sequences": args.sequences, **{f"{cache}_s": round(seconds[cache], 2) for cache in CACHES},
                      "ratio": round(seconds["dynamic_cache"] / seconds["growing_cache"], 2),
                      "same_tokens": len({run["tokens"] for cache in CACHES for run in runs[cache]}) == 1}))


if __name__ == "__main__":
    main()
