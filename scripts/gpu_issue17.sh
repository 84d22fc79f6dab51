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
#   descriptors           the TMA starters (fused_mlp, matmul, linear_cross_entropy, flash_attention) with DESCRIPTORS
#                         "device" against "host": GPU tests (tests/test_descriptors.py), bench.py on each,
#                         kernel time in interleaved rounds at TinyLlama's shapes, host us per call  ~8 min
#   MODEL-MODE            verify.py --compile --cuda-graph --deploy MODE on MODEL, B1 fp16: the eight
#                         timing rows, the prune decided in MODE                   eager ~3, compile* ~8 min
#                         MODEL: tinyllama (S2048), mistral (S2048), qwen2 (S1024), from benchmarks/hf/
#                         MODE: eager | graph | compile | compile_graph, or several joined by + (the eager and
#                         the compiled ones each keep their own types; eager+graph+compile+compile_graph, what
#                         verify.py does by default: 6-7.5 min in Session 16; with rope_attention traced under
#                         compile, 2026-11-25 at 335bdda (the compiled prune compiles each model once): tinyllama
#                         9.2 min, mistral 7.4, qwen2 2.8 + 8.6 as two steps; a model that does not fit one call
#                         runs as two steps, MODEL-eager+graph and MODEL-compile+compile_graph, each in its own
#                         call: the table marks a target whose mode a report's prune did not time)
#   MODEL-MODE-device     the same with the TMA starters' descriptors made on the device (LOGDIR/kernels_device)
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

TMA_TYPES=(fused_mlp matmul linear_cross_entropy flash_attention)

device_kernels() {  # the TMA starters with DESCRIPTORS = "device", as verify.py's --kernels directory
  mkdir -p "$LOG/kernels_device"
  for t in "${TMA_TYPES[@]}"; do
    sed 's/^DESCRIPTORS = "host"/DESCRIPTORS = "device"/' "kernels/$t.py" > "$LOG/kernels_device/$t.py"
    grep -q '^DESCRIPTORS = "device"' "$LOG/kernels_device/$t.py" || echo "kernels/$t.py: no DESCRIPTORS line"
  done
}

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
    descriptors)
      python3 -m pytest -q -m gpu tests/test_descriptors.py 2>&1 | tee "$LOG/descriptors_tests.log" | tail -8
      device_kernels
      for t in "${TMA_TYPES[@]}"; do  # the five stages and the timing, as the loop would bench the device variant
        python3 bench.py "$LOG/kernels_device/$t.py" --no-log --json "$LOG/bench_device_$t.json" 2>&1 \
          | tee "$LOG/bench_device_$t.log" | tail -4
      done
      python3 scripts/sweep_tunables.py kernels/fused_mlp.py --shape T=2048,H=2048,I=5632 --rounds 3 \
        --compare "DESCRIPTORS='device'" 2>&1 | tee "$LOG/descriptors_fused_mlp.log" | tail -6
      python3 scripts/sweep_tunables.py kernels/matmul.py --shape M=2048,N=2048,K=2048 --rounds 3 \
        --compare "VARIANT='tma'" --compare "VARIANT='tma',DESCRIPTORS='device'" 2>&1 \
        | tee "$LOG/descriptors_matmul.log" | tail -6
      python3 scripts/sweep_tunables.py kernels/linear_cross_entropy.py --shape N=2048,H=2048,V=32000 --rounds 3 \
        --compare "DESCRIPTORS='device'" 2>&1 | tee "$LOG/descriptors_lce.log" | tail -6
      python3 scripts/sweep_tunables.py kernels/flash_attention.py --rounds 3 --compare "VARIANT='tma'" \
        --compare "VARIANT='tma',DESCRIPTORS='device'" 2>&1 | tee "$LOG/descriptors_flash.log" | tail -6
      for where in host device; do
        python3 scripts/launch_overhead.py --types fused_mlp,matmul,linear_cross_entropy,flash_attention \
          --set "DESCRIPTORS='$where'" --set "VARIANT='tma'" --json "$LOG/launch_$where.json" 2>&1 \
          | tee "$LOG/launch_$where.log"
      done ;;
    table)
      table | tee "$LOG/table.txt" ;;
    *-*)
      model=${step%%-*} rest=${step#*-}
      mode=${rest%%-*} kernels=() tag=$mode
      if [ "$rest" != "$mode" ]; then  # MODEL-MODE-device
        device_kernels
        kernels=(--kernels "$LOG/kernels_device") tag=${mode}_device
      fi
      python3 verify.py --module transformers --class-name AutoModelForCausalLM --config "${CONFIG[$model]}" \
        --input-shape "1,${SEQ[$model]}" --dtype float16 --compile --cuda-graph --deploy "${mode//+/,}" "${kernels[@]}" \
        --report "$LOG/verify_${model}_${tag}.json" 2>&1 | tee "$LOG/verify_${model}_${tag}.log" | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
