#!/usr/bin/env bash
# Session 6, call 9: wgprobe.py: do F2FP / FFMA issued by OTHER warps run beside mma.sync and beside
# wgmma? (Calls 3-4 had the same warps issue both.) Decides whether a wgmma design could hide the
# bf16x3 split conversions.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
timeout 200 python3 kernels/runs/h200-2026-11-29-s6/wgprobe.py 2>&1 | tee "$OUT/wgprobe.log"
