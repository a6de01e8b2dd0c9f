#!/usr/bin/env bash
# Session 8, call 1: fp32_bf16x3 v7 (a softmax warp of its own between the score and the P.V warps,
# P written over the partials; the pieces, main and merge kernels launched as programmatic dependents):
# GPU tests; A/B against v6 and fp32_dmma with outputs compared bit for bit (v7 keeps v6's arithmetic
# order); FX_DIAG=4 (the launches alone) with and without PDL; the same at B=4 P=8192; the kernel
# timeline from the torch profiler; racecheck and synccheck over the forced-split tests.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s8
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -15 "$OUT/tests.log"
export AB_RUNS='[["v6", null, null], ["fp32_dmma", null, null], ["v7_plain", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3", null, {"FX_DIAG": 4}], ["v7_plain", null, {"FX_DIAG": 4}], ["v6", null, {"FX_DIAG": 4}]]'
el ab; AB_JSON=ab.json timeout 150 python3 $D/ab.py > "$OUT/ab.log" 2>&1; echo "rc=$?"; tail -9 "$OUT/ab.log"; grep "round 0" "$OUT/ab.log"
el prof; timeout 90 python3 $D/prof.py > "$OUT/prof.log" 2>&1; echo "rc=$?"; grep -v "^round" "$OUT/prof.log" | tail -40
export AB_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["v6", null, null]]'
el "ab B=4 P=8192"; AB_SHAPE=4,16,8192,16 AB_JSON=ab_b4.json timeout 120 python3 $D/ab.py > "$OUT/ab_b4.log" 2>&1; echo "rc=$?"; tail -5 "$OUT/ab_b4.log"; grep "round 0" "$OUT/ab_b4.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call1.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call1.tgz -delete
