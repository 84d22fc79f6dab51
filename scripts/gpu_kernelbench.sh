#!/usr/bin/env bash
# KernelBench mode on a GPU, end to end: list, set up, evaluate, loop, score; prints the fast_p table.
#
#   KERNELBENCH_ROOT=/path/to/KernelBench bash scripts/gpu_kernelbench.sh
#
# From the repository root, on a machine with a CUDA GPU (an H200 is safest: the default sizes of some
# level-1 problems, e.g. 23_Softmax at 4096 x 393216 fp32, hold 6.4 GB per input and the harness keeps
# several inputs, outputs and float64 comparisons alive at once). Knobs (environment):
#   KB_PROBLEMS   problems to score (default: five level-1 problems with solutions in kernelbench/examples)
#   KB_LOOP=0     skip the three-experiment loop on level1/19_ReLU (in a throwaway copy of the project)
#   KB_OUT        where logs and JSON go (default workspace/kernelbench/gpu_run)
# Exits non-zero when a step of the tools fails or a shipped example solution does not pass.
set -euo pipefail

PY=${PYTHON:-python3}
: "${KERNELBENCH_ROOT:?set KERNELBENCH_ROOT to a KernelBench checkout (the folder holding KernelBench/level1)}"
export KERNELBENCH_ROOT
PROBLEMS=${KB_PROBLEMS:-"level1/1 level1/19 level1/21 level1/23 level1/36"}
OUT=${KB_OUT:-workspace/kernelbench/gpu_run}
mkdir -p "$OUT"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

step "environment"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || fail "no CUDA GPU visible"

step "list level1"
$PY -m kernelbench list level1 | tail -n 3 || fail "list"

step "setup $PROBLEMS (starters only; kernel.py is left alone)"
# shellcheck disable=SC2086
$PY -m kernelbench setup $PROBLEMS --no-kernel-py --force || fail "setup"

step "a starter as it is: must fail at the smoke stage with exit code 1, saying it is a skeleton"
set +e
$PY -m kernelbench eval workspace/kernels/kb_level1_19_ReLU.py --no-log > "$OUT/skeleton.log" 2>&1
rc=$?
set -e
tail -n 25 "$OUT/skeleton.log"
[ "$rc" = 1 ] && grep -q "ModelNew.forward is a skeleton" "$OUT/skeleton.log" || fail "skeleton eval (rc $rc)"

step "eval one example in KernelBench's own form (--problem), exit code 0"
$PY -m kernelbench eval kernelbench/examples/level1/19_ReLU.py --problem level1/19_ReLU --no-log \
    --json "$OUT/eval_19.json" | tail -n 22 || fail "eval of the ReLU example"

if [ "${KB_LOOP:-1}" != 0 ]; then
    step "the loop, unchanged, on level1/19_ReLU: 3 experiments with the builtin agent (throwaway copy)"
    COPY=$(mktemp -d)/project
    mkdir -p "$COPY"
    tar --exclude=./workspace --exclude=./.git --exclude=./results.tsv -cf - . | tar -xf - -C "$COPY"
    (
        cd "$COPY"
        $PY -m kernelbench setup level1/19_ReLU > /dev/null
        { cat kernelbench/examples/level1/19_ReLU.py
          echo 'KERNEL_TYPE = "kb/level1/19_ReLU"'
          echo 'TUNABLES = {"BLOCK_SIZE": [1024, 2048, 4096, 8192, 16384]}'; } > kernel.py
        git init -q -b main && git add -A
        git -c user.name=gpu -c user.email=gpu@localhost commit -qm "project with a ReLU ModelNew"
        $PY orchestrate.py run --kernel kernel.py --tag kbgpu --max-experiments 3 --dtype fp32
        cut -f1,4,7,8,9,13,19 results.tsv
    ) 2>&1 | tee "$OUT/loop.log" | tail -n 20
    grep -q "kb/level1/19_ReLU" "$OUT/loop.log" || fail "the loop on a KernelBench problem"
fi

step "score $PROBLEMS with kernelbench/examples (fresh JSON)"
rm -f "$OUT/score.json"
# shellcheck disable=SC2086
$PY -m kernelbench score --problems $PROBLEMS --solutions kernelbench/examples --json "$OUT/score.json" \
    --results "$OUT/results.tsv" --timeout 900 | tee "$OUT/score.log" || fail "score"

step "score again: every problem must be taken from the JSON (resume), none benched again"
# shellcheck disable=SC2086
$PY -m kernelbench score --problems $PROBLEMS --solutions kernelbench/examples --json "$OUT/score.json" \
    --results "$OUT/results.tsv" > "$OUT/rescore.log" || fail "rescore"
n=$(echo $PROBLEMS | wc -w)
[ "$(grep -c 'scored before' "$OUT/rescore.log")" = "$n" ] || fail "resume re-benched a problem"

step "GPU tests of the KernelBench mode"
$PY -m pytest -q -m gpu tests/test_kernelbench.py || fail "pytest -m gpu tests/test_kernelbench.py"

step "verdict"
$PY - "$OUT/score.json" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
bad = {k: r for k, r in data["problems"].items() if r["status"] != "pass"}
for key, r in bad.items():
    print(f"not passed: {key}: {r['status']} {r.get('reason', '')}")
print("fast_p:", json.dumps(data["last"]["fast_p"]))
sys.exit(1 if bad else 0)
EOF
echo "all steps passed; logs and JSON in $OUT"
