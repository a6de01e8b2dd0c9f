#!/usr/bin/env bash
# Session 7, call 5: v7 = v6 with eight score warps (4 dim quarters x 2 n8 tiles, 512 threads; FX_SKH=2)
# against v6's four (FX_SKH=1) and fp32_dmma; GPU tests, FX_DIAG 1/2, racecheck and synccheck.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s7
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 90 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/tests.log"
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3_skh1", null, {"FX_SKH": 1}], ["fp32_bf16x3", null, {"FX_DIAG": 1}], ["fp32_bf16x3", null, {"FX_DIAG": 2}]]'
el ab; FD_JSON=fx_ab.json timeout 150 python3 $D/fx_ab.py > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -7 "$OUT/fx_ab.log"; grep "round 0" "$OUT/fx_ab.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 90 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call5.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call5.tgz -delete
