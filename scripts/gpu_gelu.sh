#!/usr/bin/env bash
# GPU (H200): issue 19's linear_gelu type (a GELU MLP's up-projection + bias + GELU as one GEMM), step by step, logs
# and JSON under OUT. Each step runs under its own timeout; the five default steps together stay under 10 minutes.
#
#   bash scripts/gpu_gelu.sh [OUT] [STEP ...]     # OUT defaults to $OUT; default steps: all five
#
# Steps (timeout; nothing measured yet):
#   tests    the type's GPU tests: the grouped, persistent and TMA variants through the harness (quick), a compiled
#            HF GPT-2 running the kernel from Inductor's code, a TMA-sized call under torch.compile       (130 s)
#   bench    bench.py on kernels/linear_gelu.py: the five stages with the full GPU sweep (fp16, bf16, fp32), then
#            the timing row at the bench shape (GPT-2 medium, T=4096, fp16) against eager and torch.compile  (60 s)
#   shapes   scripts/shape_table.py: the starter at every shape of the entry (GPT-2 small..xl, BERT, Pythia-1b,
#            Phi-2; fp16) against eager and torch.compile (Liger has no GEMM + GELU), two rounds          (150 s)
#   sweep    scripts/sweep_tunables.py: each tunable moved one at a time from the defaults at GPT-2 medium's
#            1x1024 shape (T 1024, H 1024, I 4096, tanh), fp16                                                  (80 s)
#   verify   verify.py on benchmarks/hf/gpt2-medium, 1x1024 fp16, --compile --cuda-graph, linear_gelu alone
#            (--keep-all: no leave-one-out pass): the sites table shows transformer.h.N.mlp as linear_gelu    (160 s)
#   verify-all  the same with every type, pruned in compile_graph mode (not a default step)              (160 s)
set -uo pipefail
LOG=${1:-${OUT:?usage: gpu_gelu.sh OUT [STEP ...] (or set OUT)}}
shift || true
mkdir -p "$LOG"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(tests bench shapes sweep verify)
GPT2_MEDIUM=(--module transformers --class-name AutoModelForCausalLM --config benchmarks/hf/gpt2-medium
             --input-shape 1,1024 --dtype float16)
SHAPE="T=1024,H=1024,I=4096,approximate='tanh'"

verify() {  # NAME ARGS...: a verify.py run on GPT-2 medium, its report and log under LOG
  local name=$1
  shift
  timeout -k 5 160 python3 verify.py "${GPT2_MEDIUM[@]}" "$@" --report "$LOG/verify_$name.json" 2>&1 \
    | tee "$LOG/verify_$name.log" | tail -45
  python3 scripts/verify_summary.py "$LOG/verify_$name.json" --sites linear_gelu
}

for step in "${STEPS[@]}"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    tests)
      timeout -k 5 130 python3 -m pytest -q -m gpu tests/test_linear_gelu.py 2>&1 | tee "$LOG/tests.log" | tail -8 ;;
    bench)
      timeout -k 5 60 python3 bench.py kernels/linear_gelu.py --no-log --json "$LOG/bench.json" 2>&1 \
        | tee "$LOG/bench.log" | tail -40 ;;
    shapes)
      timeout -k 5 150 python3 scripts/shape_table.py linear_gelu --rounds 2 --json "$LOG/shapes.json" 2>&1 | tee "$LOG/shapes.log" ;;
    sweep)
      timeout -k 5 80 python3 scripts/sweep_tunables.py kernels/linear_gelu.py --rounds 1 --shape "$SHAPE" 2>&1 \
        | tee "$LOG/sweep.log" | tail -25 ;;
    verify) verify linear_gelu --compile --cuda-graph --types linear_gelu --keep-all ;;
    verify-all) verify all --compile --cuda-graph ;;
    *) echo "unknown step $step" ;;
  esac
done
