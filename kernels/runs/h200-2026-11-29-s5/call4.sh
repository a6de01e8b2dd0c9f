#!/usr/bin/env bash
# Session 5, call 4: which part of the S loop shares the SM with FFMA (pipes.py, per operand mode).
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s5
timeout 120 python3 $D/pipes.py > "$OUT/pipes.log" 2>&1; echo "rc=$?"; cat "$OUT/pipes.log" | tail -12
cd "$OUT" && tar czf call4.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call4.tgz -delete
