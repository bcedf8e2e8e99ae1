#!/usr/bin/env bash
# Device call 3: drafter threads on one GPU (1 vs 2 replicas), mitigations on/off, and a bucket
# left out of warm-up so that threads compile mid-run (the original job's dataset growth).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=${DEVICES:-cuda:0}
common="--preset qwen3_8b --variants flex --steps 6 --skip 1 --num-anchors 256 --timeout 170 --out $OUT/threads.jsonl"
timeout 180 python3 bench/train_throughput.py $common --buckets 2048 --targets cuda:0 --drafters $D
timeout 180 python3 bench/train_throughput.py $common --buckets 2048 --targets cuda:0 --drafters $D,$D
timeout 180 python3 bench/train_throughput.py $common --buckets 1024,2048 --unwarmed 1024 --targets cuda:0 --drafters $D,$D --no-mitigations
timeout 180 python3 bench/train_throughput.py $common --buckets 1024,2048 --unwarmed 1024 --targets cuda:0 --drafters $D,$D
