#!/usr/bin/env bash
# Session 7, call 2: where fp32_bf16x3 v5 (44.8-45.7 us in call 1) spends its time: ncu on one launch of
# its main kernel (default, and FX_DIAG=1: no score MMAs, 29.5 us) and of its pieces kernel.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_bytes.sum,lts__t_bytes.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum
run() {  # label, kernel regex, defines
  el "ncu $1"
  FX_DEFINES="$3" timeout 150 "$NCU" --clock-control none -k "regex:$2" -s 2 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics $M --print-details all python3 kernels/runs/h200-2026-11-29-s6/fx_once.py > "$OUT/ncu_$1.log" 2>&1
  echo "rc=$?"; grep -E "Duration|gpu__time_duration|lts__t_bytes|hmma_cycles|wavefronts_mem_shared|Issued Warp|No Eligible|L2 Cache Throughput|DRAM Throughput|Memory Throughput" "$OUT/ncu_$1.log" | head -16
}
run main '^verify_attn_fp32_bf16x3$' '{}'
run diag1 '^verify_attn_fp32_bf16x3$' '{"FX_DIAG": 1}'
run pieces '_pieces$' '{}'
el done
cd "$OUT" && tar czf call2.tgz *.log && find . -maxdepth 1 -type f ! -name call2.tgz -delete
