#!/usr/bin/env bash
# Issue 52, the chat recipe in one call (the GGUF's first part stashed by the call before, bench/gpu/code_small_recipe.sh
# with STASH=.gguf/part-aa): SmolLM2-135M-Instruct converted from the joined parts (the gguf wheel carried in .whl/),
# 800 instructions answered by it (the device's Python 3.12 stdlib has 880 documented public functions), the
# chat drafter trained on the answers, walked on 64 held-out instructions;
# then the walk of this commit beside the walk of .before/walk.py (an earlier commit's), the same checkpoint
# (the earlier walk took 240 s on an H100). Before the call: `mkdir -p .before && git show 9289080:trainer/eval/walk.py
# > .before/walk.py`, .before ignored through .git/info/exclude and named in the call's carry with .gguf/part-ab and .whl.
source bench/gpu/env.sh
timeout ${LIMIT:-420} python3 bench/gpu/chat_recipe.py --gguf-parts /tmp/stash/part-* .gguf/part-* --work /tmp/chat \
  --out "$OUT" --steps ${STEPS:-1000} --train ${TRAIN:-800} 2> "$OUT/chat.log"
echo "exit $?"
timeout 330 python3 bench/walk_before_after.py --ckpt /tmp/chat/run/checkpoint.pt --prompts /tmp/chat/held-out.jsonl \
  --before .before/walk.py > "$OUT/walk_before_after.json" 2> "$OUT/walk_before_after.log"
echo "exit $?"; cat "$OUT/walk_before_after.json"; tail -3 "$OUT/walk_before_after.log"
