#!/usr/bin/env bash
# Device call 11 (issue 15, nvidia-h200-x2): qwen3_8b on the chat length mix, packed, the one loop: one GPU
# alone, then two GPUs as two torchrun processes (a target worker and a drafter replica in each, one NCCL
# all-reduce of the gradients per step), then two GPUs in one process (colocated threads).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
common="--preset qwen3_8b --variants flex --steps 12 --skip 2 --data-source chat_lengths --num-sequences 384 --packing --timeout 185"
CUDA_VISIBLE_DEVICES=0 timeout 190 python3 bench/train_throughput.py $common --out "$OUT/runs.jsonl" 2> "$OUT/one.err" | grep '^{'
timeout 190 python3 bench/train_throughput.py $common --processes 2 --out "$OUT/runs.jsonl" 2> "$OUT/processes.err" | grep '^{'
timeout 190 python3 bench/train_throughput.py $common --targets cuda:0,cuda:1 --drafters cuda:0,cuda:1 \
  --out "$OUT/runs.jsonl" 2> "$OUT/threads.err" | grep '^{'
for f in one processes threads; do echo "== $f"; grep -v '^ ' "$OUT/$f.err" | tail -3 | cut -c1-300; done
