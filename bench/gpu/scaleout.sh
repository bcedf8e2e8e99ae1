#!/usr/bin/env bash
# Issue 22 (nvidia-h200-x2): one warm cache for every rank, torchrun through the trainer, two nodes, a dead worker.
# qwen3_8b on the chat length mix, packed, as `python -m trainer` runs it (what `envkit train` starts).
#   PART=cache: warm once as cuda:0 (what `envkit warm-cache` runs), then one GPU, then `--gpus 2`, then two
#               "nodes" of one GPU each (two torchrun agents, c10d rendezvous, CUDA_VISIBLE_DEVICES split).
#   PART=restart: `--gpus 2 --max-restarts 1`, rank 1 SIGKILLed after the checkpoint of step 10.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
PART=${PART:-cache}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)' >> "$OUT/env.txt"
steps=${STEPS:-40}
cat > /tmp/cfg.json <<JSON
{"preset": "qwen3_8b", "steps": $steps, "log_every": 10, "eval_every": 0, "ckpt_every": ${CKPT:-0},
 "walk_prompts": 1, "walk_new_tokens": 8, "data": {"source": "chat_lengths", "num_sequences": 384, "eval_sequences": 1}}
JSON

figures() {  # $1 run dir, $2 label: median useful tokens/s after 10 steps, hits and misses per rank
  python3 - "$1" "$2" "$3" <<'PY' | tee -a "$OUT/figures.jsonl"
import json, re, statistics, sys
run, label, log = sys.argv[1:4]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"loss"' in l]
late = [r for r in rows if r["step"] > 10]
warm = re.findall(r"(rank \d+: )?warm-up: .*?'fxgraph_cache_hit': (\d+), 'fxgraph_cache_miss': (\d+)", open(log).read())
summary = json.load(open(f"{run}/summary.json")) if __import__("os").path.exists(f"{run}/summary.json") else {}
print(json.dumps({"run": label, "steps": len(rows), "world_size": rows[-1].get("world_size", 1),
                  "useful_tokens_per_s_median": statistics.median(r["useful_tokens_per_s"] for r in late),
                  "warmup_hits_misses": [(w[0].strip(": ") or "rank 0", int(w[1]), int(w[2])) for w in warm],
                  "recompiles": rows[-1]["recompiles"], "eager_fallbacks": rows[-1]["eager_fallbacks"],
                  "restarts": summary.get("restarts"), "summary_hits": summary.get("fxgraph_cache_hit"),
                  "summary_misses": summary.get("fxgraph_cache_miss")}))
PY
}

if [ "$PART" = cache ]; then
  t=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m trainer warmup --config /tmp/cfg.json --out /tmp/w > "$OUT/warm.log" 2>&1
  echo "warm rc $? $(( $(date +%s) - t )) s: $(tail -1 "$OUT/warm.log" | cut -c1-300)" | tee -a "$OUT/times.txt"
  t=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m trainer train --config /tmp/cfg.json --out /tmp/one > "$OUT/one.log" 2>&1
  echo "one rc $? $(( $(date +%s) - t )) s" | tee -a "$OUT/times.txt"; figures /tmp/one one "$OUT/one.log"
  t=$(date +%s)
  timeout 170 python3 -m trainer train --config /tmp/cfg.json --gpus 2 --out /tmp/two > "$OUT/two.log" 2>&1
  echo "gpus2 rc $? $(( $(date +%s) - t )) s" | tee -a "$OUT/times.txt"; figures /tmp/two gpus2 "$OUT/two.log"
  t=$(date +%s)
  for r in 0 1; do
    CUDA_VISIBLE_DEVICES=$r timeout 170 python3 -m trainer train --config /tmp/cfg.json --out /tmp/node$r \
      --nnodes 2 --nproc-per-node 1 --node-rank $r --rdzv-endpoint 127.0.0.1:29533 > "$OUT/node$r.log" 2>&1 &
  done
  wait
  echo "nodes $(( $(date +%s) - t )) s" | tee -a "$OUT/times.txt"
  for r in 0 1; do cat /tmp/node$r/node.json | tr -d '\n' >> "$OUT/times.txt"; echo >> "$OUT/times.txt"; done
  w=$(ls -d /tmp/node*/summary.json | head -1 | xargs dirname)
  cat "$OUT/node0.log" "$OUT/node1.log" > "$OUT/nodes.log"; figures "$w" nodes "$OUT/nodes.log"
else
  t=$(date +%s)
  timeout 400 python3 -m trainer train --config /tmp/cfg.json --gpus 2 --max-restarts 1 --out /tmp/kill > "$OUT/kill.log" 2>&1 &
  until [ -f /tmp/kill/checkpoint.pt ] && grep -q '"step": 12' /tmp/kill/metrics.jsonl 2>/dev/null; do sleep 1; done
  victim=$(grep -l 'LOCAL_RANK=1' /proc/[0-9]*/environ 2>/dev/null | grep -o '[0-9]*' | while read p; do
    tr '\0' ' ' < /proc/$p/cmdline | grep -q 'trainer train' && echo $p; done | head -1)
  echo "killing rank 1 pid $victim at $(( $(date +%s) - t )) s" | tee -a "$OUT/times.txt"
  kill -9 "$victim"
  wait
  echo "restart run $(( $(date +%s) - t )) s" | tee -a "$OUT/times.txt"
  grep -o '"step": [0-9]*' /tmp/kill/metrics.jsonl | tr '\n' ' ' >> "$OUT/times.txt"; echo >> "$OUT/times.txt"
  figures /tmp/kill restart "$OUT/kill.log"
fi
for f in "$OUT"/*.log; do echo "== $f"; grep -v '^ \|Warning\|warn' "$f" | grep -E 'warm-up|resumed|Error|error|rank|done:' | cut -c1-300 | tail -8; done
