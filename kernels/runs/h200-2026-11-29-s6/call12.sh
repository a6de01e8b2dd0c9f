#!/usr/bin/env bash
# Session 6, call 12: fp32_bf16x3 as committed after call 11 (v3 with the FIN mbarrier; its SASS is
# that of call 11's generated file, sm_90 and sm_120): its GPU tests and the four sanitizers over its
# forced-split tests.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 60 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/tests.log"
for tool in memcheck initcheck synccheck racecheck; do
  el "$tool"; timeout 70 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call12.tgz *.log && find . -maxdepth 1 -type f ! -name call12.tgz -delete
