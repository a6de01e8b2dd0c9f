#!/usr/bin/env bash
# Session 7, call 1: fp32_bf16x3 v5 (kv and q split once by a pieces kernel, bulk copies into three
# K-piece slots, no split in the main kernel): its GPU tests, the A/B against fp32_dmma (FX_SW = 6 and
# the FX_DIAG knobs beside it), then racecheck and synccheck over its forced-split tests.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s7
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 90 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -15 "$OUT/tests.log"
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3_sw6", null, {"FX_SW": 6}], ["fp32_bf16x3", null, {"FX_DIAG": 1}], ["fp32_bf16x3", null, {"FX_DIAG": 2}]]'
el ab; FD_JSON=fx_ab.json timeout 150 python3 $D/fx_ab.py > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -7 "$OUT/fx_ab.log"; grep "round 0" "$OUT/fx_ab.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 90 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call1.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call1.tgz -delete
