#!/usr/bin/env bash
# One round on a lent H100/H200, from the repo root (no install of kdtree: PYTHONPATH=.): the parts
# below in order, each under its own time limit, the records of every part packed into
# OUT/records.tgz as that part ends (a call cut short still brings back what finished) and the log in
# OUT/log. Carry .whl (scripts/fetch-device-wheels.sh) for the peers.
#   scripts/device-round.sh OUT [part…]        (no part: the default order, which fits one 10-minute call)
# default order:
#   install  the peers' wheels into /tmp/site (sgl-flash-mla, sglang, nvidia-ml-py)
#   chain    the serving suite's chain cases: ours, FlashMLA and SGLang's Triton kernel, one timing
#            plan a case for all (docs/timing.md), with the memory the allocator holds after each case
#   mma99    the serving suite, bf16_mma then bf16_mma99 forced by name (same card, same run: the
#            99 KB kernel's ratio to bf16_mma is its "vs 1st"), and SGLang's Triton kernel
# more parts (name them):
#   refs       gen-refs of the default suites (the parts below need it; it runs once)
#   verify     every golden with our kernels natively and as sm_120, --trials 3
#   sanitize99 racecheck, synccheck, initcheck (and memcheck) run as sm_120 over one bundle per path
#   e2e99      kdtree e2e run as sm_120
#   pytest99   the GPU tests run as sm_120
#   oob        an --impl whose kernel writes out of bounds: its rows fail, the rest of the run intact
#   serving    the whole serving suite, ours against every peer, for the README's table
set -uo pipefail
out=${1:?usage: scripts/device-round.sh OUT [install|chain|mma99|refs|verify|sanitize99|e2e99|pytest99|oob|serving]...}
shift
parts=${*:-install chain mma99}
rec=/tmp/device-round-records
mkdir -p "$out" "$rec"
source scripts/device-lib.sh
want() { [[ " $parts " == *" $1 "* ]]; }
unset KDTREE_GPU
serving=specs/bench/verify_attn_serving.yaml
pack() { tar -czf "$out/records.tgz.tmp" -C "$rec" . && mv "$out/records.tgz.tmp" "$out/records.tgz"; }
refs_done=
refs() { [ -n "$refs_done" ] || step 150 kd gen-refs -q; refs_done=1; }

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total --format=csv,noheader
want install && install_wheels
if want chain; then
  step 230 kd bench "$serving" -k chain --impl flashmla --impl sglang_triton --no-sanity --time-limit 200 \
      --json "$rec/bench-chain.json" -q
  pack
fi
if want mma99; then
  step 280 kd bench "$serving" --no-baselines --no-sanity --kernel bf16_mma --kernel bf16_mma99 \
      --impl sglang_triton --time-limit 250 --json "$rec/bench-mma99.json" -q
  pack
fi
if want serving; then
  step 300 kd bench "$serving" --impl flashmla --impl sglang_triton --no-baselines --time-limit 270 \
      --json "$rec/bench-serving.json" -q
  pack
fi
if want verify; then
  refs
  step 120 kd verify goldens --backend cuda --trials 3 -q --json "$rec/verify-native.json"
  KDTREE_GPU=sm_120 step 120 kd verify goldens --backend cuda --trials 3 -q --json "$rec/verify-as-sm120.json"
  pack
fi
if want sanitize99; then
  refs
  pick_goldens goldens-sanitize-99k verify_attn/bf16_paged_b2_h8_p0_n8 verify_attn/bf16_paged_b2_h16_p2048_n16 \
      verify_attn/bf16_paged_b4_h16_p1024_n16_mixed verify_attn/bf16_paged_b2_h16_p512_n64 \
      verify_attn/fp32_b2_h8_p0_n8 verify_attn/fp32_b4_h16_p1024_n16_mixed tree_build/example_b \
      tree_accept/mixed_b64_n64_l15
  for tool in racecheck synccheck initcheck memcheck; do
    KDTREE_GPU=sm_120 step 100 kd verify goldens-sanitize-99k --sanitize "$tool" -q \
        --json "$rec/sanitize-as-sm120-$tool.json"
  done
  pack
fi
if want e2e99; then
  KDTREE_GPU=sm_120 step 200 kd e2e --backend cuda --tokens 128 --prompts 2 --budget 8 --budget 32 \
      --json "$rec/e2e-as-sm120.json"
  pack
fi
if want pytest99; then
  refs
  KDTREE_GPU=sm_120 step 240 python3 -m pytest -q -m gpu -p no:cacheprovider -x --junitxml "$rec/pytest-gpu-as-sm120.xml"
  pack
fi
if want oob; then
  refs
  step 120 kd verify goldens/verify_attn -k 'bf16_paged*' --impl cuda --impl verify_attn/bf16_paged=tests/data/oob_impl.py:verify_attn -q \
      --json "$rec/verify-oob-impl.json"
  echo "== the out-of-bounds --impl run exited as above (1 wanted: its rows fail, the run goes on)"
  pack
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,memory.used --format=csv,noheader
} 2>&1 | tee -a "$out/log"
pack
