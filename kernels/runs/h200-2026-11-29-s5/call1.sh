#!/usr/bin/env bash
# Session 5, call 1: fp32_dmma (FP64-tensor-core scores + FFMA P.V, warp-specialised) first run.
# Correctness first: a smoke run, the GPU tests of every fp32 kernel (fp32_gemm's merge now comes
# from attn_common's merge_row_batched), then the A/B timing against fp32_gemm (fd_time.py), then
# the four sanitizers over fp32_dmma's forced-split tests.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s5
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el smoke; timeout 90 python3 $D/fd_smoke.py > "$OUT/smoke.log" 2>&1; echo "rc=$?"; tail -8 "$OUT/smoke.log"
el tests; timeout 200 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32" > "$OUT/tests-fp32.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/tests-fp32.log"
el fd_time; timeout 150 python3 $D/fd_time.py > "$OUT/fd_time.log" 2>&1; echo "rc=$?"; tail -12 "$OUT/fd_time.log"
for tool in racecheck synccheck memcheck initcheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_dmma and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call1.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call1.tgz -delete
