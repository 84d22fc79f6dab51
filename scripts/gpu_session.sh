#!/usr/bin/env bash
# One GPU-machine session: install the carried wheels, run the GPU tests and the given benchmarks,
# and keep every log under $OUT. Usage (on the device machine, from the repo root):
#   bash scripts/gpu_session.sh "<pytest args>" "<extra shell commands>"
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# .whl: gitpython and its deps; .whl_extra (when carried): Liger, for the suite's Liger columns
wheels=$(ls .whl/*.whl .whl_extra/*.whl 2>/dev/null)  # either folder may be missing
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
# Cache bytecode somewhere writable: the device image's site-packages has no .pyc files, so every
# process would compile torch's sources again (~6 s of each harness run).
export PYTHONPYCACHEPREFIX=/tmp/pycache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if [ -n "${1:-}" ]; then
  python3 -m pytest -q -x $1 2>&1 | tee "$OUT/pytest.txt" | tail -25
fi
if [ -n "${2:-}" ]; then
  bash -c "$2" 2>&1 | tee "$OUT/bench.txt" | tail -60
fi
