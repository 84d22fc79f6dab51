#!/usr/bin/env bash
# GPU session: the shipped profiles, the plan's top three through the harness, and verify.py on a
# TinyLlama-shaped model. Logs and outputs under $OUT (see scripts/gpu_session.sh for the wheels).
set -uo pipefail
OUT=${OUT:-/tmp/out}
prof() {  # name, then profile.py arguments
  local name=$1; shift
  mkdir -p "$OUT/$name"
  python3 profile.py "$@" --dtype float16 --device cuda --output-dir "$OUT/$name" 2>&1 | tail -25
}
prof llama_compact_1x2048 --model models/llama.py --class-name LlamaModel --config compact --input-shape 1,2048
prof gpt2_1x1024 --model models/gpt2.py --class-name GPT2Model --input-shape 1,1024
prof bert_8x512 --model models/bert.py --class-name BertModel --input-shape 8,512
python3 extract.py --plan "$OUT/llama_compact_1x2048/plan.json" --top 3 --output-dir /tmp/top3 2>&1 | tail -5
for k in /tmp/top3/*.py; do
  python3 bench.py "$k" --no-log 2>&1 | grep -E "^kernel|stage|correctness|latency_us|speedup_vs|shape:|wall_s"
done
python3 verify.py --model models/llama.py --class-name LlamaModel --config tinyllama --input-shape 1,2048 \
  --dtype float16 --compile --json "$OUT/verify_all.json" 2>&1 | tail -40
python3 verify.py --model models/llama.py --class-name LlamaModel --config tinyllama --input-shape 1,2048 \
  --dtype float16 --types rmsnorm,rotary_embedding,fused_mlp,cross_entropy,softmax,layernorm \
  --json "$OUT/verify_no_matmul.json" 2>&1 | tail -25
