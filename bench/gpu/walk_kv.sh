#!/usr/bin/env bash
# Issue 30 (nvidia-h200): the walk and the data generation on the device with the KV cache, tiny preset:
# the end-of-run walk completes lossless on CUDA (flex target, bf16) and how long it takes.
source "$(dirname "$0")/env.sh"
t=$(date +%s)
timeout 150 python3 -m trainer train --preset tiny --steps 40 --out /tmp/run > "$OUT/train.log" 2>&1
echo "train rc $? in $(( $(date +%s) - t )) s"
grep -E "walk|done:|Error|Traceback" "$OUT/train.log" | tail -6 | cut -c1-300
