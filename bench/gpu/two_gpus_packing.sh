#!/usr/bin/env bash
# Device call 7 (issue 15, nvidia-h200-x2): qwen3_8b on the chat length mix with packing, two layouts side
# by side: split (target on one GPU, drafter on the other) and colocated data parallel (each GPU a target
# worker and a drafter replica, gradients averaged every step).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; head -4 "$OUT/topo.txt"
common="--preset qwen3_8b --variants flex --steps 10 --skip 2 --data-source chat_lengths --num-sequences 384 --packing --timeout 280"
timeout 285 python3 bench/train_throughput.py $common --targets cuda:0,cuda:1 --drafters cuda:0,cuda:1 \
  --out "$OUT/two_gpus.jsonl" 2> "$OUT/colocated.err" | grep -v '^ '
timeout 285 python3 bench/train_throughput.py $common --targets cuda:0 --drafters cuda:1 \
  --out "$OUT/two_gpus.jsonl" 2> "$OUT/split.err" | grep -v '^ '
tail -3 "$OUT/colocated.err" "$OUT/split.err" | cut -c1-300
