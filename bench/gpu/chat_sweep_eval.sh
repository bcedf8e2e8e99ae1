#!/usr/bin/env bash
# The third call of bench/gpu/chat_sweep.sh: every run waited for (WAIT seconds in all), walked as `envkit eval`
# walks (`python -m trainer evaluate`) on the held-out instructions and the held-out synthesized prompts, at once;
# then BEST (the run with the best walk / better rule on instructions, unless named), when it walks >= 2.0x there
# (or REFERENCE=1), exported and decoded by the reference dflash on the first 16 prompts of each set. Figures in OUT/eval-RUN*.json.
source bench/gpu/env.sh
work=/tmp/chat
export RUNS=${RUNS:-b8 b16 wide}
runs=$RUNS
t=$(date +%s)
for run in $runs; do
  pid=$(cat $work/$run.pid 2>/dev/null)
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t )) -lt ${WAIT:-400} ]; do sleep 3; done
  echo "$run: waited until $(( $(date +%s) - t ))s; $(grep -m1 'epochs of' $work/$run.log)"
  tail -c 1500 $work/$run.log > "$OUT/train-$run.log"; cp $work/$run/summary.json "$OUT/summary-$run.json" 2>/dev/null
done
sets=$(for file in $work/held-out.jsonl $work/held-out-synthesized.jsonl; do [ -f $file ] && echo "--prompts $file"; done)
for run in $runs; do
  python3 -m trainer evaluate --ckpt $work/$run/checkpoint.pt $sets > "$OUT/eval-$run.json" 2> "$OUT/eval-$run.log" &
done
wait
best=${BEST:-$(python3 - <<'PY'
import json, os
def ratio(run):
    try:
        f = json.load(open(f"{os.environ['OUT']}/eval-{run}.json"))["files"]["held-out.jsonl"]
    except Exception:
        return 0
    return f["walk_tau"] / max(f["walk_copy_tau"], f["walk_repeat_tau"])
best = max(os.environ["RUNS"].split(), key=ratio)
print(best, "%.3f" % ratio(best))
PY
)}
echo "best: $best"
set -- $best
best=$1
# The reference decode costs ~100 s of device time: only for a drafter that meets the bar, unless REFERENCE=1.
if [ -n "${REFERENCE:-}" ] || python3 -c "import sys; sys.exit(float('${2:-0}') < 2.0)"; then
  python3 -m trainer export --ckpt $work/$best/checkpoint.pt --out $work/export-$best --force > /dev/null \
    2> "$OUT/export-$best.log"
  for set in held-out held-out-synthesized; do
    python3 -m trainer evaluate --export $work/export-$best --prompts $work/$set.jsonl --max-prompts 16 \
      --reference-prompts 16 > "$OUT/eval-$best-export-$set.json" 2> "$OUT/eval-$best-export-$set.log" &
  done
else
  echo "$best is below 2.0x on instructions: no reference decode (REFERENCE=1 asks for it)"
fi
wait
python3 - <<'PY'
import glob, json, os
for name in sorted(glob.glob(os.environ["OUT"] + "/eval-*.json")):
    run = os.path.basename(name)[5:-5]
    try:
        d = json.load(open(name))
    except Exception as exc:
        print(run, "unreadable", exc); continue
    summary = f"{os.environ['OUT']}/summary-{run}.json"
    s = json.load(open(summary)) if os.path.exists(summary) else {}
    print(run, "block", d["block_size"], "step", d["step"], "tau_end", s.get("tau_end"), "tok/s",
          s.get("tokens_per_s"), "seconds", s.get("seconds"))
    for file, f in d["files"].items():
        rule = max(f["walk_copy_tau"], f["walk_repeat_tau"])
        print("  ", file, "tau", f["walk_tau"], "copy", f["walk_copy_tau"], "repeat", f["walk_repeat_tau"],
              "x%.2f" % (f["walk_tau"] / rule), "counted", f["walk_counted"], "degenerate", f["walk_degenerate"],
              "positions", f["walk_positions"])
    print("   reference", d.get("reference_dflash"), "speedup", d.get("speedup"))
PY
