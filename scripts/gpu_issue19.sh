#!/usr/bin/env bash
# GPU (H200): what issue 19 still asks the GPU for, step by step, logs and JSON under LOGDIR.
#
#   bash scripts/gpu_issue19.sh LOGDIR [STEP ...]     # default: every step, in this order
#
# Steps (each fits one 10-minute device command; minutes estimated):
#   suite            bench.py --suite for the five fused types against eager, torch.compile and Liger (Liger from
#                    .whl_extra/, installed by gpu_session.sh): their rows in benchmarks/starters.json and
#                    BENCHMARKS.md's starter section, both copied to LOGDIR to bring back        ~5 min
#   profile-gpt2     profile.py on HF GPT-2 medium (B1 S1024 fp16): linear_gelu's share of the GPU time  ~1 min
#   profile-llama    profile.py on HF TinyLlama (B1 S2048 fp16, rope_attention opted in, with the loss) ~1 min
set -uo pipefail
LOG=${1:?usage: gpu_issue19.sh LOGDIR [STEP ...]}
shift
mkdir -p "$LOG"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(suite profile-gpt2 profile-llama)
FUSED=add_rmsnorm,add_layernorm,rope_attention,linear_cross_entropy,linear_gelu
HF=(--module transformers --class-name AutoModelForCausalLM --dtype float16)

profile() {  # NAME ARGS...: profile.py into LOG/profile_NAME/, the ranked types printed
  local name=$1
  shift
  timeout -k 5 300 python3 profile.py "${HF[@]}" "$@" --output-dir "$LOG/profile_$name" 2>&1 \
    | tee "$LOG/profile_$name.log" | tail -30
}

for step in "${STEPS[@]}"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    suite)
      python3 -c "import liger_kernel" 2>/dev/null || echo "Liger not installed: its columns stay empty"
      timeout -k 5 560 python3 bench.py --suite --types "$FUSED" 2>&1 | tee "$LOG/suite.log" | tail -30
      cp benchmarks/starters.json BENCHMARKS.md "$LOG/" ;;
    profile-gpt2) profile gpt2 --config benchmarks/hf/gpt2-medium --input-shape 1,1024 ;;
    profile-llama) profile llama --config benchmarks/hf/tinyllama --input-shape 1,2048 --types rope_attention --with-loss ;;
    *) echo "unknown step $step" ;;
  esac
done
