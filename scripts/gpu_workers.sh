#!/usr/bin/env bash
# GPU session (a host with 2 GPUs): the loop's experiment rate with one worker and with two (--gpus 0 vs
# --gpus 0,1), T seconds of budget each, on the same three starters in fresh repository copies.
#   bash scripts/gpu_workers.sh [T]     (results in $OUT/workers.tgz)
set -u; OUT=${OUT:-/tmp/out}
T=${1:-120}; SRC=$(pwd); X=$OUT/x; mkdir -p $X
nvidia-smi -L > $X/gpus.txt
run() {  # name gpus
  rm -rf /tmp/akw && mkdir -p /tmp/akw/kernels && cd /tmp/akw
  cp -r $SRC/autokernel $SRC/reference.py $SRC/bench.py $SRC/orchestrate.py $SRC/program.md $SRC/pyproject.toml $SRC/kernel.py .
  cp $SRC/kernels/rmsnorm.py $SRC/kernels/softmax.py $SRC/kernels/layernorm.py kernels/
  printf 'workspace/\nresults.tsv\nprogress.png\n*.lock\n__pycache__/\n' > .gitignore
  git init -q && git add -A && git -c user.name=setup -c user.email=setup@localhost commit -qm "fresh project"
  local start=$(date +%s)
  timeout $((T + 90)) python3 orchestrate.py run --gpus $2 --kernel kernels/rmsnorm.py --kernel kernels/softmax.py \
    --kernel kernels/layernorm.py --tag $1 --hours $(python3 -c "print($T/3600)") --max-reverts 1000 \
    --target-speedup 1000 --target-pct-peak 100 --per-kernel-minutes 60 > $X/$1.txt 2>&1
  local end=$(date +%s)
  python3 orchestrate.py status --tag $1 > $X/$1_status.txt 2>&1
  cp results.tsv $X/$1_results.tsv
  local rows=$(($(wc -l < results.tsv) - 1))
  echo "$1: gpus $2: $rows experiments in $((end - start)) s wall (budget $T s) = $((rows * 3600 / T)) per hour of budget" | tee -a $X/summary.txt
  cd $SRC
}
run one 0
run two 0,1
tar czf $OUT/workers.tgz -C $OUT x && rm -rf $X
