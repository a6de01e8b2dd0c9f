#!/usr/bin/env bash
# One round on a lent H100/H200, from the repo root (no install of kdtree: PYTHONPATH=.): the parts
# below in order, each under its own time limit, the records of every part packed into
# OUT/records.tgz as that part ends (a call cut short still brings back what finished) and the log in
# OUT/log. Carry .whl (scripts/fetch-device-wheels.sh) for the peers.
#   scripts/device-round.sh OUT [part…]        (no part: the default order, which fits one 10-minute call)
# default order:
#   install  the peers' wheels into /tmp/site (sgl-flash-mla, sglang, nvidia-ml-py)
#   verifyab the verify_attn goldens (gen-refs of that suite) with our kernels natively (bf16_wgmma2,
#            fp32_bf16x3/fp32_dmma) and as sm_120 (bf16_mma99, fp32_ffma99), --trials 2; the GPU tests
#            of bf16_wgmma2's opt-in paths (balanced schedule, PDL, staged epilogue: fresh inputs,
#            poisoned outputs, graph replays)
#   chain    the serving suite's chain cases: our default bf16_wgmma2 (the f651642 kernel), its
#            PDL build (the next default candidate: kernels/NOTES.md, session 16), its balanced
#            schedule, and FlashMLA in its worker process, one timing plan a case for all, with the
#            memory the allocator holds after each case
#   mma99    the serving suite, bf16_mma then bf16_mma99 forced by name (same card, same run: the
#            99 KB kernel's ratio to bf16_mma is its "vs 1st"), and SGLang's Triton kernel
# more parts (name them):
#   refs       gen-refs of the default suites (the parts below need it; it runs once)
#   verify     every golden with our kernels natively and as sm_120, --trials 3
#   verify99   every golden as sm_120 only (bf16_mma99, fp32_ffma99), --trials 3
#   sanitize99 racecheck, synccheck, initcheck (and memcheck) run as sm_120 over one bundle per path
#   e2e99      kdtree e2e run as sm_120
#   pytest99   the GPU tests run as sm_120
#   oob        an --impl whose kernel writes out of bounds: its rows fail, the rest of the run intact
#   serving    the whole serving suite, ours against every peer, for the README's table
#   peers      the chain cases again with the torch baselines and SGLang's kernel (memory evidence)
#   knobs      bf16_wgmma2's opt-in knobs one at a time (PDL, staged epilogue, balanced schedule) on
#              specs/ab/wgmma2_vs_flashmla.yaml, FlashMLA beside
#   ab         specs/ab/wgmma2_vs_flashmla.yaml whole: default, session-15 build, FlashMLA
#   split      the serving suite's chain cases: the default (f651642's kernel), each session-15 knob
#              alone (balanced schedule, PDL, staged epilogue), FlashMLA beside (which costs what, where)
#   m99rows    the serving suite, bf16_mma then bf16_mma99 forced, and bf16_mma99 at 32-row tiles
#              (its row tile's A/B: 48 rows waste a third of a 64-row request)
#   ncu        ncu sections of ours and FlashMLA on two chain cases FlashMLA wins (mixed B=32, H=128)
#   tests99    the GPU tests of tree_build and of isolation as sm_120; of isolation and the balanced
#              schedule natively
set -uo pipefail
out=${1:?usage: scripts/device-round.sh OUT [install|verifyab|chain|mma99|refs|verify|verify99|sanitize99|e2e99|pytest99|oob|serving|peers|knobs|ab|split|m99rows|tests99|ncu]...}
shift
parts=${*:-install verifyab chain mma99}
rec=/tmp/device-round-records
mkdir -p "$out" "$rec"
source scripts/device-lib.sh
want() { [[ " $parts " == *" $1 "* ]]; }
unset KDTREE_GPU
serving=specs/bench/verify_attn_serving.yaml
ab_suite=specs/ab/wgmma2_vs_flashmla.yaml
new_wgmma2=bf16_wgmma2:WG2_LPT=1,WG2_PDL=1,WG2_STAGED_STORE=1
wgmma2=(--no-baselines --no-sanity --kernel bf16_wgmma2 --impl flashmla -q)
pack() { tar -czf "$out/records.tgz.tmp" -C "$rec" . && mv "$out/records.tgz.tmp" "$out/records.tgz"; }
refs_done=
refs() { [ -n "$refs_done" ] || step 150 kd gen-refs -q; refs_done=1; }

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total --format=csv,noheader
want install && install_wheels
if want verifyab; then
  step 50 kd gen-refs specs/verify_attn.yaml -j 16 -q
  step 45 kd verify goldens/verify_attn --backend cuda --trials 2 -q --json "$rec/verify-attn-native.json"
  KDTREE_GPU=sm_120 step 45 kd verify goldens/verify_attn --backend cuda --trials 2 -q \
      --json "$rec/verify-attn-as-sm120.json"
  step 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attn_schedule.py \
      --junitxml "$rec/pytest-schedule-native.xml"
  pack
