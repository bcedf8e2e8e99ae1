#!/usr/bin/env bash
# Issue 52, the chat recipe on the device, in calls on one warm machine (the device carries 64 MiB a call and the
# GGUF is 93 MB):
#   STASH=1 bash bench/gpu/chat_recipe.sh    carry .gguf/part-aa: it is copied to /tmp/chat, outside the tree
#   bash bench/gpu/chat_recipe.sh            carry .gguf/part-ab and .whl (the gguf wheel): SmolLM2-135M-Instruct
#       converted from the joined parts, TRAIN instructions of every kind answered by it, the chat drafter trained
#       on the answers (RUN names the run; STEPS, BATCH, LAYERS: the preset's unless set), walked on 64 held-out
#       "Write a Python function" instructions
#   RUN=b STEPS=... LAYERS=... bash bench/gpu/chat_recipe.sh   a later call: another run on the same answers
#   DETACH=1 bash bench/gpu/chat_recipe.sh   answer, then start training in a session of its own and return; the
#       next call, `bash bench/gpu/eval_chat.sh`, waits for it and evaluates it (issue 63)
# BEFORE=.before/walk.py (an earlier commit's trainer/eval/walk.py, carried) also times that walk beside this one on
# the run's checkpoint (bench/walk_before_after.py).
source bench/gpu/env.sh
if [ -n "${STASH:-}" ]; then
  python3 bench/gpu/chat_recipe.py --gguf-parts .gguf/part-* --work /tmp/chat --stash; exit
fi
parts=$(ls .gguf/part-* 2>/dev/null)
timeout ${LIMIT:-560} python3 bench/gpu/chat_recipe.py ${parts:+--gguf-parts $parts} --work /tmp/chat --out "$OUT" \
  --train ${TRAIN:-8000} --run ${RUN:-run} ${STEPS:+--steps $STEPS} ${BATCH:+--batch-size $BATCH} \
  ${LAYERS:+--drafter-layers $LAYERS} ${TRAIN_SECONDS:+--train-seconds $TRAIN_SECONDS} ${DETACH:+--detach} ${EAGER:+--eager} \
  2> "$OUT/chat-${RUN:-run}.log"
echo "exit $?"
if [ -n "${BEFORE:-}" ]; then
  timeout 330 python3 bench/walk_before_after.py --ckpt /tmp/chat/${RUN:-run}/checkpoint.pt \
    --prompts /tmp/chat/held-out.jsonl --before "$BEFORE" > "$OUT/walk_before_after.json" 2> "$OUT/walk_before_after.log"
  echo "exit $?"; cat "$OUT/walk_before_after.json"
fi
