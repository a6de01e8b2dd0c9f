#!/usr/bin/env bash
# Session 7, call 3: fp32_bf16x3 v6 (v5 with the softmax moved to the O warps, the S warps only MMAs, sS double
# buffered; the pieces kernel with all loads in flight first): GPU tests, A/B against fp32_dmma (with
# the FX_DIAG knobs beside it), then racecheck and synccheck over its forced-split tests.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s7
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 90 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -15 "$OUT/tests.log"
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3", null, {"FX_DIAG": 1}], ["fp32_bf16x3", null, {"FX_DIAG": 2}]]'
el ab; FD_JSON=fx_ab.json timeout 150 python3 kernels/runs/h200-2026-11-29-s5/fd_ab.py > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -7 "$OUT/fx_ab.log"; grep "round 0" "$OUT/fx_ab.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 90 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in '^verify_attn_fp32_bf16x3$' '_pieces$' '_bf16x3_merge$'; do
  el "ncu $k"; timeout 60 "$NCU" --clock-control none -k "regex:$k" -s 2 -c 1 --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active python3 kernels/runs/h200-2026-11-29-s6/fx_once.py 2>&1 | grep -E "gpu__time|hmma|issue_active"
done
el done
cd "$OUT" && tar czf call3.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call3.tgz -delete
