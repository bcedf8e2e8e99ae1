#!/usr/bin/env bash
# The third call of bench/gpu/chat_scale.sh: both drafters waited for (WAIT seconds at most), each evaluated as
# `envkit eval` evaluates (`python -m trainer evaluate`) on both held-out sets, exported, and its export decoded by
# the reference dflash on the first 16 prompts of each set. Figures in OUT/eval-RUN-*.json.
source bench/gpu/env.sh
work=/tmp/chat
sets="--prompts $work/held-out.jsonl --prompts $work/held-out-synthesized.jsonl"
for run in base scale; do
  pid=$(cat $work/$run.pid 2>/dev/null); t=$(date +%s)
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t )) -lt ${WAIT:-400} ]; do sleep 5; done
  echo "$run: waited $(( $(date +%s) - t ))s; $(grep -m1 'epochs of' $work/$run.log)"
  tail -c 1500 $work/$run.log > "$OUT/train-$run.log"; cp $work/$run/summary.json "$OUT/summary-$run.json" 2>/dev/null
  python3 -m trainer evaluate --ckpt $work/$run/checkpoint.pt $sets > "$OUT/eval-$run-ckpt.json" \
    2> "$OUT/eval-$run-ckpt.log"; echo "$run: evaluate ckpt rc=$?"
  python3 -m trainer export --ckpt $work/$run/checkpoint.pt --out $work/export-$run --force > /dev/null \
    2>> "$OUT/eval-$run-ckpt.log"
  for set in held-out held-out-synthesized; do
    python3 -m trainer evaluate --export $work/export-$run --prompts $work/$set.jsonl --max-prompts 16 \
      --reference-prompts 16 > "$OUT/eval-$run-export-$set.json" 2> "$OUT/eval-$run-export-$set.log"
    echo "$run $set: evaluate export rc=$?"
  done
done
python3 - <<'PY'
import glob, json, os
for name in sorted(glob.glob(os.environ["OUT"] + "/eval-*.json")):
    try:
        d = json.load(open(name))
    except Exception as exc:
        print(os.path.basename(name), "unreadable", exc); continue
    for file, f in d["files"].items():
        rule = max(f["walk_copy_tau"], f["walk_repeat_tau"])
        print(os.path.basename(name), file, "tau", f["walk_tau"], "copy", f["walk_copy_tau"], "repeat",
              f["walk_repeat_tau"], "x%.2f" % (f["walk_tau"] / rule), "counted", f["walk_counted"], "degenerate",
              f["walk_degenerate"], "near_ties", f["walk_near_ties"], "positions", f["walk_positions"])
    print("  reference", d.get("reference_dflash"), "speedup", d.get("speedup"))
PY
