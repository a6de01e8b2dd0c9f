#!/usr/bin/env bash
# Every piece of GPU evidence in one go, on the lent H200, from the repo root (no install: PYTHONPATH=.).
#   scripts/gpu-evidence.sh OUT_DIR [verify|sanitize|all]
# verify:   gen-refs, verify --backend cuda --trials 20 --determinism (record), a second verify (cache
#           hits), the GPU pytest tests, kdtree e2e on cuda (fp32 + bf16_paged, budgets 8/32/64, 256 tokens)
# sanitize: compute-sanitizer memcheck/racecheck/synccheck/initcheck over one bundle per kernel path
set -uo pipefail
out=${1:?usage: scripts/gpu-evidence.sh OUT_DIR [verify|sanitize|all]}
what=${2:-all}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-cache}
kd() { python3 -m cli "$@"; }
status=0
step() { echo "== $*"; "$@" || { rc=$?; echo "!! exit $rc: $*"; status=1; }; }

kd gen-refs -q | tail -1
if [ "$what" = verify ] || [ "$what" = all ]; then
  step kd doctor --json "$out/doctor.json"
  step kd verify --backend cuda --trials 20 --determinism --json "$out/verify-cuda.json" --junit "$out/verify-cuda.xml" -q
  step kd verify --backend cuda -q --json "$out/verify-cuda-rerun.json"
  step python3 -m pytest -q -m gpu -p no:cacheprovider
  step kd e2e --backend cuda --tokens 256 --prompts 3 --budget 8 --budget 32 --budget 64 --json "$out/e2e-cuda.json"
fi
if [ "$what" = sanitize ] || [ "$what" = all ]; then
  rm -rf goldens-sanitize && mkdir -p goldens-sanitize
  for f in tree_build/example_b tree_build/b64_n64_l15 tree_accept/mixed_b64_n64_l15 tree_accept/root_only_q1 \
           verify_attn/fp32_b2_h8_p0_n8 verify_attn/fp32_b4_h16_p1024_n16_mixed verify_attn/fp32_b2_h16_p2048_n16 \
           verify_attn/bf16_paged_b2_h8_p0_n8 verify_attn/bf16_paged_b4_h16_p1024_n16_mixed \
           verify_attn/bf16_paged_b1_h16_p8192_n32 verify_attn/bf16_paged_b2_h16_p512_n64; do
    mkdir -p "goldens-sanitize/$(dirname $f)" && cp "goldens/$f.kdtr" "goldens-sanitize/$f.kdtr"
  done
  for tool in memcheck racecheck synccheck initcheck; do
    step kd verify goldens-sanitize --sanitize "$tool" --json "$out/sanitize-$tool.json"
  done
fi
exit $status
