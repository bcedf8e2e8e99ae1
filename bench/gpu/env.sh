# Sourced by the device scripts: unbuffered output, the project importable, $OUT, and a private compile cache
# (and ENVKIT_HOME) under /tmp that only this run writes. Wheels carried in .whl/ (torchao: the device has no
# package index) are installed into /tmp/site first.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cache && chmod 700 /tmp/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor TRITON_CACHE_DIR=/tmp/cache/triton ENVKIT_HOME=/tmp/home
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
