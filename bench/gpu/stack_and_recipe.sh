#!/usr/bin/env bash
# Issues 48 and 49 on one GPU machine, in two calls on the same warm machine:
#   PART=start:   the recipe's comparison with code_small (bench/recipe.py --via in-process) started in its own
#                 session (it outlives the call), then a qwen3_8b run (--fp8 drafter: torchao imported) whose log
#                 is searched for warnings and for uncompiled flex_attention.
#   PART=collect: waits for the recipe and copies its figures to $OUT.
#   PART=recipe:  the comparison alone, smaller (1,024 openings, 800 steps), in the foreground.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton ENVKIT_HOME=/tmp/home
if ls .whl/torchao-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
if [ "$PART" = start ]; then
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
    python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1; } > "$OUT/env.txt" 2>&1
  setsid nohup bash -c "timeout 1500 python3 bench/recipe.py --config bench/gpu/code_small.json --via in-process \
    --openings 2048 --held-out 64 --new-tokens 96 --steps 1200 --work /tmp/recipe > /tmp/recipe.jsonl 2> /tmp/recipe.log; \
    echo done > /tmp/recipe.done" > /dev/null 2>&1 &
  timeout 420 python3 -m trainer train --preset qwen3_8b --fp8 drafter --steps 8 --out /tmp/q8 > "$OUT/qwen3_8b.log" 2>&1
  echo "exit $?" >> "$OUT/qwen3_8b.log"
  grep -inE "warn|deprecat|without torch.compile|materializes" "$OUT/qwen3_8b.log" > "$OUT/qwen3_8b_warnings.txt"
  echo "warning lines: $(wc -l < "$OUT/qwen3_8b_warnings.txt")"; head -20 "$OUT/qwen3_8b_warnings.txt"
  grep -E "^walk|^eval|^done|^run:" "$OUT/qwen3_8b.log"
  tail -3 /tmp/recipe.jsonl 2>/dev/null; tail -3 /tmp/recipe.log
elif [ "$PART" = recipe ]; then  # the comparison alone, in the foreground
  timeout 540 python3 bench/recipe.py --config bench/gpu/code_small.json --via in-process --openings 1024 \
    --held-out 32 --new-tokens 64 --steps 800 --work /tmp/recipe > "$OUT/recipe.jsonl" 2> "$OUT/recipe.log"
  echo "exit $?"; cat "$OUT/recipe.jsonl"; tail -5 "$OUT/recipe.log"
else
  for _ in $(seq 1 110); do [ -f /tmp/recipe.done ] && break; sleep 5; done
  cp /tmp/recipe.jsonl /tmp/recipe.log "$OUT/" 2>/dev/null
  cat /tmp/recipe.jsonl; tail -5 /tmp/recipe.log
fi
