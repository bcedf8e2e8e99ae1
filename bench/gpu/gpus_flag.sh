#!/usr/bin/env bash
# Device call 12 (issue 15, nvidia-h200-x2): `python -m trainer train --gpus 2` as a user runs it: qwen3_8b on
# the chat length mix, packed, two processes (trainer/train/launcher.py), 40 steps, then eval, checkpoint and walk.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cat > /tmp/gpus.json <<'JSON'
{"preset": "qwen3_8b", "steps": 40, "log_every": 10, "eval_every": 0, "ckpt_every": 0, "walk_prompts": 2,
 "walk_new_tokens": 32, "data": {"source": "chat_lengths", "num_sequences": 384, "eval_sequences": 2}}
JSON
started=$(date +%s)
timeout 480 python3 -m trainer train --config /tmp/gpus.json --gpus 2 --out /tmp/run > "$OUT/train.log" 2>&1
echo "rc $? in $(( $(date +%s) - started )) s" | tee -a "$OUT/train.log"
grep -v '^ ' "$OUT/train.log" | grep -v Warning | tail -14 | cut -c1-400
python3 - <<'PY' > "$OUT/steps.json"
import json, statistics
rows = [json.loads(l) for l in open("/tmp/run/metrics.jsonl") if '"loss"' in l]
late = rows[10:]
print(json.dumps({"steps": len(rows), "world_size": rows[-1]["world_size"],
                  "useful_tokens_per_s_median": statistics.median(r["useful_tokens_per_s"] for r in late),
                  "recompiles": rows[-1]["recompiles"], "eager_fallbacks": rows[-1]["eager_fallbacks"]}))
PY
cat "$OUT/steps.json"; cp /tmp/run/summary.json "$OUT/" 2>/dev/null; ls -la /tmp/run | head
