#!/usr/bin/env bash
# Issue 31 (nvidia-h200): qwen3_8b on the chat length mix, packed, compiled flex, one H200, side by side:
#   PART=1: today (foreach AdamW) and the fused AdamW (the new default); PART=2: --fp8 target and --fp8 both.
# Each with the step profile of its last 3 steps (bench/step_profile.py groups) and its loss after the same steps.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton
if ls .whl/torchao-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
  python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1; } > "$OUT/env$PART.txt" 2>&1
cat "$OUT/env$PART.txt"
common="--preset qwen3_8b --variants flex --steps 8 --skip 2 --profile-steps 3 --data-source chat_lengths \
  --num-sequences 384 --packing --timeout ${VARIANT_TIMEOUT:-280}"
if [ "$PART" = 1 ]; then
  python3 - <<'PY' > "$OUT/fp8_numerics.txt" 2>&1
import torch
from trainer.model.fp8 import Fp8Linear
torch.manual_seed(0)
lin = torch.nn.Linear(4096, 12288, bias=False, device="cuda", dtype=torch.bfloat16)
x = torch.randn(3072, 4096, device="cuda", dtype=torch.bfloat16)
ref = x.double() @ lin.weight.double().t()
for emulate in (False, True):
    out = Fp8Linear(lin, emulate=emulate)(x)
    print("emulate" if emulate else "scaled_mm", "rel err", float((out.double() - ref).norm() / ref.norm()))
print("bf16 rel err", float((lin(x).double() - ref).norm() / ref.norm()))
PY
  cat "$OUT/fp8_numerics.txt"
  timeout 290 python3 bench/train_throughput.py $common --no-fused --out "$OUT/fp8_part1.jsonl" 2> "$OUT/p1a.err" | tail -12
  timeout 290 python3 bench/train_throughput.py $common --fused --out "$OUT/fp8_part1.jsonl" 2> "$OUT/p1b.err" | tail -12
else
  VARIANT_TIMEOUT=175; common=${common/--timeout 280/--timeout 175}
  [ "${SKIP_BASE:-0}" = 1 ] || python3 bench/train_throughput.py $common --fused --out "$OUT/fp8_part2.jsonl" 2> "$OUT/p2o.err" | tail -12
  python3 bench/train_throughput.py $common --fp8 target --out "$OUT/fp8_part2.jsonl" 2> "$OUT/p2a.err" | tail -12
  python3 bench/train_throughput.py $common --fp8 both --out "$OUT/fp8_part2.jsonl" 2> "$OUT/p2b.err" | tail -12
fi
for f in "$OUT"/p*.err; do echo "== $f"; tail -n 3 "$f" | cut -c1-300; done
