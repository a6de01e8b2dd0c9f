#!/usr/bin/env bash
# Session 6, call 6: where fp32_bf16x3 (version 3, 48.5 us) spends its time: ncu's pipe, shared-memory
# and warp-stall sections on one launch of the main kernel (and fp32_dmma's for comparison); then
# synccheck / racecheck again with __syncwarp before the 384-thread barrier.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s6
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in fp32_bf16x3 fp32_dmma; do
  el "ncu $k"
  FX_KERNEL=$k timeout 200 "$NCU" --clock-control none -k "regex:^verify_attn_${k}\$" -s 2 -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section InstructionStats --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_pipe_fp16.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_uniform.sum,sm__cycles_elapsed.avg \
    --print-details all python3 $D/fx_once.py > "$OUT/ncu_$k.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/ncu_$k.log"
done
el tests; timeout 100 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/tests.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
cd "$OUT" && tar czf call6.tgz *.log && find . -maxdepth 1 -type f ! -name call6.tgz -delete
