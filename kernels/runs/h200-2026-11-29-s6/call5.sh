#!/usr/bin/env bash
# Session 6, call 5: fp32_bf16x3 version 3 (kv split once per block into shared memory by the O warps, both MMAs read the pieces by ldmatrix; the softmax moved to the S warps). Its GPU tests
# (every case and seed, forced splits, graph capture), then the A/B against fp32_dmma at the timing
# shape with its FX_DIAG knobs (s5's fd_ab.py, one process, outputs poisoned and checked against
# float64), then racecheck / synccheck over its forced-split tests.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
el tests; timeout 200 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; grep -E "passed|failed|Error|error" "$OUT/tests.log" | tail -5
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3", null, {"FX_DIAG": 1}], ["fp32_bf16x3", null, {"FX_DIAG": 2}]]'
el fd_ab; FD_JSON=fx_ab.json timeout 150 python3 kernels/runs/h200-2026-11-29-s5/fd_ab.py > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -8 "$OUT/fx_ab.log"; grep "round 0" "$OUT/fx_ab.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call5.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call5.tgz -delete
