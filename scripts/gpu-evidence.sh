#!/usr/bin/env bash
# Every piece of GPU evidence, on the lent H200, from the repo root (no install: PYTHONPATH=.).
#   scripts/gpu-evidence.sh OUT_DIR [verify|e2e|rerun|pytest|sanitize|invariance|bench|all]...
# verify:   gen-refs; verify --backend cuda --trials 20 (record)
# e2e:      kdtree e2e on cuda (fp32 + bf16_paged, budgets 8/32/64; E2E_TOKENS (256) tokens,
#           E2E_PROMPTS (3) prompts)
# rerun:    with verify: a second verify (cache hits) and verify --devices all (equals the plain run)
# pytest:   with verify: the GPU pytest tests
# sanitize: compute-sanitizer memcheck/racecheck/synccheck/initcheck over one bundle per kernel path,
#           the defaults and then the fallbacks forced with --kernel
# invariance: verify --invariance of every golden with our kernels, then of the verify_attn goldens
#           with SGLang's Triton kernel (install_wheels: scripts/fetch-device-wheels.sh, carry .whl)
# bench:    the default bench suites, with --repeat (record, CSV, plot)
# Each step has a time limit; records go to OUT_DIR/records (at most 8 files a part) and a log to OUT_DIR/log.
set -uo pipefail
out=${1:?usage: scripts/gpu-evidence.sh OUT_DIR [verify|sanitize|bench|all]...}
shift
parts=${*:-all}
rec="$out/records"
mkdir -p "$rec"
source scripts/device-lib.sh

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
step 120 kd gen-refs -q
if want verify; then
  step 30  kd doctor --json "$rec/doctor.json"
  step 330 kd verify --backend cuda --trials 20 --json "$rec/verify-cuda.json" --junit "$rec/verify-cuda.xml" -q
  want rerun && step 60  kd verify --backend cuda -q --json "$rec/verify-cuda-rerun.json"
  want rerun && step 90  kd verify --backend cuda -q --devices all --json "$rec/verify-cuda-devices-all.json"
  want pytest && step 240 python3 -m pytest -q -m gpu -p no:cacheprovider
fi
if want e2e; then
  step ${E2E_LIMIT:-240} kd e2e --backend cuda --tokens ${E2E_TOKENS:-256} --prompts ${E2E_PROMPTS:-3} --budget 8 --budget 32 --budget 64 --json "$rec/e2e-cuda.json"
fi
if want sanitize; then
  # one bundle per kernel path: the launch's own choices here (tree_build sorted, smem at budget 1024,
  # tree_accept walk in registers and in shared memory, fp32_dmma: these fp32 grids fill under 3/4
  # of the SMs, bf16_wgmma2), then the kernels it does not pick on them forced (--kernel): tree_build
  # warp, bf16_mma and fp32_bf16x3 (kernels/README.md)
  pick_goldens goldens-sanitize tree_build/example_b tree_build/b64_n64_l15 tree_build/b2_n1024_l24 \
      tree_accept/mixed_b64_n64_l15 tree_accept/root_only_q1 tree_accept/full_b2_n512 verify_attn/fp32_b2_h8_p0_n8 \
      verify_attn/fp32_b4_h16_p1024_n16_mixed verify_attn/bf16_paged_b2_h8_p0_n8 \
      verify_attn/bf16_paged_b4_h16_p1024_n16_mixed verify_attn/bf16_paged_b2_h16_p512_n64
  pick_goldens goldens-fallback tree_build/example_b tree_build/b64_n64_l15 verify_attn/bf16_paged_b2_h8_p0_n8 \
      verify_attn/bf16_paged_b4_h16_p1024_n16_mixed verify_attn/fp32_b4_h16_p1024_n16_mixed
  for tool in memcheck racecheck synccheck initcheck; do
    step 85 kd verify goldens-sanitize --sanitize "$tool" -q --json "$rec/sanitize-$tool.json"
    step 60 kd verify goldens-fallback --sanitize "$tool" --kernel warp --kernel bf16_mma --kernel fp32_bf16x3 -q \
        --json "$rec/sanitize-$tool-fallbacks.json"
  done
fi
if want invariance; then
  step 240 kd verify --invariance --backend cuda -q --json "$rec/invariance-cuda.json"
  install_wheels
  step 240 kd verify goldens/verify_attn -k 'bf16_paged*' --invariance --impl sglang_triton -q \
      --json "$rec/invariance-sglang_triton.json"
fi
if want bench; then
  step 480 kd bench --repeat --time-limit 420 --json "$rec/bench.json" --csv "$rec/bench.csv" -q
  step 60  kd report "$rec/bench.json" --plot "$rec/bench.png" -q
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
} 2>&1 | tee "$out/log"

