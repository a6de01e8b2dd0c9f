#!/usr/bin/env bash
# Session 7, call 4: v6 with the pieces kernel widened (4 rows a block, 588 blocks at the timing shape):
# GPU tests, the A/B against fp32_dmma with FX_DIAG=3 (prologue loads only) and 4 (launches alone), so
# the fixed part (pieces + merge + launch gaps + prologue) is measured beside the whole.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
el tests; timeout 90 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/tests.log"
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3", null, {"FX_DIAG": 3}], ["fp32_bf16x3", null, {"FX_DIAG": 4}]]'
el ab; FD_JSON=fx_ab.json timeout 150 python3 kernels/runs/h200-2026-11-29-s5/fd_ab.py > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -5 "$OUT/fx_ab.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for cc in all none; do
  el "ncu pieces, cache-control $cc"; timeout 60 "$NCU" --clock-control none --cache-control $cc -k "regex:_pieces$" -s 2 -c 1 --metrics gpu__time_duration.sum python3 kernels/runs/h200-2026-11-29-s6/fx_once.py 2>&1 | grep -E "gpu__time"
done
el done
cd "$OUT" && tar czf call4.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call4.tgz -delete
