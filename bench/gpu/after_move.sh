#!/usr/bin/env bash
# Issue 32 (nvidia-h200): behaviour unchanged after trainer/ moved into sub-packages: the qwen3_8b default (packed,
# chat length mix, compiled flex, compiled target, fused AdamW) against 12,423 useful tok/s before the move.
source "$(dirname "$0")/env.sh"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
common="--preset qwen3_8b --variants flex --steps 8 --skip 2 --data-source chat_lengths --num-sequences 384 \
  --packing --fused --compile-target"
timeout 225 python3 bench/train_throughput.py $common --timeout 215 --out "$OUT/after_move.jsonl" \
  2> "$OUT/after_move.err" | tail -16
grep -E "compile_target|run: |Error" "$OUT/after_move.err" | tail -n 4 | cut -c1-300
