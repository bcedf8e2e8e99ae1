#!/usr/bin/env bash
# Issue 60, item 4: block size 16 (the anchors', with their loss weighting gamma 7) against the chat preset's 8
# (gamma 4), both trained at once on the recipe's 8,000 answers (the preset's steps, compiled flex), each walked on
# the 64 held-out instructions by `python -m trainer evaluate`. Not run yet (the session's device time ran out; a
# CPU smoke run checked the configs it writes). Two calls on one warm machine:
#   STASH=1 bash bench/gpu/chat_recipe.sh     carry .gguf/part-aa
#   bash bench/gpu/chat_block.sh              carry .gguf/part-ab, .whl (gguf), .chatcfg (the 8,000 answers)
source bench/gpu/env.sh
parts=$(ls .gguf/part-* 2>/dev/null)
common="--work /tmp/chat --out $OUT --answers .chatcfg/answers.jsonl.gz --detach ${STEPS:+--steps $STEPS}"
python3 bench/gpu/chat_recipe.py ${parts:+--gguf-parts $parts} $common --run b8 2> "$OUT/chat-b8.log"
python3 bench/gpu/chat_recipe.py $common --run b16 --block-size 16 --gamma 7 2> "$OUT/chat-b16.log"
t=$(date +%s)
for run in b8 b16; do
  pid=$(cat /tmp/chat/$run.pid)
  while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t )) -lt ${WAIT:-330} ]; do sleep 3; done
  echo "$run: trained after $(( $(date +%s) - t ))s; $(grep -m1 -o 'tau_end[^,]*' /tmp/chat/$run.log)"
  cp /tmp/chat/$run/summary.json "$OUT/summary-$run.json" 2>/dev/null
done
for run in b8 b16; do
  python3 -m trainer evaluate --ckpt /tmp/chat/$run/checkpoint.pt --prompts /tmp/chat/held-out.jsonl \
    > "$OUT/eval-$run.json" 2> "$OUT/eval-$run.log" &
done
wait
python3 - <<'PY'
import json, os
for run in ("b8", "b16"):
    try:
        d = json.load(open(f"{os.environ['OUT']}/eval-{run}.json")); f = d["files"]["held-out.jsonl"]
        s = json.load(open(f"{os.environ['OUT']}/summary-{run}.json"))
    except Exception as exc:
        print(run, "unreadable", exc); continue
    print(run, "block", d["block_size"], "walk", f["walk_tau"], "copy", f["walk_copy_tau"], "repeat",
          f["walk_repeat_tau"], "x%.2f" % (f["walk_tau"] / max(f["walk_copy_tau"], f["walk_repeat_tau"])),
          "counted", f["walk_counted"], "positions", f["walk_positions"], "speedup", d["speedup"],
          "tau_end", s.get("tau_end"), "tok/s", s.get("tokens_per_s"), "steps", s.get("steps"))
PY
