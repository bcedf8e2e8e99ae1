#!/usr/bin/env bash
# Issue 32: autocast entered around the compiled loss instead of inside it, so AOTAutograd's cache can hit. The first
# finished qwen3_8b step from an empty, a warm and an imported cache, before (the previous replica.py, carried as
# .whl/replica_before.py) and after, in one call on one machine.
source "$(dirname "$0")/env.sh"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
bench() {  # $1: a label; run from the current directory
  rm -rf /tmp/cache/*
  timeout 280 python3 bench/compile_cache.py --python python3 --preset qwen3_8b --bucket 3072 --repeat 1 \
    > "$OUT/compile_cache_$1.json" 2> "$OUT/compile_cache_$1.err"
  echo "$1:"; tail -1 "$OUT/compile_cache_$1.json"; tail -3 "$OUT/compile_cache_$1.err"
}
bench after
if [ -f .whl/replica_before.py ]; then
  rm -rf /tmp/before && mkdir /tmp/before && cp -r bench envkit trainer /tmp/before/ \
    && cp .whl/replica_before.py /tmp/before/trainer/train/replica.py
  (cd /tmp/before && PYTHONPATH=/tmp/before && bench before)
fi
