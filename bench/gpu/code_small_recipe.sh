#!/usr/bin/env bash
# Issue 52, the code_small comparison in one call: code_small built on the device, 2,048 training openings answered
# by it in this process (left-padded batches), then the preset's default drafter and the drafter trained on those
# answers, 1,200 steps each, both walked on the same 64 docstring-led openings from held-out files (96 tokens).
# With STASH=FILE..., those files are first copied to /tmp/stash for a later call on the same warm machine.
source bench/gpu/env.sh
mkdir -p /tmp/stash && for f in ${STASH:-}; do cp "$f" /tmp/stash/; done
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__)'; } > "$OUT/env.txt"
timeout ${LIMIT:-560} python3 bench/recipe.py --config bench/gpu/code_small.json --via in-process --openings 2048 \
  --held-out 64 --new-tokens 96 --steps 1200 --work /tmp/recipe > "$OUT/recipe.jsonl" 2> "$OUT/recipe.log"
echo "exit $?"; cat "$OUT/env.txt" "$OUT/recipe.jsonl"; grep -E "^walk|^done" "$OUT/recipe.log" | tail -4
