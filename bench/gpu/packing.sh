#!/usr/bin/env bash
# Device call 6 (issue 15, nvidia-h200): qwen3_8b on the chat length mix (log-normal, median 800, p90 2500
# tokens), compiled flex, packed against one sequence a row.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
common="--preset qwen3_8b --variants flex --steps 10 --skip 2 --data-source chat_lengths --num-sequences 384 --timeout 270"
timeout 280 python3 bench/train_throughput.py $common --packing --out "$OUT/packing.jsonl" 2> "$OUT/packing.err" | grep -v '^ '
timeout 280 python3 bench/train_throughput.py $common --no-packing --out "$OUT/packing.jsonl" 2>> "$OUT/packing.err" | grep -v '^ '
tail -5 "$OUT/packing.err" | cut -c1-300
