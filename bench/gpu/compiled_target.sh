#!/usr/bin/env bash
# Issue 31 (nvidia-h200): the frozen target compiled by region, side by side in one call with today's default
# (fused AdamW, eager target) and with --fp8 target on top. qwen3_8b, chat length mix, packed, compiled flex.
source "$(dirname "$0")/env.sh"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
T=${VARIANT_TIMEOUT:-185}
common="--preset qwen3_8b --variants flex --steps 8 --skip 2 --profile-steps 3 --data-source chat_lengths \
  --num-sequences 384 --packing --fused --timeout $T"
for setting in "--no-compile-target" "--compile-target" "--compile-target --fp8 target"; do
  name=$(echo "$setting" | tr -d ' -')
  timeout $((T + 10)) python3 bench/train_throughput.py $common $setting --out "$OUT/compiled_target.jsonl" \
    2> "$OUT/$name.err" | tail -14
done
for f in "$OUT"/*.err; do echo "== $f"; grep -E "compile_target|warm-up|Error" "$f" | tail -n 4 | cut -c1-300; done
