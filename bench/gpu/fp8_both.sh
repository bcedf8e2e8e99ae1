#!/usr/bin/env bash
# Issue 31 (nvidia-h200): --fp8 both (the drafter's linears through torchao's float8 training as well) beside
# --fp8 target, one call, qwen3_8b, chat length mix, packed, compiled flex, compiled target, fused AdamW.
# The float8 drafter's cold compile outlasted a 175 s slot before: it gets the longer one. Needs .whl/torchao.
source "$(dirname "$0")/env.sh"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers, torchao
print(torch.__version__, triton.__version__, transformers.__version__, 'torchao', torchao.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
common="--preset qwen3_8b --variants flex --steps 8 --skip 2 --profile-steps 3 --data-source chat_lengths \
  --num-sequences 384 --packing --fused --compile-target"
for slot in "target 185" "both 360"; do
  set -- $slot
  timeout $(($2 + 10)) python3 bench/train_throughput.py $common --fp8 $1 --timeout $2 \
    --out "$OUT/fp8_both.jsonl" 2> "$OUT/fp8_$1.err" | tail -14
done
for f in "$OUT"/*.err; do echo "== $f"; grep -E "fp8|compile_target|warm-up|Error" "$f" | tail -n 4 | cut -c1-300; done
