#!/usr/bin/env bash
# Session 5, call 2: where fp32_dmma's ~4.8 us a sub-tile goes. The S-warp loop alone (dmma_cvt.py:
# fp32 operands + F2F as in the kernel, fp64 operands, registers only; 4 or 8 warps an SM; one or two
# accumulator sets), then the kernel's knobs A/B (fd_ab.py: FD_DIAG=1 no score MMAs, =2 no P.V FMAs;
# FD_ACC2 two accumulator sets; FD_UNROLL), the GPU tests at the default (every thread arrives on the
# mbarriers now) and with FD_ACC2=1, and racecheck / synccheck of the default.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s5
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el probe; timeout 90 python3 $D/dmma_cvt.py > "$OUT/dmma_cvt.log" 2>&1; echo "rc=$?"; cat "$OUT/dmma_cvt.log" | tail -12
export FD_RUNS='[["fp32_gemm", null, null], ["fp32_dmma", null, null], ["fp32_dmma", null, {"FD_ACC2": 1}],
 ["fp32_dmma", null, {"FD_ACC2": 1, "FD_UNROLL": 2}], ["fp32_dmma", null, {"FD_UNROLL": 1}],
 ["fp32_dmma", null, {"FD_DIAG": 1}], ["fp32_dmma", null, {"FD_DIAG": 2}], ["fp32_dmma", null, {"FD_DIAG": 2, "FD_ACC2": 1}]]'
el fd_ab; timeout 200 python3 $D/fd_ab.py > "$OUT/fd_ab.log" 2>&1; echo "rc=$?"; tail -10 "$OUT/fd_ab.log"
el tests; timeout 100 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_dmma" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/tests.log"
el tests-acc2; KDTREE_TEST_DEFINES="fp32_dmma:FD_ACC2=1" timeout 100 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_dmma" > "$OUT/tests-acc2.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/tests-acc2.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_dmma and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call2.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call2.tgz -delete
