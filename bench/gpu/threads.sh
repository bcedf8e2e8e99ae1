#!/usr/bin/env bash
# Device call 3: the H1/H2 reproductions on this torch; drafter threads on one GPU (1 vs 2
# replicas); a bucket left out of warm-up so that threads compile mid-run, mitigations off and on.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_threads.py -k "h1 or h2 or own_trace" > "$OUT/races.txt" 2>&1
tail -2 "$OUT/races.txt"
D=${DEVICES:-cuda:0}
common="--preset qwen3_8b --variants flex --steps 5 --skip 1 --num-anchors 256 --timeout 120 --out $OUT/threads.jsonl"
timeout 130 python3 bench/train_throughput.py $common --buckets 2048 --targets cuda:0 --drafters $D | grep -v "^ "
timeout 130 python3 bench/train_throughput.py $common --buckets 2048 --targets cuda:0 --drafters $D,$D | grep -v '^ '
timeout 130 python3 bench/train_throughput.py $common --buckets 1024,2048 --unwarmed 1024 --targets cuda:0 --drafters $D,$D --no-mitigations | grep -v '^ '
timeout 130 python3 bench/train_throughput.py $common --buckets 1024,2048 --unwarmed 1024 --targets cuda:0 --drafters $D,$D | grep -v '^ '
