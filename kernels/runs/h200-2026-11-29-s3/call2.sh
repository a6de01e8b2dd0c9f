#!/usr/bin/env bash
# Device call 2 (session 3): tb_sorted v3 and fp32_gemm on the H200 — probes, GPU tests (fresh seed,
# poisoned outputs; tree_build also with TB_FORCE_EXACT=1), racecheck of the two, timings side by side.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/kdtree_out}"; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
el eager; timeout 60 python3 kernels/runs/h200-2026-11-29-s3/eager.py > "$OUT/eager.log" 2>&1; head -4 "$OUT/eager.log"
el tb_profile; timeout 60 python3 kernels/runs/h200-2026-11-29-s3/tb_profile.py > "$OUT/tb_profile.log" 2>&1; tail -25 "$OUT/tb_profile.log"
el exact-path tests; KDTREE_TEST_DEFINES="tb_sorted:TB_FORCE_EXACT=1" timeout 90 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build" > "$OUT/tests-exact.log" 2>&1; tail -2 "$OUT/tests-exact.log"
el session; RACECHECK_K="${RACECHECK_K:-fp32_gemm and forced_splits or tb_sorted and bit_exact}" TEST_TIMEOUT=170 BENCH_TIMEOUT=200 RACECHECK_TIMEOUT=90 bash kernels/gpu_session.sh
el done
