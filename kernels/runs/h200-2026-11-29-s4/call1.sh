#!/usr/bin/env bash
# Session 4, call 1: FP64 tensor-core throughput probe (dmma.py), then the queued TB_LEAN experiment.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s4
timeout 120 python3 $D/dmma.py 2>&1 | tee "$OUT/dmma.log"
bash kernels/runs/next/tb_lean.sh 2>&1 | tee "$OUT/tb_lean_sh.log"
