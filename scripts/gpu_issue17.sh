#!/usr/bin/env bash
# GPU (H200): issue 17's targets, step by step, logs and JSON reports under LOGDIR.
#
#   bash scripts/gpu_issue17.sh LOGDIR [STEP ...]     # default: every step, in this order
#
# Steps (each fits one 10-minute device command; minutes measured on nothing yet, estimated):
#   tests                 GPU tests of cheap launches and native compile (tests/test_launch.py,
#                         tests/test_optimize.py, the GPU tests of tests/test_verify.py)         ~4 min
#   starters              the harness on the three starters whose TMA checks changed (GPU starter tests) ~4 min
#   launch                scripts/launch_overhead.py: host us per call, kernel / fast / op      ~2 min
#   MODEL-MODE            verify.py --compile --cuda-graph --deploy MODE on MODEL, B1 fp16: the eight
#                         timing rows, the prune decided in MODE                   eager ~3, compile* ~8 min
#                         MODEL: tinyllama (S2048), mistral (S2048), qwen2 (S1024), from benchmarks/hf/
#                         MODE: eager | graph | compile | compile_graph
#   table                 the rows of every report in LOGDIR against the targets                  <1 min
set -uo pipefail
LOG=${1:?usage: gpu_issue17.sh LOGDIR [STEP ...]}
shift
mkdir -p "$LOG"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(tests starters launch tinyllama-eager tinyllama-compile_graph mistral-eager
                                 mistral-compile_graph qwen2-eager qwen2-compile_graph table)
declare -A CONFIG=([tinyllama]=benchmarks/hf/tinyllama [mistral]=benchmarks/hf/mistral-1b
                   [qwen2]=benchmarks/hf/qwen2-1.5b)
declare -A SEQ=([tinyllama]=2048 [mistral]=2048 [qwen2]=1024)

table() {
  python3 scripts/verify_summary.py "$LOG"/verify_*.json --targets
}

for step in "${STEPS[@]}"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    tests)
      python3 -m pytest -q -m gpu tests/test_launch.py tests/test_optimize.py tests/test_verify.py 2>&1 \
        | tee "$LOG/tests.log" | tail -15 ;;
    starters)
      python3 -m pytest -q -m gpu tests/test_starters.py -k "matmul or fused_mlp or flash_attention" 2>&1 \
        | tee "$LOG/starters.log" | tail -8 ;;
    launch)
      python3 scripts/launch_overhead.py --json "$LOG/launch.json" 2>&1 | tee "$LOG/launch.log" ;;
    table)
      table | tee "$LOG/table.txt" ;;
    *-*)
      model=${step%%-*} mode=${step#*-}
      python3 verify.py --module transformers --class-name AutoModelForCausalLM --config "${CONFIG[$model]}" \
        --input-shape "1,${SEQ[$model]}" --dtype float16 --compile --cuda-graph --deploy "$mode" \
        --report "$LOG/verify_${model}_${mode}.json" 2>&1 | tee "$LOG/verify_${model}_${mode}.log" | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
