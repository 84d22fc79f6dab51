#!/usr/bin/env bash
# GPU (H200): issue #19's rope_attention (RoPE + GQA attention as one kernel), logs and JSON under $OUT.
#
#   OUT=/some/dir bash scripts/gpu_ropeattn.sh [STEP ...]     # default: bench sweep; about 7 minutes in all
#
# Steps (each under its own time limit, so that the whole stays within 8 minutes):
#   bench   bench.py on kernels/rope_attention.py, fp16: the five stages at the registry's shapes (TinyLlama,
#           Llama-3-8B, Qwen2-1.5B attention at B 1..4, S 2048) in fp16/bf16/fp32, then timing at TinyLlama's
#           shape (B1 Hq32 Hkv4 S2048 D64, causal) against eager and torch.compile of the reference   <= 4 min
#   sweep   scripts/ropeattn_sweep.py: at each model shape the file's defaults against eager, torch.compile,
#           SDPA with RoPE done separately (sdpa_gqa+rope: issue #19's yardstick), our rotary starter + SDPA,
#           SDPA alone and cuDNN alone on pre-rotated q/k; at TinyLlama's shape also 23 tunable configs
#           (VARIANT, BLOCK_M x BLOCK_N, warps, stages)                                            <= 4 min
# Look for: bench "status: pass" and its speedup_vs_pytorch / speedup_vs_compile; in the sweep, x_yardstick >= 1.0
# on every shape (kernel rows), and the best config against cudnn_only (the attention alone, on Hopper).
set -uo pipefail
OUT=${OUT:?set OUT to the directory for logs}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(bench sweep)
for step in "${STEPS[@]}"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    bench)
      timeout 240 "$PY" bench.py kernels/rope_attention.py --device cuda --dtype fp16 --no-log \
        --json "$OUT/bench_rope_attention.json" 2>&1 | tee "$OUT/bench.log" | tail -25 ;;
    sweep)
      timeout 250 "$PY" scripts/ropeattn_sweep.py --json "$OUT/ropeattn_sweep.json" 2>&1 | tee "$OUT/sweep.log" ;;
    *) echo "unknown step $step (bench, sweep)"; exit 2 ;;
  esac
done
echo "=== done $(date -u +%H:%M:%S)"
