#!/usr/bin/env bash
# GPU (H200): issue 19's residual add + norm types, step by step, logs and JSON under OUT.
#
#   bash scripts/gpu_addnorm.sh [OUT] [STEP ...]     # OUT defaults to $OUT; default steps: all but the last two
#
# Steps (each fits one 10-minute device command; minutes estimated, nothing measured yet):
#   tests            the GPU starter tests of the two types (five stages, full sweep, fp16/bf16/fp32)   ~2 min
#   bench            bench.py on kernels/add_rmsnorm.py and kernels/add_layernorm.py (fp16): the five stages
#                    and the timing row at the bench shape against eager and torch.compile             ~2 min
#   shapes           scripts/shape_table.py: both starters at every model shape of their entries (M 2048..16384,
#                    N 768..8192, fp16) against eager, torch.compile and Liger's fused add+RMSNorm
#                    (a column where Liger is installed and has it)                                      ~3 min
#   verify           verify.py on benchmarks/hf/tinyllama, 1x2048 fp16, --cuda-graph: every type, the sites
#                    table shows model.layers.N as add_rmsnorm and only the input norms + final norm as rmsnorm ~4 min
#   verify-compile   the same with --compile (torch.compile and compile + CUDA graph rows)               ~8 min
#   norms-compile    --types rmsnorm --keep-all: the norm alone under compile (what the add costs)      ~6 min
#   addnorm-compile  --types rmsnorm,add_rmsnorm --keep-all: the add fused back                          ~6 min
set -uo pipefail
LOG=${1:-${OUT:?usage: gpu_addnorm.sh OUT [STEP ...] (or set OUT)}}
shift || true
mkdir -p "$LOG"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(tests bench shapes verify verify-compile)
TINYLLAMA=(--module transformers --class-name AutoModelForCausalLM --config benchmarks/hf/tinyllama
           --input-shape 1,2048 --dtype float16 --cuda-graph)

verify() {  # NAME ARGS...: a verify.py run on TinyLlama, its report and log under LOG
  local name=$1
  shift
  python3 verify.py "${TINYLLAMA[@]}" "$@" --report "$LOG/verify_$name.json" 2>&1 \
    | tee "$LOG/verify_$name.log" | tail -45
  python3 scripts/verify_summary.py "$LOG/verify_$name.json"
}

for step in "${STEPS[@]}"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    tests)
      python3 -m pytest -q -m gpu tests/test_starters.py tests/test_cuda_backend.py -k "add_rmsnorm or add_layernorm" 2>&1 \
        | tee "$LOG/tests.log" | tail -8 ;;
    bench)
      for t in add_rmsnorm add_layernorm; do
        python3 bench.py "kernels/$t.py" --no-log --json "$LOG/bench_$t.json" 2>&1 | tee "$LOG/bench_$t.log" | tail -40
      done ;;
    shapes)
      python3 scripts/shape_table.py add_rmsnorm add_layernorm --json "$LOG/shapes.json" 2>&1 | tee "$LOG/shapes.log" ;;
    verify) verify all ;;
    verify-compile) verify all_compile --compile ;;
    norms-compile) verify rmsnorm_compile --compile --types rmsnorm --keep-all ;;
    addnorm-compile) verify addnorm_compile --compile --types rmsnorm,add_rmsnorm --keep-all ;;
    *) echo "unknown step $step" ;;
  esac
done
