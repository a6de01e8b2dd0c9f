#!/usr/bin/env bash
# Session 6, call 10: wgprobe.py with CK = 2 only (PROBE_CK=2): do the integer split's instructions (IADD3, LOP3, PRMT) issued by other warps run beside mma.sync and beside
# wgmma? (Calls 3-4 had the same warps issue both.) Decides whether a wgmma design could hide the
# bf16x3 split conversions.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
PROBE_CK=2 timeout 200 python3 kernels/runs/h200-2026-11-29-s6/wgprobe.py 2>&1 | tee "$OUT/wgprobe.log"
