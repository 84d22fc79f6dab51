#!/usr/bin/env bash
# GPU: the whole `gpu`-marked test suite in four parts, each meant for one 10-minute device command; logs and the
# slowest tests under LOGDIR.
#
#   bash scripts/gpu_suite.sh LOGDIR 1|2|3|4
#
# 1: every starter through the harness at full shapes;
# 2: both TMA descriptor kinds, every starter's launches replayed, the harness's guards and planted exploits;
# 3: the CUDA C++ backend (nvcc builds);
# 4: everything else marked gpu (verify, optimize, the fused types, model time, KernelBench, Ray, ...).
set -uo pipefail
LOG=${1:?usage: gpu_suite.sh LOGDIR 1|2|3|4}
PART=${2:?usage: gpu_suite.sh LOGDIR 1|2|3|4}
mkdir -p "$LOG"
ONE=(tests/test_starters.py)
TWO=(tests/test_descriptors.py tests/test_launch.py tests/test_harness_guards.py tests/test_adversarial.py)
THREE=(tests/test_cuda_backend.py)
case $PART in
  1) FILES=("${ONE[@]}") ;;
  2) FILES=("${TWO[@]}") ;;
  3) FILES=("${THREE[@]}") ;;
  4) FILES=($(printf -- '--ignore=%s ' "${ONE[@]}" "${TWO[@]}" "${THREE[@]}") tests) ;;
  *) echo "part 1, 2, 3 or 4, not $PART"; exit 2 ;;
esac
python3 -m pytest -q -m gpu --durations=15 "${FILES[@]}" 2>&1 | tee "$LOG/suite$PART.log" | tail -30
