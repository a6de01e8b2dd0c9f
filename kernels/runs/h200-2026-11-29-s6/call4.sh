#!/usr/bin/env bash
# Session 6, call 4 (call 3 ran the first hmma.py: HMMA and F2FP share, they sum): which instruction kinds run beside HMMA (hmma.py again) since interleaving fp32_bf16x3's MMAs
# (call 2) did not move its time: throughput or latency?
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
timeout 200 python3 kernels/runs/h200-2026-11-29-s6/hmma.py 2>&1 | tee "$OUT/hmma.log"
