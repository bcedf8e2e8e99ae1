#!/usr/bin/env bash
# Issue 31 (nvidia-h200): acceptance kept. code_small built on the device, then the same drafter trained once
# per --fp8 setting in $SETTINGS (default "off target"; 1,200 steps on 1,024 greedy continuations, bf16, flex,
# compiled, compiled target). Each walked against the bf16 target (what serving verifies against) and
# teacher-forced on the same held-out positions. Figures to $OUT/acceptance.jsonl.
source "$(dirname "$0")/env.sh"
t=$(date +%s)
timeout 150 python3 -m trainer make-target --recipe code_small > "$OUT/make_target.json" 2> "$OUT/make_target.log"
echo "make-target: $(( $(date +%s) - t )) s"
python3 - <<'PY'
import json, os
config = json.load(open("bench/gpu/code_small.json"))
config.update(walk_prompts=8, walk_new_tokens=64, eval_every=0)
# Fewer greedy continuations and steps than the preset: two runs and the target's build fit one call.
config["data"]["num_sequences"] = int(os.environ.get("NUM_SEQUENCES", 1024))
config["steps"] = int(os.environ.get("STEPS", 1200))
json.dump(config, open("/tmp/code_small_acc.json", "w"))
PY
for setting in ${SETTINGS:-off target}; do
  t=$(date +%s)
  limit=${RUN_LIMIT:-210}  # generation on the device and the walk through the KV cache: seconds, not minutes
  timeout $limit python3 -m trainer train --config /tmp/code_small_acc.json --compile-target --fp8 $setting \
    --out /tmp/run-$setting > "$OUT/train-$setting.log" 2>&1
  python3 - "$setting" "$(( $(date +%s) - t ))" <<'PY' | tee -a "$OUT/acceptance.jsonl"
import json, sys
try:
    s = json.load(open(f"/tmp/run-{sys.argv[1]}/summary.json"))
    keys = ("walk_tau", "walk_repeat_tau", "walk_copy_tau", "tau_end", "loss_end", "useful_tokens_per_s",
            "walk_near_ties", "recompiles", "steps")
    print(json.dumps({"fp8": sys.argv[1], "seconds": int(sys.argv[2])} | {k: s.get(k) for k in keys}))
except OSError as exc:
    print(json.dumps({"fp8": sys.argv[1], "seconds": int(sys.argv[2]), "error": str(exc)}))
PY
  grep -E "fp8|compile_target|Error" "$OUT/train-$setting.log" | head -5
done
