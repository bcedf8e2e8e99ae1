#!/usr/bin/env bash
# Device call 2: the H1/H2 reproductions on this torch (stock fails, mitigated passes), then the
# first finished qwen3_8b step from an empty, a warm and an imported compile cache.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_threads.py -k "h1 or h2 or own_trace" > "$OUT/races.txt" 2>&1
tail -2 "$OUT/races.txt"
timeout 400 python3 bench/compile_cache.py --python python3 --preset qwen3_8b --bucket 3072 --repeat 1 \
  > "$OUT/compile_cache.json" 2> "$OUT/compile_cache.err"
cat "$OUT/compile_cache.json"; tail -5 "$OUT/compile_cache.err"
