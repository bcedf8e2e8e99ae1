#!/usr/bin/env bash
# Issue 30 (nvidia-h200): the walk and the data generation on the device with the KV cache, tiny preset:
# the end-of-run walk completes lossless on CUDA (flex target, bf16) and how long it takes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton ENVKIT_HOME=/tmp/home
t=$(date +%s)
timeout 150 python3 -m trainer train --preset tiny --steps 40 --out /tmp/run > "$OUT/train.log" 2>&1
echo "train rc $? in $(( $(date +%s) - t )) s"
grep -E "walk|done:|Error|Traceback" "$OUT/train.log" | tail -6 | cut -c1-300
