#!/usr/bin/env bash
# Issue 28's GPU evidence for bf16_mma99, prepared without a GPU (docs/gpus.md): run on the lent H200
# from the repo root, records under $OUT (the device runner's output folder).
#   OUT=/path scripts/device-batch-99k.sh [build|verify|sanitize|e2e|pytest|bench|all]...
# build:    kdtree build for sm_90 and sm_120 (the H200 compiles bf16_mma99 for sm_90)
# verify:   gen-refs; verify --trials 20 run as sm_120 (bf16_mma99) and as sm_80 (bf16_mma) over the
#           goldens those GPUs have a kernel for (bf16_paged, tree_build, tree_accept: no fp32
#           kernel fits them yet, kernels/README.md); bf16_mma99 forced natively too
# sanitize: compute-sanitizer memcheck, racecheck, synccheck, initcheck run as sm_120 over one bundle
#           per bf16_mma99 path (no prefix; one split and several; mixed prefixes; 64-node trees)
# e2e:      kdtree e2e bf16_paged run as sm_120 (fp32 e2e waits for an fp32 kernel that fits)
# pytest:   the GPU tests natively (no regression; bf16_mma99 is among the kernels they force), then
#           the bf16 ones run as sm_120 (their ids: bf16_paged or a bf16_* kernel other than fp32_bf16x3)
# bench:    the serving suite run as sm_120 against SGLang's Triton kernel, and natively (bf16_wgmma2,
#           and bf16_mma forced) for the same shapes, then --compare against results/bench.json
# Each step has a time limit (the device allows 10 minutes a command: run the parts in separate
# calls, e.g. `verify sanitize` then `e2e pytest` then `bench`); a log goes to $OUT/log-<parts>.
set -uo pipefail
out=${OUT:?set OUT to the folder the records go to}
parts=${*:-all}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-cache}
unset KDTREE_GPU
want() { [[ " $parts " == *" $1 "* || " $parts " == *" all "* ]]; }
step() { local limit=$1; shift; echo "== [$(date +%T)] ${KDTREE_GPU:+KDTREE_GPU=$KDTREE_GPU }$*"
         if [ "$1" = kd ]; then shift; set -- python3 -m cli "$@"; fi; timeout "$limit" "$@"; echo "== exit $?"; }
# the goldens a GPU without an fp32 kernel verifies: every bundle but verify_attn/fp32_*
served_goldens() { mkdir -p goldens-99k/verify_attn; cp -r goldens/tree_build goldens/tree_accept goldens-99k/
                   cp goldens/verify_attn/bf16_paged_*.kdtr goldens-99k/verify_attn/; }
sanitize_goldens() { rm -rf goldens-99k-sanitize; mkdir -p goldens-99k-sanitize/verify_attn
  for f in bf16_paged_b2_h8_p0_n8 bf16_paged_b2_h16_p2048_n16 bf16_paged_b4_h16_p1024_n16_mixed \
           bf16_paged_b2_h16_p512_n64 bf16_paged_b1_h16_p8192_n32; do
    cp "goldens/verify_attn/$f.kdtr" goldens-99k-sanitize/verify_attn/
  done; }

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
if want build; then
  step 120 kd build --arch sm_90 --arch sm_120 --json "$out/build-sm90-sm120.json"
fi
if want verify || want sanitize || want pytest; then
  step 120 kd gen-refs -q
  rm -rf goldens-99k && served_goldens
fi
if want verify; then
  KDTREE_GPU=sm_120 step 240 kd verify goldens-99k --backend cuda --trials 20 \
      --json "$out/verify-as-sm120.json" --junit "$out/verify-as-sm120.xml" -q
  KDTREE_GPU=sm_80 step 240 kd verify goldens-99k --backend cuda --trials 20 --json "$out/verify-as-sm80.json" -q
  step 120 kd verify goldens-99k/verify_attn --backend cuda --kernel bf16_mma99 --trials 20 \
      --json "$out/verify-bf16_mma99-native.json" -q
  # the refusals: fp32 as sm_120 (no kernel), wgmma2 forced as sm_120 (it does not fit 99 KB)
  KDTREE_GPU=sm_120 step 60 kd verify goldens/verify_attn -k 'fp32_b2_h8_p0*' --backend cuda -q
  KDTREE_GPU=sm_120 step 60 kd verify goldens-99k/verify_attn -k 'bf16_paged_b2_h8_p0*' --backend cuda \
      --kernel bf16_wgmma2 -q
fi
if want sanitize; then
  sanitize_goldens
  for tool in memcheck racecheck synccheck initcheck; do
    KDTREE_GPU=sm_120 step 110 kd verify goldens-99k-sanitize --sanitize "$tool" -q --json "$out/sanitize-as-sm120-$tool.json"
  done
fi
if want e2e; then
  KDTREE_GPU=sm_120 step 300 kd e2e --backend cuda --variant bf16_paged --tokens 256 --prompts 3 \
      --budget 8 --budget 32 --budget 64 --json "$out/e2e-as-sm120.json"
fi
if want pytest; then
  step 300 python3 -m pytest -q -m gpu -p no:cacheprovider
  KDTREE_GPU=sm_120 step 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "bf16 and not fp32" \
      tests/kernels/test_cuda_kernels.py tests/kernels/test_kernels_api.py tests/kernels/test_attn_splits.py
fi
if want bench; then
  KDTREE_GPU=sm_120 step 420 kd bench specs/bench/verify_attn_serving.yaml --no-baselines --impl sglang_triton \
      --time-limit 380 --json "$out/bench-serving-as-sm120.json" --csv "$out/bench-serving-as-sm120.csv" -q
  step 300 kd bench specs/bench/verify_attn_serving.yaml --no-baselines --kernel bf16_mma --kernel bf16_wgmma2 \
      --time-limit 270 --json "$out/bench-serving-native.json" -q
  step 120 kd bench specs/bench/verify_attn_serving.yaml --no-baselines --time-limit 100 \
      --compare results/bench.json --json "$out/bench-serving-compare.json" -q
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
} 2>&1 | tee "$out/log-${parts// /-}"
