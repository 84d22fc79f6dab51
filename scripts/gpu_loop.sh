#!/usr/bin/env bash
# GPU session: the loop's rate and its recovery from a detuned starter. The builtin agent starts from
# kernels/rmsnorm.py with its worst tunables (looped, 512-wide chunks, one warp, one row per program)
# in a fresh repository copy, for N experiments (default 30). Results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; N=${1:-30}; SRC=$(pwd)
rm -rf /tmp/ak && mkdir -p /tmp/ak/kernels
cp -r autokernel reference.py bench.py orchestrate.py program.md pyproject.toml kernel.py /tmp/ak/
cd /tmp/ak
sed -e 's/^VARIANT = .*/VARIANT = "looped"/' -e 's/^CHUNK = .*/CHUNK = 512/' -e 's/^NUM_WARPS = .*/NUM_WARPS = 1/' \
    -e 's/^ROWS_PER_PROGRAM = .*/ROWS_PER_PROGRAM = 1/' "$SRC/kernels/rmsnorm.py" > kernels/rmsnorm_detuned.py
grep -E "^(VARIANT|CHUNK|NUM_WARPS|ROWS_PER_PROGRAM) =" kernels/rmsnorm_detuned.py
printf 'workspace/\nresults.tsv\nprogress.png\n*.lock\n__pycache__/\n' > .gitignore
git init -q && git add -A && git -c user.name=setup -c user.email=setup@localhost commit -qm "fresh project"
start=$(date +%s)
timeout "${2:-280}" python3 orchestrate.py run --kernel kernels/rmsnorm_detuned.py --tag rate \
  --max-experiments "$N" --max-reverts 1000 --target-speedup 1000 --target-pct-peak 100 > "$OUT/loop.txt" 2>&1
tail -3 "$OUT/loop.txt"
end=$(date +%s)
python3 orchestrate.py report 2>&1 | tail -15
cp results.tsv "$OUT/loop_results.tsv"; git log --oneline | head -40 > "$OUT/loop_gitlog.txt"
rows=$(($(wc -l < results.tsv) - 1))
echo "loop: $rows experiments in $((end - start)) s = $((rows * 3600 / (end - start + 1))) per hour"
