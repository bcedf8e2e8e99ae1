#!/usr/bin/env bash
# Issue 60 item 4 on the device: the chat preset's training throughput, eager SDPA (how the device recipe ran it)
# against compiled flex attention over packed rows (the preset's own default on CUDA), side by side in one call, on
# the recipe's 8,000 answers (carry .chatcfg: SmolLM2-135M-Instruct's config, tokenizer and chat template, and
# answers.jsonl.gz from `DETACH=1 bash bench/gpu/chat_recipe.sh`). The target has SmolLM2's shapes and random
# weights: a step's cost does not depend on the weights' values, and the 93 MB GGUF would take two calls.
source bench/gpu/env.sh
mkdir -p /tmp/t && cp .chatcfg/*.json .chatcfg/*.jinja /tmp/t/
python3 -c "
import torch; from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0); AutoModelForCausalLM.from_config(AutoConfig.from_pretrained('/tmp/t')).save_pretrained('/tmp/t')"
gunzip -c .chatcfg/answers.jsonl.gz > /tmp/answers.jsonl
for arm in ${ARMS:-eager compiled}; do
  case $arm in eager) how='"attention": "sdpa", "compile": false';; *) how='"attention": "flex", "compile": true';; esac
  echo "{\"preset\": \"chat\", \"dtype\": \"bfloat16\", $how, \"steps\": ${STEPS:-600}, \"eval_every\": 0, \
\"ckpt_every\": 0, \"walk_prompts\": 2, \"walk_new_tokens\": 16}" > /tmp/$arm.json
  t=$(date +%s)
  timeout ${LIMIT:-260} python3 -m trainer train --config /tmp/$arm.json --target /tmp/t --data /tmp/answers.jsonl \
    --out /tmp/run-$arm > "$OUT/$arm.log" 2>&1
  echo "$arm rc=$? $(( $(date +%s) - t ))s"; grep -E "warm-up|^done|Error" "$OUT/$arm.log" | cut -c1-300
  python3 -c "import json; d=json.load(open('/tmp/run-$arm/summary.json')); print('$arm', {k: d[k] for k in \
('tokens_per_s', 'useful_tokens_per_s', 'pad_fraction', 'recompiles', 'eager_fallbacks', 'steps')})"
done
