#!/usr/bin/env bash
# fp32_gemm v3 candidates (FK_PB=1 with fewer spills; FK_VCH=16 with FK_RING=2), not yet run on a GPU.
# Run from the repository root on the H200. Correctness first, then racecheck, then timing.
set -euo pipefail
PY=.venv/bin/python
# 1. GPU tests: defaults, then each candidate setting (the harness passes the defines to fp32_gemm)
$PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "verify_attn and fp32"
KDTREE_TEST_DEFINES="fp32_gemm:FK_PB=1" $PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "verify_attn and fp32"
KDTREE_TEST_DEFINES="fp32_gemm:FK_VCH=16,FK_RING=2,FK_PB=1" $PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "verify_attn and fp32"
KDTREE_TEST_DEFINES="fp32_gemm:FK_VCH=16,FK_RING=2" $PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "verify_attn and fp32"
# 2. racecheck over the forced-split cases (multi-tile splits, empty splits, direct writes)
for d in "FK_PB=1" "FK_VCH=16,FK_RING=2,FK_PB=1" "FK_VCH=16,FK_RING=2"; do
  KDTREE_TEST_DEFINES="fp32_gemm:$d" compute-sanitizer --tool racecheck --error-exitcode 1 \
    $PY -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "fp32_gemm and forced_splits"
done
# 3. timing (graph replay, warm L2; bench() fp32 branch extended with the v3 runs, see NOTES)
$PY tests/test_cuda_kernels.py --bench
