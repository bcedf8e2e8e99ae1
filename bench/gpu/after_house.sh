#!/usr/bin/env bash
# Issues 21/24 (nvidia-h200): the trainer after the house refactor on the CUDA path CI never runs.
#   1. the hazard self-tests (what warm-cache records for doctor) on this torch;
#   2. the tiny preset end to end on one GPU with compiled flex (warm-up, train, eval, walk);
#   3. qwen3_8b packed on the chat length mix, compiled flex: the one-GPU figure of issue 14 (10,988 useful tok/s).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
t=$(date +%s); timeout 120 python3 -m trainer selftest > "$OUT/selftest.json" 2> "$OUT/selftest.err"
echo "selftest rc=$? $(( $(date +%s) - t ))s"; cut -c1-600 "$OUT/selftest.json"
t=$(date +%s); timeout 200 python3 -m trainer train --preset tiny --device cuda --steps 300 --out /tmp/tiny > "$OUT/tiny.log" 2>&1
echo "tiny rc=$? $(( $(date +%s) - t ))s"; grep -E "warm-up|walk step|^done|Error" "$OUT/tiny.log" | cut -c1-300
cp /tmp/tiny/summary.json "$OUT/tiny_summary.json" 2>/dev/null
common="--preset qwen3_8b --variants flex --steps 10 --skip 2 --data-source chat_lengths --num-sequences 384 --timeout 260"
timeout 270 python3 bench/train_throughput.py $common --packing --out "$OUT/packing.jsonl" 2> "$OUT/packing.err" | grep -v '^ '
tail -3 "$OUT/packing.err" | cut -c1-300
