#!/usr/bin/env bash
# Session 8, call 3: fp32_bf16x3 v9 = v8 with the S warps' Q fragments loaded straight from global
# memory (no Q tile in shared memory on sm_90a: its room is a fourth K-piece slot, and the first
# sub-tile waits for 55 KB instead of 110). GPU tests; A/B (v6, cur, cur_plain, cur_noqreg, fp32_dmma,
# cur's FX_DIAG 1/2/3/4) with outputs compared bit for bit; B=4 P=8192; timeline; racecheck,
# synccheck; ncu figures of cur.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s8
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -15 "$OUT/tests.log"
export AB_RUNS='[["v6", null, null], ["cur", null, null], ["cur_plain", null, null], ["cur_noqreg", null, null], ["fp32_dmma", null, null], ["cur", null, {"FX_DIAG": 1}], ["cur", null, {"FX_DIAG": 2}], ["cur", null, {"FX_DIAG": 3}], ["cur", null, {"FX_DIAG": 4}]]'
el ab; AB_JSON=ab.json timeout 150 python3 $D/ab.py > "$OUT/ab.log" 2>&1; echo "rc=$?"; tail -11 "$OUT/ab.log"; grep "round 0" "$OUT/ab.log"
el prof; timeout 90 python3 $D/prof.py > "$OUT/prof.log" 2>&1; echo "rc=$?"; grep -E "^== |^  verify" "$OUT/prof.log" | tail -33
export AB_RUNS='[["fp32_dmma", null, null], ["cur", null, null]]'
el "ab B=4 P=8192"; AB_SHAPE=4,16,8192,16 AB_JSON=ab_b4.json timeout 120 python3 $D/ab.py > "$OUT/ab_b4.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/ab_b4.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed_op_ldsm.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__t_sectors.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed
el "ncu cur"; timeout 90 "$NCU" --clock-control none -k "regex:^verify_attn_fp32_bf16x3$" -s 2 -c 1 --metrics $M python3 $D/once.py > "$OUT/ncu_cur.log" 2>&1; echo "rc=$?"; grep -E "^\s+(gpu__|sm__|l1tex__|smsp__|lts__)" "$OUT/ncu_cur.log"
el done
cd "$OUT" && tar czf call3.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call3.tgz -delete
