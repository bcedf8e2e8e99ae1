#!/usr/bin/env bash
# Issue 60, item 4 and the 2.0x bar: drafters trained at once on the recipe-at-scale's 51,453 mixed answers (the
# answers bench/gpu/chat_scale.sh wrote, carried back in), each the chat preset's compiled flex run but for one change:
#   b8     the preset: block 8, loss weighting gamma 4, 4 layers, 32 anchors a row
#   b16    block 16 with the anchors' gamma 7
#   b8g7   block 8 with gamma 7: the loss weighting alone
#   wide   block 8, gamma 4, 6 layers and 64 anchors a row (more supervised blocks from each target forward)
# EPOCHS (3) passes each; RUNS (b8 b16 wide) names the runs, the same for the eval. The answers are the last session's
# (the answers.jsonl.gz chat_scale.sh wrote to $OUT, copied to .chatscale/); ANSWERS=.chatcfg/answers.jsonl.gz trains
# on the recipe's 8,000 instead, STEPS instead of epochs. Three calls on one warm machine, 30 s apart at most:
#   STASH=1 bash bench/gpu/chat_sweep.sh      carry .gguf/part-aa and .chatscale (answers.jsonl.gz)
#   bash bench/gpu/chat_sweep.sh              carry .gguf/part-ab, .whl (gguf, dflash), .chatcfg: the target
#       converted, the runs started in sessions of their own, the held-out synthesized prompts written again
#       (the same seed and batch as the answers' run; held out by digest, so never among its training prompts)
#   bash bench/gpu/chat_sweep_eval.sh         waits, walks every run on both held-out sets; the best, at 2.0x,
#       exported and 16 prompts of each set decoded by the reference dflash
source bench/gpu/env.sh
if [ -n "${STASH:-}" ]; then
  mkdir -p /tmp/chat && cp .chatscale/answers.jsonl.gz /tmp/chat/scale-answers.jsonl.gz
  python3 bench/gpu/chat_recipe.py --gguf-parts .gguf/part-* --work /tmp/chat --stash; exit
fi
parts=$(ls .gguf/part-* 2>/dev/null)
common="--work /tmp/chat --out $OUT --answers ${ANSWERS:-/tmp/chat/scale-answers.jsonl.gz} --detach --epochs ${EPOCHS:-3} ${STEPS:+--steps $STEPS}"
first=1
for run in ${RUNS:-b8 b16 wide}; do
  case $run in
    b8) flags="" ;;
    b16) flags="--block-size 16 --gamma 7" ;;
    b8g7) flags="--gamma 7" ;;
    wide) flags="--drafter-layers 6 --anchors 64" ;;
  esac
  # The first run converts the target; the last writes the held-out synthesized prompts once the others train.
  python3 bench/gpu/chat_recipe.py ${first:+${parts:+--gguf-parts $parts}} $common --run $run $flags \
    2> "$OUT/chat-$run.log"
  first=
done
if [ "${SYNTH_HELD_OUT:-1}" = 1 ]; then  # SYNTH_HELD_OUT=0: walk the held-out instructions only (~40 s less)
  python3 bench/gpu/chat_recipe.py --work /tmp/chat --out "$OUT" --held-out-only --synthesized 4000 \
    --synth-batch 2048 2> "$OUT/chat-held-out.log"
fi
echo "started: $(cat /tmp/chat/*.pid | tr '\n' ' '); held-out: $(wc -l /tmp/chat/held-out*.jsonl | tr '\n' ' ')"
sleep ${WATCH:-30}
for run in ${RUNS:-b8 b16 wide}; do echo "$run: $(grep -E 'epochs of|step ' /tmp/chat/$run.log | tail -2 | tr '\n' ' ')"; done
