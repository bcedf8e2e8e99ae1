# Sourced by the device scripts: unbuffered output, the project importable, $OUT, and a private compile cache
# (and ENVKIT_HOME) under /tmp that only this run writes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton ENVKIT_HOME=/tmp/home
