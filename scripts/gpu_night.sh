#!/usr/bin/env bash
# GPU: a night as the README's pipeline runs it, on an HF config of benchmarks/hf/ at 1x2048 fp16, in a fresh copy
# of the project's working tree (/tmp/night): profile.py, extract.py, orchestrate.py run, orchestrate.py report
# --verify (verify.py in the plan's deploy mode, --against the extracted files). A night outlives one 10-minute
# device command: `start` runs it in the background and waits, `poll` waits again; call poll at once after each
# return (the machine is given back when idle, and the night with it). Logs, results.tsv, the report, verify.json,
# progress.png and the screens' logs (agent_logs.tgz) go to $OUT.
#
#   bash scripts/gpu_night.sh start HOURS CONFIG "PROFILE FLAGS" "EXTRACT FLAGS" ["RUN FLAGS"] [WAIT_S]
#   bash scripts/gpu_night.sh poll WAIT_S
#
#   bash scripts/gpu_night.sh start 0.333 tinyllama "--with-loss --deploy compile_graph" "--top 4"
#   bash scripts/gpu_night.sh start 0.15 pythia-410m "--deploy compile_graph --regions" "--top 1 --regions 2" \
#       "--kernel workspace/kernels/R*.py"          # the region kernels alone (the glob is the copy's)
set -uo pipefail
USAGE='usage: gpu_night.sh start HOURS CONFIG "PROFILE FLAGS" "EXTRACT FLAGS" ["RUN FLAGS"] [WAIT_S] | poll WAIT_S'
OUT=${OUT:-/tmp/out}
NIGHT=/tmp/night
mkdir -p "$OUT"

pipeline() {  # HOURS CONFIG PROFILE EXTRACT RUN, in the copy
  local hours=$1 cfg=$2 run_flags=() f
  set -x
  python3 profile.py --module transformers --class-name AutoModelForCausalLM --config "benchmarks/hf/$cfg" \
    --input-shape 1,2048 --dtype float16 $3 || return
  python3 extract.py $4 || return
  for f in $5; do run_flags+=($f); done  # word-split and glob-expand RUN FLAGS now, over what extract wrote
  python3 orchestrate.py run --tag night --hours "$hours" "${run_flags[@]}" || return
  python3 orchestrate.py report --tag night --verify
}

collect() {  # what the night has so far, into $OUT
  cp -f "$NIGHT.log" "$OUT/night.log" 2>/dev/null
  # the screens' figures (workspace/agent_logs), one file: at most 8 come back from a device command
  [ -d "$NIGHT/workspace/agent_logs" ] && tar -czf "$OUT/agent_logs.tgz" -C "$NIGHT/workspace" agent_logs
  for f in results.tsv progress.png workspace/verify.json workspace/plan.json workspace/profile.json; do
    [ -f "$NIGHT/$f" ] && cp -f "$NIGHT/$f" "$OUT/"
  done
  git -C "$NIGHT" log --oneline autokernel/night 2>/dev/null | head -200 > "$OUT/night_git_log.txt"
}

wait_for() {  # up to $1 seconds, printing the log's new lines now and then
  local until=$(($(date +%s) + $1))
  while [ "$(date +%s)" -lt "$until" ] && [ ! -f "$NIGHT.rc" ]; do sleep 10; done
  collect
  if [ -f "$NIGHT.rc" ]; then echo "night over: rc=$(cat "$NIGHT.rc")"; else echo "night still running"; fi
  tail -40 "$NIGHT.log"
}

case ${1:-} in
  start)
    [ $# -ge 5 ] || { echo "$USAGE"; exit 2; }
    rm -rf "$NIGHT" "$NIGHT.log" "$NIGHT.rc"
    # a copy of the working tree as it is (the device machine's .git may be older than the files it was sent)
    mkdir -p "$NIGHT" && tar -c --exclude=./.git --exclude=./.venv --exclude=./.whl \
      --exclude=./workspace --exclude=./results.tsv . | tar -x -C "$NIGHT"
    git -C "$NIGHT" init -q && git -C "$NIGHT" config user.name night && git -C "$NIGHT" config user.email \
      night@localhost && git -C "$NIGHT" add -A && git -C "$NIGHT" commit -qm "the project as sent" || exit
    wheels=$(ls .whl/*.whl 2>/dev/null)  # gitpython and its deps, where the image lacks them
    [ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $wheels
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
      git -C "$NIGHT" log -1 --oneline; } > "$OUT/env.txt" 2>&1
    # its own session, its output in the log: the device command returns while the night goes on
    setsid bash "$0" _night "$2" "$3" "$4" "$5" "${6:-}" > /dev/null 2>&1 < /dev/null &
    wait_for "${7:-570}"
    ;;
  _night)
    cd "$NIGHT" || exit
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
    export PYTHONPYCACHEPREFIX=/tmp/pycache
    pipeline "$2" "$3" "$4" "$5" "$6" > "$NIGHT.log" 2>&1
    echo $? > "$NIGHT.rc"
    ;;
  poll) wait_for "${2:-570}" ;;
  *) echo "$USAGE"; exit 2 ;;
esac
