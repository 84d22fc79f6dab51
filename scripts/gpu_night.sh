#!/usr/bin/env bash
# GPU session: a compressed night on a model, exactly as the README's pipeline runs it, in slices that fit
# the device tool's 10-minute commands (the loop resumes where it stopped). Results under $OUT.
#   bash scripts/gpu_night.sh start 0.13     # fresh copy in /tmp/night, profile, extract --top 4, 0.13 h of loop
#   bash scripts/gpu_night.sh resume 0.13    # the same tag, 0.13 h more (repeat)
#   bash scripts/gpu_night.sh finish         # verify.py --cuda-graph on the plan's model, then the report
# MODEL_ARGS picks the model (default: models/llama.py at TinyLlama-1.1B's shape); for Hugging Face's class:
#   MODEL_ARGS="--module transformers --class-name LlamaForCausalLM --config <dir of TinyLlama's config.json>"
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; SRC=$(pwd); DIR=/tmp/night
MODEL_ARGS=${MODEL_ARGS:---model models/llama.py --class-name LlamaModel --config tinyllama}
STEP=${1:-start}; HOURS=${2:-0.13}
if [ "$STEP" = start ]; then
  rm -rf "$DIR" && mkdir -p "$DIR"
  cp -r autokernel kernels models profiles benchmarks reference.py bench.py orchestrate.py profile.py extract.py \
    verify.py program.md pyproject.toml kernel.py .gitignore "$DIR"/
  cd "$DIR" && git init -q && git add -A && git -c user.name=setup -c user.email=setup@localhost commit -qm "fresh project"
  # shellcheck disable=SC2086
  python3 profile.py $MODEL_ARGS --input-shape 1,2048 --dtype float16 2>&1 | tee "$OUT/profile.txt" | tail -20
  python3 extract.py --top 4 2>&1 | tee "$OUT/extract.txt"
fi
cd "$DIR" || exit 1
if [ "$STEP" = start ] || [ "$STEP" = resume ]; then
  timeout 580 python3 orchestrate.py run --tag night --hours "$HOURS" >> "$OUT/loop.txt" 2>&1
  grep -E "^  |: workspace/|warning|time by Amdahl|loop stopped|done" "$OUT/loop.txt" | tail -30
fi
if [ "$STEP" = finish ]; then
  timeout 580 python3 orchestrate.py report --tag night --verify --png "$OUT/progress.png" 2>&1 | tee "$OUT/report.txt" \
    | tail -60
fi
cp results.tsv "$OUT/results.tsv" 2>/dev/null; cp workspace/*.json "$OUT/" 2>/dev/null
git log --oneline autokernel/night 2>/dev/null | head -60 > "$OUT/gitlog.txt"
