#!/usr/bin/env bash
# Issue 28's GPU evidence for the 99 KB GPUs' kernels (bf16_mma99, fp32_ffma99) and A100's
# (bf16_mma, fp32_ffma99), prepared without a GPU (docs/gpus.md): run on the lent H200 from the repo
# root, records under $OUT (the device runner's output folder).
#   OUT=/path scripts/device-batch-99k.sh [build|verify|sanitize|e2e|pytest|bench|all]...
# build:    kdtree build for sm_90 and sm_120 (the H200 compiles the 99 KB kernels for sm_90)
# verify:   gen-refs; verify --trials 20 of every golden run as sm_120 (bf16_mma99, fp32_ffma99) and
#           as sm_80 (bf16_mma, fp32_ffma99); both 99 KB kernels forced natively too; one refusal
# sanitize: compute-sanitizer memcheck, racecheck, synccheck, initcheck run as sm_120 over one bundle
#           per path of each (no prefix; one split and several; mixed prefixes; 64-node trees)
# e2e:      kdtree e2e, fp32 and bf16_paged, run as sm_120
# pytest:   the GPU tests natively (no regression: both new kernels are among those they force), then
#           the verify_attn kernel tests run as sm_120
# bench:    the serving suite run as sm_120 against SGLang's Triton kernel (install_wheels first:
#           scripts/fetch-device-wheels.sh, carry .whl) and natively (bf16_wgmma2, bf16_mma forced),
#           then --compare against results/bench.json; the fp32 suite as sm_120 (fp32_ffma99)
# Each step has a time limit (the device allows 10 minutes a command: run the parts in separate
# calls, e.g. `build verify sanitize` then `e2e pytest` then `bench`); a log goes to $OUT/log-<parts>.
set -uo pipefail
out=${OUT:?set OUT to the folder the records go to}
parts=${*:-all}
mkdir -p "$out"
source scripts/device-lib.sh
unset KDTREE_GPU

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
if want build; then
  step 120 kd build --arch sm_90 --arch sm_120 --json "$out/build-sm90-sm120.json"
fi
if want verify || want sanitize || want pytest; then
  step 120 kd gen-refs -q
fi
if want verify; then
  KDTREE_GPU=sm_120 step 240 kd verify goldens --backend cuda --trials 20 \
      --json "$out/verify-as-sm120.json" --junit "$out/verify-as-sm120.xml" -q
  KDTREE_GPU=sm_80 step 200 kd verify goldens --backend cuda --trials 20 --json "$out/verify-as-sm80.json" -q
  step 60 kd verify goldens/verify_attn -k 'bf16_paged*' --backend cuda --kernel bf16_mma99 --trials 20 \
      --json "$out/verify-bf16_mma99-native.json" -q
  step 60 kd verify goldens/verify_attn -k 'fp32*' --backend cuda --kernel fp32_ffma99 --trials 20 \
      --json "$out/verify-fp32_ffma99-native.json" -q
  # the refusal: bf16_wgmma2 forced as sm_120 (it does not fit 99 KB); must exit 2
  KDTREE_GPU=sm_120 step 60 kd verify goldens/verify_attn -k 'bf16_paged_b2_h8_p0*' --backend cuda \
      --kernel bf16_wgmma2 -q
fi
if want sanitize; then
  pick_goldens goldens-sanitize-99k verify_attn/bf16_paged_b2_h8_p0_n8 verify_attn/bf16_paged_b2_h16_p2048_n16 \
      verify_attn/bf16_paged_b4_h16_p1024_n16_mixed verify_attn/bf16_paged_b2_h16_p512_n64 \
      verify_attn/bf16_paged_b1_h16_p8192_n32 verify_attn/fp32_b2_h8_p0_n8 verify_attn/fp32_b2_h16_p2048_n16 \
      verify_attn/fp32_b4_h16_p1024_n16_mixed verify_attn/fp32_b1_h64_p128_n32
  for tool in memcheck racecheck synccheck initcheck; do
    KDTREE_GPU=sm_120 step 110 kd verify goldens-sanitize-99k --sanitize "$tool" -q --json "$out/sanitize-as-sm120-$tool.json"
  done
fi
if want e2e; then
  KDTREE_GPU=sm_120 step 300 kd e2e --backend cuda --tokens 256 --prompts 3 \
      --budget 8 --budget 32 --budget 64 --json "$out/e2e-as-sm120.json"
fi
if want pytest; then
  step 300 python3 -m pytest -q -m gpu -p no:cacheprovider
  KDTREE_GPU=sm_120 step 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "verify_attn or attn" \
      tests/kernels/test_cuda_kernels.py tests/kernels/test_kernels_api.py tests/kernels/test_attn_splits.py
fi
if want bench; then
  install_wheels
  KDTREE_GPU=sm_120 step 360 kd bench specs/bench/verify_attn_serving.yaml --no-baselines --impl sglang_triton \
      --time-limit 320 --json "$out/bench-serving-as-sm120.json" --csv "$out/bench-serving-as-sm120.csv" -q
  step 240 kd bench specs/bench/verify_attn_serving.yaml --no-baselines --kernel bf16_mma --kernel bf16_wgmma2 \
      --time-limit 220 --json "$out/bench-serving-native.json" -q
  step 120 kd bench specs/bench/verify_attn_serving.yaml --no-baselines --time-limit 100 \
      --compare results/bench.json --json "$out/bench-serving-compare.json" -q
  KDTREE_GPU=sm_120 step 120 kd bench specs/bench/verify_attn.yaml -k fp32 --no-baselines --time-limit 100 \
      --json "$out/bench-fp32-as-sm120.json" -q
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
} 2>&1 | tee "$out/log-${parts// /-}"