fi
if want chain; then
  # written under OUT itself: the record is rewritten after every case, so a call cut short keeps it
  step 170 kd bench "$serving" -k chain "${wgmma2[@]}" --define bf16_wgmma2:WG2_PDL=1 \
      --define bf16_wgmma2:WG2_LPT=1 --time-limit 150 --json "$out/bench-chain.json"
  pack
fi
if want peers; then
  # the peers in this process, as in the rounds before isolation: the memory the allocator holds
  # after each case (the record's device_memory_gib) is then theirs too, not left in their workers
  KDTREE_ISOLATE=0 step 230 kd bench "$serving" -k chain --impl flashmla --impl sglang_triton --no-sanity \
      --time-limit 200 --json "$rec/bench-chain-peers.json" -q
  pack
fi
if want knobs; then
  step 50 kd bench "$ab_suite" -k 'b1_h*_p2*' "${wgmma2[@]}" --define bf16_wgmma2:WG2_PDL=1 \
      --define bf16_wgmma2:WG2_STAGED_STORE=1 --time-limit 40 --json "$rec/knobs-small.json"
  step 90 kd bench "$ab_suite" -k '*mixed*' "${wgmma2[@]}" --define bf16_wgmma2:WG2_LPT=1 --time-limit 80 \
      --json "$rec/knobs-mixed.json"
  pack
fi
if want ab; then
  step 540 kd bench "$ab_suite" "${wgmma2[@]}" --define "$new_wgmma2" --time-limit 520 --json "$rec/bench-ab.json"
  pack
fi
if want split; then
  step 260 kd bench "$serving" -k chain "${wgmma2[@]}" --define bf16_wgmma2:WG2_LPT=1 \
      --define bf16_wgmma2:WG2_PDL=1 --define bf16_wgmma2:WG2_STAGED_STORE=1 \
      --time-limit 240 --json "$out/bench-split.json"
  pack
fi
if want tests99; then
  refs
  KDTREE_GPU=sm_120 step 120 python3 -m pytest -q -m gpu -p no:cacheprovider -k "tree_build or isolation" \
      tests/kernels/test_cuda_kernels.py tests/impl/test_isolation.py --junitxml "$rec/pytest-tests99-as-sm120.xml"
  step 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/impl/test_isolation.py \
      tests/kernels/test_attn_schedule.py --junitxml "$rec/pytest-isolation-schedule-native.xml"
  pack
fi
if want ncu; then
  # ours and FlashMLA on the chain cases FlashMLA wins most (a mixed batch, H=128): the sections
  # that say what bounds each (speed of light, occupancy, warp states), two calls each
  mkdir -p "$rec/ncu"
  for c in b32_h8_q4_p4096_mixed_chain b32_h128_q4_p4096_chain; do
    for impl in cuda flashmla; do
      step 60 ncu --kernel-name regex:'verify_attn|flash|mla' --launch-count 6 --section SpeedOfLight \
          --section Occupancy --section WarpStateStats --section LaunchStats --csv --page details \
          python3 scripts/launch-case.py --times 2 --impl "$impl" "$serving" "$c" > "$rec/ncu/$c-$impl.csv" 2>&1
    done
  done
  pack
fi
if want m99rows; then
  step 115 kd bench "$serving" --no-baselines --no-sanity --no-back-to-back --kernel bf16_mma --kernel bf16_mma99 \
      --define bf16_mma99:M99_ROWS=32 --time-limit 100 --json "$out/bench-mma99-rows.json" -q
  pack
fi
if want mma99; then
  step 115 kd bench "$serving" --no-baselines --no-sanity --no-back-to-back --kernel bf16_mma --kernel bf16_mma99 \
      --impl sglang_triton --time-limit 100 --json "$rec/bench-mma99.json" -q
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
if want verify99; then
  refs
  KDTREE_GPU=sm_120 step 150 kd verify goldens --backend cuda --trials 3 -q --json "$rec/verify-as-sm120.json"
  pack
fi
if want sanitize99; then
  refs
  pick_goldens goldens-sanitize-99k verify_attn/bf16_paged_b2_h8_p0_n8 verify_attn/bf16_paged_b2_h16_p2048_n16 \
      verify_attn/bf16_paged_b4_h16_p1024_n16_mixed verify_attn/fp32_b2_h8_p0_n8 \
      verify_attn/fp32_b4_h16_p1024_n16_mixed
  for tool in racecheck synccheck initcheck memcheck; do
    KDTREE_GPU=sm_120 step 75 kd verify goldens-sanitize-99k --sanitize "$tool" -q \
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
  KDTREE_ISOLATE=1 step 120 kd verify goldens/verify_attn -k "bf16_paged*" --impl cuda --impl verify_attn/bf16_paged=tests/data/oob_impl.py:verify_attn -q \
      --json "$rec/verify-oob-impl.json"
  echo "== the out-of-bounds --impl run exited as above (1 wanted: its rows fail, the run goes on)"
  pack
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,memory.used --format=csv,noheader
} 2>&1 | tee -a "$out/log"
pack
