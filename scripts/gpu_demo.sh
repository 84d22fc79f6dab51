#!/usr/bin/env bash
# GPU session: `python orchestrate.py demo`, the README's first command, on a fresh copy of the project (a git
# repository of its own in /tmp/demo), in a process session that outlives the device tool's 10-minute commands.
#   bash scripts/gpu_demo.sh start 0.1     # the demo with --hours 0.1
#   bash scripts/gpu_demo.sh poll 540      # wait up to 540 s for it, then collect under $OUT (demo.tgz, progress.png)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; DIR=/tmp/demo; BG=/tmp/demo-out
STEP=${1:-start}; ARG=${2:-0.1}
if [ "$STEP" = start ]; then
  rm -rf "$BG" && mkdir -p "$BG"
  bash scripts/fresh_project.sh "$DIR" && cd "$DIR"
  setsid nohup bash -c "python3 orchestrate.py demo --device cuda --hours $ARG > $BG/demo.txt 2>&1; \
    cp results.tsv progress.png $BG/ 2>/dev/null; tar czf $BG/workspace.tgz workspace; \
    git log --oneline --all > $BG/gitlog.txt; touch $BG/done" < /dev/null > /dev/null 2>&1 &
  sleep 5; cat "$BG/demo.txt"; exit 0
fi
for _ in $(seq 1 "$ARG"); do [ -e "$BG/done" ] && break; sleep 1; done
tail -40 "$BG/demo.txt"
tar czf "$OUT/demo.tgz" -C "$BG" . 2>/dev/null; cp "$BG/progress.png" "$OUT/" 2>/dev/null
[ -e "$BG/done" ] && echo "demo done"
exit 0
