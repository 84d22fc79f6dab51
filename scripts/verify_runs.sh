#!/usr/bin/env bash
# GPU: verify.py --compile --cuda-graph on HF configs of benchmarks/hf/, run after run, each a fresh process with its
# wall time; one log per run and one line per run (wall, kept sets, speedups) in LOGDIR/walls.txt. Stops starting
# runs when fewer than 100 s are left of BUDGET seconds (default 570: one 10-minute device command). SHAPE sets the
# input shape (default 1,2048); RUN_S caps one run (default: what is left). Each run's steps (verify's steps_s) go
# into walls.txt too. A run that outlives its time is stopped with SIGABRT: Python's fault handler writes every
# thread's stack into its log, and the processes then running go to TAG.ps.
#
#   bash scripts/verify_runs.sh LOGDIR "EXTRA FLAGS" TAG:CONFIG [TAG:CONFIG ...]
#   bash scripts/verify_runs.sh $OUT "" tl1:tinyllama tl2:tinyllama neox1:pythia-410m
#   SHAPE=1,8192 BUDGET=590 bash scripts/verify_runs.sh $OUT "" gemma:gemma2-2b
set -uo pipefail
LOG=${1:?usage: verify_runs.sh LOGDIR "EXTRA FLAGS" TAG:CONFIG ...}
FLAGS=${2-}
shift 2 || { echo "usage: verify_runs.sh LOGDIR \"EXTRA FLAGS\" TAG:CONFIG ..."; exit 2; }
mkdir -p "$LOG"
T0=$(date +%s)
BUDGET=${BUDGET:-570}
SHAPE=${SHAPE:-1,2048}
ulimit -c 0  # an aborted run leaves its stacks in its log, no core file
for spec in "$@"; do
  tag=${spec%%:*}
  cfg=${spec#*:}
  left=$((BUDGET - ($(date +%s) - T0)))
  if [ "$left" -le 100 ]; then
    echo "$tag: not run, ${left}s left" | tee -a "$LOG/walls.txt"
    continue
  fi
  limit=$left
  [ -n "${RUN_S:-}" ] && [ "$RUN_S" -lt "$left" ] && limit=$RUN_S
  s=$(date +%s)
  (sleep $((limit - 2)) && ps -eo pid,ppid,pgid,stat,etime,args --forest > "$LOG/$tag.ps") &
  watch=$!
  # shellcheck disable=SC2086  # FLAGS is a list of flags
  PYTHONFAULTHANDLER=1 timeout -s ABRT -k 10 "$limit" \
    python3 verify.py --module transformers --class-name AutoModelForCausalLM --config "benchmarks/hf/$cfg" \
    --input-shape "$SHAPE" --compile --cuda-graph $FLAGS \
    --report "/tmp/verify_$tag.json" > "$LOG/$tag.log" 2>&1
  rc=$?
  kill "$watch" 2>/dev/null
  python3 -c "import json, sys; print('$tag steps:', json.load(open(sys.argv[1])).get('steps_s'))" \
    "/tmp/verify_$tag.json" >> "$LOG/walls.txt" 2>/dev/null
  echo "$tag $cfg rc=$rc wall=$(($(date +%s) - s))s $(grep -E '^(swapped_types|pruned|compiled_types|pruned_compiled|graph_speedup_vs_eager|compiled_speedup_vs_compile|compiled_graph_speedup_vs_compile_graph):' "$LOG/$tag.log" | tr '\n' ' ')" | tee -a "$LOG/walls.txt"
done
