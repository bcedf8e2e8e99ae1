#!/usr/bin/env bash
# Issue 23 (nvidia-h200): a target that has learned something, on the GPU. Builds code_small (~220M parameters)
# on the device's Python stdlib sources, trains a 2-layer drafter against it (bf16, flex, compiled), runs the
# decoding walk on held-out code prompts, then the same drafter's walk with a tap error and with zeroed
# features. As `python -m trainer` runs inside an envkit venv; the figures go to $OUT/figures.jsonl.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton ENVKIT_HOME=/tmp/home
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c 'import sys, torch, transformers, tokenizers; print(sys.version.split()[0], torch.__version__, transformers.__version__, tokenizers.__version__)' >> "$OUT/env.txt"
t=$(date +%s)
timeout 240 python3 -m trainer make-target --recipe code_small > "$OUT/make_target.json" 2> "$OUT/make_target.log"
echo "{\"make_target_s\": $(( $(date +%s) - t ))}" >> "$OUT/figures.jsonl"
cat "$OUT/make_target.json" >> "$OUT/figures.jsonl"
t=$(date +%s)
timeout 240 python3 -m trainer train --config bench/gpu/code_small.json --out /tmp/run > "$OUT/train.log" 2>&1
echo "{\"train_s\": $(( $(date +%s) - t ))}" >> "$OUT/figures.jsonl"
python3 -c 'import json; s=json.load(open("/tmp/run/summary.json")); print(json.dumps({k: s[k] for k in ("walk_tau","walk_repeat_tau","walk_copy_tau","tau_end","loss_end","useful_tokens_per_s","walk_near_ties")}))' >> "$OUT/figures.jsonl"
for ablation in "--taps 0,0" "--taps 7,7" "--zero-context"; do
  tau=$(timeout 90 python3 -m trainer eval --ckpt /tmp/run/checkpoint.pt --walk $ablation 2>>"$OUT/eval.log" | python3 -c 'import json,sys; print(json.load(sys.stdin)["walk_tau"])')
  echo "{\"ablation\": \"$ablation\", \"walk_tau\": ${tau:-null}}" >> "$OUT/figures.jsonl"
done
