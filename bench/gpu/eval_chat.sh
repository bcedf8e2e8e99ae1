#!/usr/bin/env bash
# Issue 63 on the device: the chat drafter that `DETACH=1 bash bench/gpu/chat_recipe.sh` started training (the call
# before, on the same warm machine) waited for, then evaluated as `envkit eval` evaluates it, by the same trainer
# command (`python -m trainer evaluate`; the device has no package index, so no envkit-made venv to preflight):
# the checkpoint with its report (OUT/eval: eval.json, per_prompt.csv, report.html), then its export, which must
# accept the same on the same 64 held-out instructions.
source bench/gpu/env.sh
work=${WORK:-/tmp/chat}
run=$work/${RUN:-run}
pid=$(cat $work/${RUN:-run}.pid 2>/dev/null)
t=$(date +%s)
while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t )) -lt ${WAIT:-420} ]; do sleep 5; done
echo "waited $(( $(date +%s) - t ))s; summary: $(ls $run/summary.json 2>/dev/null)"
tail -c 1500 $work/${RUN:-run}.log > "$OUT/train_tail.log"
cp $run/summary.json "$OUT/summary.json" 2>/dev/null
t=$(date +%s); python3 -m trainer evaluate --ckpt $run/checkpoint.pt --prompts $work/held-out.jsonl \
  --out "$OUT/eval" > $work/eval_ckpt.json 2> "$OUT/eval_ckpt.log"; echo "evaluate ckpt rc=$? $(( $(date +%s) - t ))s"
python3 -m trainer export --ckpt $run/checkpoint.pt --out $work/export --force > /dev/null 2>> "$OUT/eval_ckpt.log"
t=$(date +%s); python3 -m trainer evaluate --export $work/export --prompts $work/held-out.jsonl \
  > "$OUT/eval_export.json" 2> "$OUT/eval_export.log"; echo "evaluate export rc=$? $(( $(date +%s) - t ))s"
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for name in (f"{out}/eval/eval.json", f"{out}/eval_export.json"):
    try:
        d = json.load(open(name)); f = d["files"]["held-out.jsonl"]
        print(name, d["kind"], {k: f[k] for k in ("walk_tau", "walk_median_tau", "walk_copy_tau", "walk_repeat_tau",
              "walk_counted", "walk_degenerate", "walk_near_ties", "walk_verified_agree")}, f["walk_positions"],
              d["speedup"], {k: d["cost"][k] for k in ("t_decode_s", "t_verify_s", "t_draft_s", "device")})
    except Exception as exc:
        print(name, "unreadable", exc)
PY
