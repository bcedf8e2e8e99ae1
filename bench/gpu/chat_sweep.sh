#!/usr/bin/env bash
# Issue 60, item 4 and the 2.0x bar: drafters trained at once on the recipe at scale's mixed answers, each the chat
# preset's compiled flex run but for one change:
#   b8     the preset: block 8, loss weighting gamma 4, 4 layers, 32 anchors a row
#   b16    block 16 with the anchors' gamma 7
#   b8g7   block 8 with gamma 7: the loss weighting alone
#   wide   block 8, gamma 4, 6 layers and 64 anchors a row (more supervised blocks from each target forward)
# EPOCHS (3) passes each; RUNS (b8 b16 wide) names the runs, the same for the eval. The answers: ANSWERS, or an
# earlier session's answers.jsonl.gz carried in .chatscale/, or else written here as bench/gpu/chat_scale.sh writes
# them (SYNTH prompts the target writes itself and TRAIN instructions of every kind, answered by the trainer's
# decoder; a copy comes back as OUT/answers.jsonl.gz: keep it in .chatscale/ for the next session). STEPS instead of
# epochs. Three calls on one warm machine, 30 s apart at most:
#   STASH=1 bash bench/gpu/chat_sweep.sh      carry .gguf/part-aa (and .chatscale, where it exists)
#   bash bench/gpu/chat_sweep.sh              carry .gguf/part-ab, .whl (gguf, dflash): the target converted, the
#       answers written (unless given), the runs started in sessions of their own, the held-out synthesized prompts
#       (written with the answers, or again by the same seed and batch: held out by digest, so never among the
#       training prompts); it watches the runs until WATCH_UNTIL seconds (540) have passed
#   bash bench/gpu/chat_sweep_eval.sh         waits, walks every run on both held-out sets; the best, at 2.0x,
#       exported and 16 prompts of each set decoded by the reference dflash
# With one run (RUNS=wide WATCH_UNTIL=480 EVAL=1), the second call trains it and evaluates it: two calls in all.
source bench/gpu/env.sh
if [ -n "${STASH:-}" ]; then
  mkdir -p /tmp/chat && cp .chatscale/answers.jsonl.gz /tmp/chat/scale-answers.jsonl.gz 2>/dev/null
  python3 bench/gpu/chat_recipe.py --gguf-parts .gguf/part-* --work /tmp/chat --stash; exit
fi
parts=$(ls .gguf/part-* 2>/dev/null)
answers=${ANSWERS:-/tmp/chat/scale-answers.jsonl.gz}
if [ -f "$answers" ]; then
  data="--answers $answers"
else  # the first run writes them; the others find them in /tmp/chat (the same arguments, the same file)
  data="--synthesized ${SYNTH:-41000} --synth-seconds ${SYNTH_SECONDS:-220} --train ${TRAIN:-20000} --answer-batch 2048"
  SYNTH_HELD_OUT=0  # written with the answers
fi
length="--epochs ${EPOCHS:-3}"
[ -n "${STEPS:-}" ] && length="--steps $STEPS"  # a file with both keeps its epochs (trainer/config/schema.py)
common="--work /tmp/chat --out $OUT $data --detach $length"
first=1
for run in ${RUNS:-b8 b16 wide}; do
  case $run in
    b8) flags="" ;;
    b16) flags="--block-size 16 --gamma 7" ;;
    b8g7) flags="--gamma 7" ;;
    wide) flags="--drafter-layers 6 --anchors 64" ;;
  esac
  # The first run converts the target (and, unless given, writes the answers) before it starts training.
  python3 bench/gpu/chat_recipe.py ${first:+${parts:+--gguf-parts $parts}} $common --run $run $flags \
    2> "$OUT/chat-$run.log"
  first=
done
if [ "${SYNTH_HELD_OUT:-1}" = 1 ]; then  # SYNTH_HELD_OUT=0: walk the held-out instructions only (~40 s less)
  python3 bench/gpu/chat_recipe.py --work /tmp/chat --out "$OUT" --held-out-only --synthesized 4000 \
    --synth-batch 2048 2> "$OUT/chat-held-out.log"
fi
pids() { for file in /tmp/chat/*.pid; do cat "$file"; echo; done; }  # a pid file ends without a newline
echo "started: $(pids | tr '\n' ' '); held-out: $(wc -l /tmp/chat/held-out*.jsonl | tr '\n' ' ')"
running() { for pid in $(pids); do kill -0 $pid 2>/dev/null && return 0; done; return 1; }
while running && [ $SECONDS -lt ${WATCH_UNTIL:-540} ]; do sleep 10; done
for run in ${RUNS:-b8 b16 wide}; do echo "$run: $(grep -E 'epochs of|step ' /tmp/chat/$run.log | tail -2 | tr '\n' ' ')"; done
# EVAL=1: the sweep evaluated in this call too (one call fewer where device time is short); a run still training
# at WATCH_UNTIL is stopped with SIGTERM (the trainer checkpoints at the step it reached) and evaluated as it stands.
if [ -n "${EVAL:-}" ]; then
  running && kill $(pids) 2>/dev/null
  WAIT=60 bash bench/gpu/chat_sweep_eval.sh
fi
