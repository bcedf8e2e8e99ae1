#!/usr/bin/env bash
# Device call 5 (nvidia-h200-x2): target on one GPU, drafter on the other, compiled flex.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 230 python3 bench/train_throughput.py --preset qwen3_8b --variants flex --buckets 3072 --steps 6 --skip 1 \
  --targets cuda:0 --drafters cuda:1 --timeout 220 --out "$OUT/two_gpus.jsonl" | grep -v '^ '
