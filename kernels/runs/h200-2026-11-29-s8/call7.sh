#!/usr/bin/env bash
# Session 8, call 7: the evidence at commit 1103a79 (the code of call 6's bench record): gen-refs,
# verify --backend cuda --trials 20 on every suite, the GPU pytest tests, the four sanitizers over one
# bundle per kernel path (e2e left out: the device time left would not cover it).
set -u
export KDTREE_CACHE_DIR=/tmp/kc
timeout 520 bash scripts/gpu-evidence.sh "$OUT/ev" verify pytest sanitize > "$OUT/ev-log.txt" 2>&1; echo "rc=$?"
grep -E "^== |passed|failed|PASS|FAIL|error" "$OUT/ev-log.txt" | tail -40
cd "$OUT" && tar czf call7.tgz ev ev-log.txt && rm -rf ev ev-log.txt
