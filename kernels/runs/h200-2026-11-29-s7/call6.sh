#!/usr/bin/env bash
# Session 7, call 6: the evidence a default needs, at commit b84ae0f (fp32_bf16x3 v6 first in
# CUDA_DEFAULTS): gen-refs, verify --backend cuda --trials 20 on every suite, the GPU pytest tests,
# the four sanitizers over one bundle per kernel path, and the e2e run.
set -u
export KDTREE_CACHE_DIR=/tmp/kc
timeout 580 bash scripts/gpu-evidence.sh "$OUT/ev" verify pytest sanitize e2e > "$OUT/ev-log.txt" 2>&1; echo "rc=$?"
grep -E "^== |passed|failed|PASS|FAIL|error" "$OUT/ev-log.txt" | tail -45
cd "$OUT" && tar czf call6.tgz ev ev-log.txt && rm -rf ev ev-log.txt
