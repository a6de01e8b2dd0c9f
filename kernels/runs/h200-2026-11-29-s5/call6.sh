#!/usr/bin/env bash
# Session 5, call 6: FD_SFMA=1 (scores on FFMA in fp32 by the S warps: the MMA units and F2F share
# the SM's FMA issue with the P.V FFMAs, call 4). GPU tests with the knob, A/B against the default
# and fp32_gemm, its profile, racecheck / synccheck with the knob.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s5
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests-sfma; KDTREE_TEST_DEFINES="fp32_dmma:FD_SFMA=1" timeout 100 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_dmma" > "$OUT/tests-sfma.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/tests-sfma.log"
export FD_RUNS='[["fp32_gemm", null, null], ["fp32_dmma", null, null], ["fp32_dmma", null, {"FD_SFMA": 1}], ["fp32_dmma", null, {"FD_SFMA": 1, "FD_DIAG": 1}], ["fp32_dmma", null, {"FD_SFMA": 1, "FD_DIAG": 2}]]'
el fd_ab; timeout 150 python3 $D/fd_ab.py > "$OUT/fd_ab.log" 2>&1; echo "rc=$?"; tail -6 "$OUT/fd_ab.log"
el profile; FD_PROFILE_DEFINES='[{"FD_SFMA": 1}]' timeout 100 python3 $D/fd_profile.py > "$OUT/fd_profile.log" 2>&1; echo "rc=$?"; tail -42 "$OUT/fd_profile.log"
for tool in racecheck synccheck; do
  el "$tool"; KDTREE_TEST_DEFINES="fp32_dmma:FD_SFMA=1" timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_dmma and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call6.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call6.tgz -delete
