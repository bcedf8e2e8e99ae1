#!/usr/bin/env bash
# Device call 13 (nvidia-h200): the decoding walk's lossless check on qwen3_8b's bf16 target (call 12's --gpus
# run stopped in it at a 0.19 logit gap): 8 held-out prompts x 48 tokens, untrained drafter and both rules.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 170 python3 - <<'PY' 2>&1 | grep -v '^ \|Warn' | tail -5 | tee "$OUT/walk.txt"
import json, time
from trainer.config.schema import preset
from trainer.train.loop import Trainer
cfg = preset("qwen3_8b")
cfg.data.source, cfg.data.num_sequences, cfg.data.eval_sequences = "chat_lengths", 8, 8
cfg.walk_prompts, cfg.walk_new_tokens, cfg.compile = 8, 48, False
trainer = Trainer.sequential(cfg, "/tmp/walk", log=lambda m: None)
started = time.perf_counter()
row = trainer.evaluate_walk()
print(json.dumps({**row, "seconds": round(time.perf_counter() - started, 1)}))
PY
