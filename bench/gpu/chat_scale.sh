#!/usr/bin/env bash
# Issue 60, item 5: the chat recipe at scale on the device, in three calls on one warm machine (each within 30 s of
# the last; jobs run from copies in /tmp/chat, outside the working tree):
#   STASH=1 bash bench/gpu/chat_recipe.sh       carry .gguf/part-aa
#   bash bench/gpu/chat_scale.sh                carry .gguf/part-ab, .whl (gguf, dflash), .chatcfg (the 8,000 answers
#       of the recipe before): SmolLM2-135M-Instruct converted; today's 8,000-answer drafter trained again in the
#       background (the preset's steps, compiled flex); SYNTH prompts the target writes itself (sampled, top-p 0.95)
#       and every instruction of every kind answered by the trainer's decoder; the drafter trained on all of them,
#       EPOCHS passes, in the background
#   bash bench/gpu/chat_scale_eval.sh           waits for both, evaluates both on the held-out instructions and the
#       held-out synthesized prompts, exports both and decodes 16 prompts of each set with the reference dflash
source bench/gpu/env.sh
parts=$(ls .gguf/part-* 2>/dev/null)
python3 bench/gpu/chat_recipe.py ${parts:+--gguf-parts $parts} --work /tmp/chat --out "$OUT" --run base \
  --answers .chatcfg/answers.jsonl.gz --detach 2> "$OUT/chat-base.log"
echo "base: exit $?"
timeout ${LIMIT:-540} python3 bench/gpu/chat_recipe.py --work /tmp/chat --out "$OUT" --run scale \
  --synthesized ${SYNTH:-41000} --synth-seconds ${SYNTH_SECONDS:-220} --train ${TRAIN:-20000} --epochs ${EPOCHS:-3} \
  --answer-batch 2048 --detach \
  2> "$OUT/chat-scale.log"
echo "scale: exit $?"
tail -3 "$OUT/chat-scale.log"
