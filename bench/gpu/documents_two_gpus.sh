#!/usr/bin/env bash
# Device call 10 (issue 15, nvidia-h200-x2), the one loop (issue 14) with document tiles: qwen3_8b on the chat
# length mix. GPU 0: the packed step's parts, then one GPU packed; GPU 1 at the same time: one GPU with
# --no-packing. Then both GPUs colocated (a target worker and a drafter replica on each), packed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.device_count())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
common="--preset qwen3_8b --variants flex --steps 10 --skip 2 --data-source chat_lengths --num-sequences 384 --timeout 250"
( export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 bench/step_parts.py --preset qwen3_8b --repeat 10 --out "$OUT/parts.jsonl" 2> "$OUT/parts.err"
  timeout 260 python3 bench/train_throughput.py $common --packing --out "$OUT/one_gpu.jsonl" 2> "$OUT/packed.err" ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 260 python3 bench/train_throughput.py $common --no-packing --out "$OUT/one_gpu_nopack.jsonl" 2> "$OUT/nopack.err" ) &
wait
timeout 280 python3 bench/train_throughput.py $common --packing --targets cuda:0,cuda:1 --drafters cuda:0,cuda:1 \
  --out "$OUT/colocated.jsonl" 2> "$OUT/colocated.err" | grep -v '^ '
cat "$OUT/parts.jsonl" "$OUT/one_gpu.jsonl" "$OUT/one_gpu_nopack.jsonl"
tail -3 "$OUT/parts.err" "$OUT/packed.err" "$OUT/nopack.err" "$OUT/colocated.err" | cut -c1-300
