#!/usr/bin/env bash
# Session 7, call 8: the one case call 7's bench left out at its time limit (fp32 B=4 H=16 Q=17 P=8192),
# in a record of its own (same commit b84ae0f).
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
timeout 200 python3 -m cli bench -k fp32_b4 --repeat --time-limit 150 --json "$OUT/r/bench-fp32-b4.json" > "$OUT/r/bench-fp32-b4.log" 2>&1; echo "bench rc=$?"; tail -8 "$OUT/r/bench-fp32-b4.log"
cd "$OUT" && tar czf call8.tgz r && rm -rf r
