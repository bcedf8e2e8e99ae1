#!/usr/bin/env bash
# Device call 9 (issue 15, nvidia-h200): the packed step's parts timed alone (target SDPA-dense against
# flex over a document BlockMask; drafter mask by create_block_mask against tiles from the anchors), then
# qwen3_8b on the chat length mix, packed, with both in place.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 170 python3 bench/step_parts.py --preset qwen3_8b --repeat 10 --out "$OUT/parts.jsonl" 2> "$OUT/parts.err"
tail -6 "$OUT/parts.err" | cut -c1-300
common="--preset qwen3_8b --variants flex --steps 10 --skip 2 --data-source chat_lengths --num-sequences 384 --timeout 330"
timeout 340 python3 bench/train_throughput.py $common ${PACKING:---packing} --out "$OUT/packing.jsonl" 2> "$OUT/packing.err" | grep -v '^ '
tail -5 "$OUT/packing.err" | cut -c1-300
