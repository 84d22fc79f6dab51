#!/usr/bin/env bash
# GPU (H200): the linear_cross_entropy type (#19), step by step, logs and JSON under LOGDIR (default $OUT).
#
#   bash scripts/gpu_lce.sh [LOGDIR] [STEP ...]     # default: every step, in this order
#
# Steps (each fits one 10-minute device command; minutes as measured on an H200 on 2026-11-24, bench with --quick):
#   liger     pip install --no-deps .whl/liger_kernel-0.8.5-py3-none-any.whl (the Liger baseline)      <1 min
#   sweep     scripts/sweep_tunables.py --compare: the TMA variant's settings against the pointer kernel and
#             torch.compile, interleaved rounds, at TinyLlama B4 and B1 S2048 (N 8192 and 2048)       ~4 min
#   bench     bench.py on the starter: the five stages at the GPU shapes, then time and peak memory
#             at N=8192 H=2048 V=32000 fp16 (TinyLlama B4 S2048) against eager and torch.compile  ~2-4 min
#   compare   scripts/lce_compare.py: time and peak memory of kernel, eager, torch.compile and Liger at
#             TinyLlama B1/B4 S2048 (H2048 V32000) and Qwen2-1.5B B1/B4 S2048 (H1536 V151936), fp16  ~2.5 min
#   profile   profile.py --with-loss on HF TinyLlama B1 S2048 fp16: the LM head + loss as the type   ~20 s
#   verify    verify.py --types linear_cross_entropy on HF TinyLlama and Qwen2-1.5B (B1 S2048 fp16, no
#             timing): the loss through the fused head against the original's                    ~40 s
set -uo pipefail
LOG=${1:-${OUT:?usage: gpu_lce.sh [LOGDIR] [STEP ...] (or set OUT)}}
[ $# -gt 0 ] && shift
mkdir -p "$LOG"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(liger bench compare profile verify)
HF=(--module transformers --class-name AutoModelForCausalLM --dtype fp16 --device cuda)

for step in "${STEPS[@]}"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    liger)
      python3 -m pip install --no-deps .whl/liger_kernel-0.8.5-py3-none-any.whl 2>&1 | tail -2
      python3 -c "import liger_kernel.transformers.functional as f; print('liger', f.liger_fused_linear_cross_entropy)" ;;
    sweep)
      for shape in N=8192,H=2048,V=32000 N=2048,H=2048,V=32000; do
        python3 scripts/sweep_tunables.py kernels/linear_cross_entropy.py --shape "$shape" --rounds 2 \
          --compare "VARIANT='pointers'" --compare FLATTEN=True --compare NUM_STAGES=4 --compare BLOCK_N=128 2>&1 \
          | tee -a "$LOG/sweep.log" | tail -14
      done ;;
    bench)
      python3 bench.py kernels/linear_cross_entropy.py --device cuda --timeout 540 --no-log --json "$LOG/bench.json" 2>&1 \
        | tee "$LOG/bench.log" | tail -32 ;;
    compare)
      python3 scripts/lce_compare.py --json "$LOG/compare.json" 2>&1 | tee "$LOG/compare.log" ;;
    profile)
      python3 profile.py "${HF[@]}" --config benchmarks/hf/tinyllama --input-shape 1,2048 --with-loss \
        --output-dir "$LOG/profile" 2>&1 | tee "$LOG/profile.log" | tail -25 ;;
    verify)
      for model in tinyllama qwen2-1.5b; do
        python3 verify.py "${HF[@]}" --config "benchmarks/hf/$model" --input-shape 1,2048 --checks 1 \
          --types linear_cross_entropy --no-timing --report "$LOG/verify_$model.json" 2>&1 \
          | tee "$LOG/verify_$model.log" | tail -12
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
