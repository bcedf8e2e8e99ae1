#!/usr/bin/env bash
# Device call 4: two drafter threads meet a bucket nobody warmed, mitigations off then on; logs kept.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
common="--preset qwen3_8b --variants flex --steps 5 --skip 1 --num-anchors 256 --out $OUT/nomit.jsonl"
timeout 250 python3 bench/train_throughput.py $common --timeout 240 --buckets 1024,2048 --unwarmed 1024 --targets cuda:0 --drafters cuda:0,cuda:0 --no-mitigations | grep -v '^ '
