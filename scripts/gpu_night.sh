#!/usr/bin/env bash
# GPU session: a compressed night on a model, exactly as the README's pipeline runs it. Results under $OUT.
#   bash scripts/gpu_night.sh start 0.13     # fresh copy in /tmp/night, profile, extract --top 4, 0.13 h of loop
#   bash scripts/gpu_night.sh resume 0.13    # the same tag, 0.13 h more (repeat)
#   bash scripts/gpu_night.sh finish         # report --verify (verify.py --cuda-graph --against extracted: the
#                                            # loop's kernels, and in turns with the extracted), then the starters alone
#   bash scripts/gpu_night.sh background 0.33  # start, 0.33 h of loop and finish in a process session that outlives
#   bash scripts/gpu_night.sh poll 540       #   the device tool's 10-minute commands; poll waits up to 540 s for it
# MODEL_ARGS picks the model (default: models/llama.py at TinyLlama-1.1B's shape); for Hugging Face's class:
#   MODEL_ARGS="--module transformers --class-name AutoModelForCausalLM --config benchmarks/hf/tinyllama"
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; SRC=$(pwd); DIR=/tmp/night; BG=/tmp/night-out
MODEL_ARGS=${MODEL_ARGS:---model models/llama.py --class-name LlamaModel --config tinyllama}
STEP=${1:-start}; HOURS=${2:-0.13}
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
if [ "$STEP" = background ]; then
  rm -rf "$BG" && mkdir -p "$BG"
  OUT=$BG MODEL_ARGS="$MODEL_ARGS" setsid nohup bash "$0" all "$HOURS" > "$BG/night.txt" 2>&1 < /dev/null &
  sleep 5; cat "$BG/night.txt"; exit 0
fi
if [ "$STEP" = poll ]; then  # wait until the background night is done or $2 seconds have passed, then collect
  for _ in $(seq 1 "$HOURS"); do [ -e "$BG/done" ] && break; sleep 1; done
  tail -25 "$BG/night.txt"; grep -E "^  |: workspace/|warning|time by Amdahl|loop stopped|kept" "$BG/loop.txt" | tail -15
  tar czf "$OUT/night.tgz" -C "$BG" . 2>/dev/null; cp "$BG/progress.png" "$OUT/" 2>/dev/null
  [ -e "$BG/done" ] && echo "night done"; exit 0
fi
if [ "$STEP" = start ] || [ "$STEP" = all ]; then
  stamp start
  bash scripts/fresh_project.sh "$DIR" && cd "$DIR"
  # shellcheck disable=SC2086
  python3 profile.py $MODEL_ARGS --input-shape 1,2048 --dtype float16 2>&1 | tee "$OUT/profile.txt" | tail -20
  python3 extract.py --top 4 2>&1 | tee "$OUT/extract.txt"
fi
cd "$DIR" || exit 1
if [ "$STEP" = all ]; then
  stamp loop; python3 orchestrate.py run --tag night --hours "$HOURS" >> "$OUT/loop.txt" 2>&1
fi
if [ "$STEP" = start ] || [ "$STEP" = resume ]; then
  timeout 580 python3 orchestrate.py run --tag night --hours "$HOURS" >> "$OUT/loop.txt" 2>&1
  grep -E "^  |: workspace/|warning|time by Amdahl|loop stopped|done" "$OUT/loop.txt" | tail -30
fi
if [ "$STEP" = finish ] || [ "$STEP" = all ]; then
  stamp report --verify
  timeout 580 python3 orchestrate.py report --tag night --verify --png "$OUT/progress.png" 2>&1 | tee "$OUT/report.txt" \
    | tail -60
  # the starters the loop began from (the extracted files, no *_optimized.py), timed as the report's verify times
  stamp verify starters; rm -rf /tmp/starters && mkdir -p /tmp/starters
  cp workspace/kernels/[0-9]*.py /tmp/starters/ && cp workspace/plan.json /tmp/starters/ 2>/dev/null
  python3 -c "import json,shlex,sys; from autokernel.loop.report import verify_command; \
a = verify_command(json.load(open('workspace/plan.json')))[1:-2]; \
print(shlex.join(a[:-2] if a[-2:] == ['--against', 'extracted'] else a))" > /tmp/verify_args.txt
  # shellcheck disable=SC2046
  timeout 580 python3 $(cat /tmp/verify_args.txt) --kernels /tmp/starters --report "$OUT/verify_starters.json" \
    > "$OUT/verify_starters.txt" 2>&1; tail -25 "$OUT/verify_starters.txt"
  tar czf "$OUT/kernels.tgz" workspace/kernels workspace/plan.json 2>/dev/null
fi
cp results.tsv "$OUT/results.tsv" 2>/dev/null; cp workspace/*.json "$OUT/" 2>/dev/null
git log --oneline autokernel/night 2>/dev/null | head -80 > "$OUT/gitlog.txt"
[ "$STEP" = all ] && { stamp done; touch "$OUT/done"; }
exit 0
