#!/usr/bin/env bash
# GPU: the whole `gpu`-marked test suite in three parts, each meant for one 10-minute device command; logs and the
# slowest tests under LOGDIR.
#
#   bash scripts/gpu_suite.sh LOGDIR 1|2|3
#
# 1: the starters through the harness at full shapes, both TMA descriptor kinds, every starter's launches replayed;
# 2: the harness against planted exploits, its guards, the CUDA C++ backend;
# 3: everything else marked gpu (verify, optimize, the fused types, model time, KernelBench, Ray, ...).
set -uo pipefail
LOG=${1:?usage: gpu_suite.sh LOGDIR 1|2|3}
PART=${2:?usage: gpu_suite.sh LOGDIR 1|2|3}
mkdir -p "$LOG"
ONE=(tests/test_starters.py tests/test_descriptors.py tests/test_launch.py)
TWO=(tests/test_adversarial.py tests/test_harness_guards.py tests/test_cuda_backend.py)
case $PART in
  1) FILES=("${ONE[@]}") ;;
  2) FILES=("${TWO[@]}") ;;
  3) FILES=($(printf -- '--ignore=%s ' "${ONE[@]}" "${TWO[@]}") tests) ;;
  *) echo "part 1, 2 or 3, not $PART"; exit 2 ;;
esac
python3 -m pytest -q -m gpu --durations=15 "${FILES[@]}" 2>&1 | tee "$LOG/suite$PART.log" | tail -30
