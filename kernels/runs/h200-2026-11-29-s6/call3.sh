#!/usr/bin/env bash
# Session 6, call 3: the HMMA.16816 rate per SM (the first version of hmma.py; call 4 ran its successor), since interleaving fp32_bf16x3's MMAs
# (call 2) did not move its time: throughput or latency?
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
timeout 200 python3 kernels/runs/h200-2026-11-29-s6/hmma.py 2>&1 | tee "$OUT/hmma.log"
