#!/usr/bin/env bash
# Session 5, call 3: do the FP64 MMAs and the FFMAs run at once on an SM (pipes.py), and where a
# sub-tile's time goes inside fp32_dmma (fd_profile.py: clock64 stamps per sub-tile; default,
# FD_DIAG=1, FD_DIAG=2).
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s5
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
el pipes; timeout 90 python3 $D/pipes.py > "$OUT/pipes.log" 2>&1; echo "rc=$?"; cat "$OUT/pipes.log" | tail -6
el profile; timeout 120 python3 $D/fd_profile.py > "$OUT/fd_profile.log" 2>&1; echo "rc=$?"; cat "$OUT/fd_profile.log" | tail -75
el done
cd "$OUT" && tar czf call3.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call3.tgz -delete
