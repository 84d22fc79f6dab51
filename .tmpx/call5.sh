#!/usr/bin/env bash
# Liger columns for add_rmsnorm, add_layernorm, linear_cross_entropy; add_rmsnorm ELEMENTS_PER_WARP 512 vs 1024.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl_extra/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
python3 -c "import liger_kernel, torch, triton; print('liger ok', torch.__version__, triton.__version__)"
echo "=== shapes new $(date -u +%T)"
timeout 200 python3 scripts/shape_table.py add_rmsnorm add_layernorm --rounds 3 --json $OUT/shapes_addnorm.json 2>&1 | grep -v Warn
echo "=== shapes old EPW 512 $(date -u +%T)"
cp kernels/add_rmsnorm.py /tmp/new.py; sed -i 's/^ELEMENTS_PER_WARP = 1024 /ELEMENTS_PER_WARP = 512 /' kernels/add_rmsnorm.py
timeout 100 python3 scripts/shape_table.py add_rmsnorm --rounds 3 --json $OUT/shapes_addrms_epw512.json 2>&1 | grep -v Warn
cp /tmp/new.py kernels/add_rmsnorm.py
echo "=== lce $(date -u +%T)"
timeout 220 python3 scripts/lce_compare.py --json $OUT/lce_liger.json 2>&1 | grep -v Warn
echo "=== done $(date -u +%T)"
