#!/usr/bin/env bash
# Device call 1: environment, the H1/H2 reproductions on this torch, then qwen3_8b throughput
# (compiled flex vs SDPA vs eager flex) on one GPU. Writes everything under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_threads.py -k "h1 or h2 or own_trace" > "$OUT/races.txt" 2>&1
tail -3 "$OUT/races.txt"
timeout 420 python3 bench/train_throughput.py --preset qwen3_8b --buckets 3072 --steps 8 --skip 2 \
  --variants flex,sdpa,flex-eager --timeout 200 --out "$OUT/throughput.jsonl" 2> "$OUT/throughput.err"
tail -20 "$OUT/throughput.err" | cut -c1-300
