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
#            of bf16_wgmma2's paths (PDL, the L2 hint build, balanced schedule, staged epilogue:
#            fresh inputs, poisoned outputs, graph replays)
#   verify90 verifyab without the sm_120 run (a short call)
#   chain    the serving suite's chain cases: our default bf16_wgmma2 (PDL for one request, L2
#            hints on calls of at most 256 MB of keys), f651642's kernel (WG2_PDL=0,WG2_KV_HINT=0),
#            the balanced schedule, and FlashMLA in its worker process, one timing plan a case for
#            all, with the memory the allocator holds after each case
#   graphncu scripts/graph-overlap.py on the mixed B=32 and B=8 H=8 chain cases, and ncu of whole graph
#            replays of them (--graph-profiling graph): DRAM bytes and L2 hit rate back to back
#   sanitize90 racecheck, synccheck and memcheck of our default kernels natively over two bundles
# more parts (name them):
#   hints    the chain cases: the default, and each forced on every call: no L2 hint
#            (WG2_KV_HINT=0), evict-first (=1); FlashMLA in its worker
#   timeline scripts/graph-overlap.py --timeline, ours and FlashMLA, on four chain cases (on the mixed
#            ones also the schedules, WG2_LPT=1, 2 and 2 with the prefetch): each kernel's time and
#            the gaps between consecutive kernels in graph replays (torch.profiler)
#   segments the segment schedule (WG2_LPT=2) and it loading the next segment early
#            (WG2_SEG_PREFETCH=1): the schedules' GPU tests (fresh inputs, poisoned outputs); if they
#            pass, the mixed chain cases (SEGMENTS_CASES: another -k pattern), then the B=8 and B=32
#            H=16 ones (equal requests): the default, WG2_LPT=1, WG2_LPT=2 and the prefetch build,
#            FlashMLA in its worker (SEGMENTS_SECONDS: each bench's time limit, 60); then every
#            verify_attn golden with both segment builds, racecheck / synccheck / memcheck of the
#            prefetch build and racecheck / synccheck of the other on two mixed goldens
#   segquick segments cut to a short call: the segment GPU tests, the mixed chain cases (the default,
#            WG2_LPT=2 with and without the prefetch, FlashMLA; 45 s), racecheck of the prefetch build
#            on one mixed golden
#   first    the two open A/Bs in about 4 minutes, no wheels: the segment GPU tests, then the mixed
#            chain cases (default, WG2_LPT=2, the prefetch); the 8x-miss cases with bf16_mma,
#            bf16_mma99 and its three session-21 builds (the bench checks their bytes)
#   chunks   the balanced schedule's chunk on the two mixed chain cases: the default (uniform grid),
#            WG2_LPT=1 (its chunk, an even share of the SMs) and WG2_LPT=1 at forced chunks (keys)
#   targets  results/suites/targets.yaml: the large bf16 and the fp32 serving targets, ours alone
#   ncuboost ncu at the bench's clocks (--clock-control none) of ours and FlashMLA: kernel times on
#            the mixed B=32 and the B=8 H=8 chain cases (caches flushed); scripts/graph-overlap.py;
#            on the B=8 case the ncu sections
#   mma99h128 the mma99 part on the serving suite's H=128 cases (time-limited out of it before)
#   mma99    the serving suite, bf16_mma then bf16_mma99 forced by name (same card, same run: the
#            99 KB kernel's ratio to bf16_mma is its "vs 1st"), and SGLang's Triton kernel
#   refs       gen-refs of the default suites (the parts below need it; it runs once)
#   verify     every golden with our kernels natively and as sm_120, --trials 3
#   verify99   every golden as sm_120 only (bf16_mma99, fp32_ffma99), --trials 3
#   sanitize99 racecheck, synccheck, initcheck (and memcheck) run as sm_120 over one bundle per path
#   e2e99      kdtree e2e run as sm_120
#   pytest90   the GPU tests run natively (the default kernels of this GPU)
#   pytest99   the GPU tests run as sm_120
#   oob        an --impl whose kernel writes out of bounds: its rows fail, the rest of the run intact
#   serving    the whole serving suite, ours against every peer, for the README's table
#   peers      the chain cases again with the torch baselines and SGLang's kernel (memory evidence)
#   knobs      bf16_wgmma2's opt-in knobs one at a time (PDL, staged epilogue, balanced schedule) on
#              specs/ab/wgmma2_vs_flashmla.yaml, FlashMLA beside
#   ab         specs/ab/wgmma2_vs_flashmla.yaml whole: default, session-15 build, FlashMLA
#   split      the serving suite's chain cases: the default, each session-15 knob
#              alone (balanced schedule, PDL, staged epilogue), FlashMLA beside (which costs what, where)
#   m99rows    the serving suite, bf16_mma then bf16_mma99 forced, and bf16_mma99 at 32-row tiles
#              (its row tile's A/B: 48 rows waste a third of a 64-row request)
#   ncu        ncu sections of ours and FlashMLA on two chain cases FlashMLA wins (mixed B=32, H=128)
#   mma99ab    bf16_mma99's session-21 builds (the same bits by design): the scores summed a quarter
#              a warp (M99_SUM_SCATTER=1), P.V a step late in the odd row groups (M99_SKEW=1), both:
#              every bf16 golden with the two-knob build as sm_120 (--trials 2); the cases where bf16_mma99
#              misses 8x SGLang (results/suites/mma99-8x.yaml): bf16_mma, bf16_mma99, the three
#              builds and SGLang's Triton kernel in one run (bench refuses builds whose bytes
#              differ); racecheck and synccheck of the two-knob build as sm_120 on two goldens
#   mma99ncu   ncu --set full of one call of bf16_mma99 and of the two-knob build (natively, as the
#              bench forces them) on B=8 H=8 Q=33 P=8192: where a 16-key step's time goes
#   sglptx     bf16_mma, bf16_mma99 and SGLang's Triton kernel on the B=8 P=8192 cases, and the
#              tensor-core instructions in the PTX Triton compiled for SGLang (wgmma or mma.sync)
#   tests99    the GPU tests of tree_build and of isolation as sm_120; of isolation and the balanced
#              schedule natively
set -uo pipefail
out=${1:?usage: scripts/device-round.sh OUT [install|verifyab|verify90|chain|targets|ncuboost|sanitize90|hints|graphncu|mma99h128|mma99|refs|verify|verify99|sanitize99|e2e99|pytest90|pytest99|oob|serving|peers|knobs|ab|split|m99rows|tests99|ncu|sglptx|timeline|chunks|segments|segquick|mma99ab|mma99ncu|first]...}
shift
parts=${*:-install verifyab chain graphncu sanitize90}
rec=/tmp/device-round-records
rm -rf "$rec"                  # a machine lent before may hold another session's records
mkdir -p "$out" "$rec"
source scripts/device-lib.sh
want() { [[ " $parts " == *" $1 "* ]]; }
unset KDTREE_GPU
serving=specs/bench/verify_attn_serving.yaml
ab_suite=specs/ab/wgmma2_vs_flashmla.yaml
new_wgmma2=bf16_wgmma2:WG2_LPT=1,WG2_PDL=1,WG2_STAGED_STORE=1
seg_prefetch=bf16_wgmma2:WG2_LPT=2,WG2_SEG_PREFETCH=1    # the segment schedule loading the next segment early
m99both=bf16_mma99:M99_SUM_SCATTER=1,M99_SKEW=1       # bf16_mma99's two session-21 knobs together
seg_builds=(--define bf16_wgmma2:WG2_LPT=2 --define "$seg_prefetch")      # the segment schedule, then prefetching
m99_builds=(--define bf16_mma99:M99_SUM_SCATTER=1 --define bf16_mma99:M99_SKEW=1 --define "$m99both")   # each, then both
wgmma2=(--no-baselines --no-sanity --kernel bf16_wgmma2 --impl flashmla -q)
mma99=(--no-baselines --no-sanity --no-back-to-back --kernel bf16_mma --kernel bf16_mma99 -q)   # same card, same run
pack() { tar -czf "$out/records.tgz.tmp" -C "$rec" . && mv "$out/records.tgz.tmp" "$out/records.tgz"; }
refs_done=
refs() { [ -n "$refs_done" ] || step 150 kd gen-refs -q; refs_done=1; }

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total --format=csv,noheader
want install && install_wheels
if want verifyab || want verify90; then
  step 50 kd gen-refs specs/verify_attn.yaml -j 16 -q
  step 45 kd verify goldens/verify_attn --backend cuda --trials 2 -q --json "$rec/verify-attn-native.json"
  want verifyab && KDTREE_GPU=sm_120 step 45 kd verify goldens/verify_attn --backend cuda --trials 2 -q \
      --json "$rec/verify-attn-as-sm120.json"
  step 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attn_launch.py \
      --junitxml "$rec/pytest-schedule-native.xml"
  pack
fi
if want chain; then
  # written under OUT itself: the record is rewritten after every case, so a call cut short keeps it
  step 170 kd bench "$serving" -k chain "${wgmma2[@]}" --define bf16_wgmma2:WG2_PDL=0,WG2_KV_HINT=0 \
      --define bf16_wgmma2:WG2_LPT=1 --time-limit 150 --json "$out/bench-chain.json"
  pack
fi
if want hints; then
  step 200 kd bench "$serving" -k chain "${wgmma2[@]}" --define bf16_wgmma2:WG2_KV_HINT=0 \
      --define bf16_wgmma2:WG2_KV_HINT=1 --time-limit 180 \
      --json "$out/bench-hints.json"
  pack
fi
if want mma99h128; then
  step 150 kd bench "$serving" -k '*h128*' "${mma99[@]}" --impl sglang_triton --time-limit 140 \
      --json "$rec/bench-mma99-h128.json"
  pack
fi
if want graphncu; then
  # back to back in a graph (no flush between calls): what a call reads from DRAM and hits in L2
  mkdir -p "$rec/ncu-graph"
  for c in b32_h8_q4_p4096_mixed_chain b8_h8_q4_p8192_chain; do
    step 45 python3 scripts/graph-overlap.py "$serving" "$c" --impl cuda --impl flashmla >> "$rec/ncu-graph/graph-overlap.jsonl"
    for impl in cuda flashmla; do
      step 80 ncu --graph-profiling graph --nvtx --nvtx-include "profile/" --clock-control none --cache-control none \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
          --csv python3 scripts/graph-overlap.py "$serving" "$c" --impl "$impl" --profile > "$rec/ncu-graph/$c-$impl.csv" 2>&1
    done
  done
  pack
fi
if want timeline; then
  # where a call's time goes back to back: kernel times and the gaps between them, from the trace
  for c in b32_h8_q4_p4096_mixed_chain b8_h8_q4_p8192_chain b1_h16_q4_p2048_chain b128_h16_q4_p16384_mixed_chain; do
    schedules=()
    [[ $c == *mixed* ]] && schedules=(--define bf16_wgmma2:WG2_LPT=1 "${seg_builds[@]}")
    step 60 python3 scripts/graph-overlap.py "$serving" "$c" --impl cuda --impl flashmla "${schedules[@]}" \
        --timeline >> "$rec/timeline.jsonl"
  done
  pack
fi
# the schedules' GPU tests (fresh inputs, poisoned outputs) under LIMIT seconds, pytest's ARGS added;
# true when every one passed
seg_tests_pass() { local limit=$1; shift
  step "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attn_launch.py "$@" \
      --junitxml "$rec/pytest-segments.xml"
  pack
  grep -q 'errors="0" failures="0"' "$rec/pytest-segments.xml" 2>/dev/null; }
if want first; then
  # the two open A/Bs in one short call (about 4 minutes, no wheels): the segment tests, then the
  # mixed chain cases with the default, WG2_LPT=2 and the prefetch; bf16_mma99's three builds
  if seg_tests_pass 60 -k seg; then
    step 60 kd bench "$serving" -k mixed_chain --no-baselines --no-sanity --kernel bf16_wgmma2 -q \
        "${seg_builds[@]}" --time-limit 45 --json "$out/bench-segments-mixed.json"
  fi
  step 90 kd bench results/suites/mma99-8x.yaml "${mma99[@]}" "${m99_builds[@]}" --time-limit 75 \
      --json "$out/bench-mma99-ab.json"
  pack
fi
if want segments; then
  # the GPU tests first; the bench only if they pass (every row's outputs are checked there too);
  # then every golden and the sanitizers, packed part by part (a call cut short keeps what ended)
  if seg_tests_pass 160; then
    # the mixed chain cases, then batches of equal requests (B=8, B=32 H=16: does it cost there?)
    for sel in "mixed:${SEGMENTS_CASES:-mixed_chain}" "b8:b8_*chain" "b32:b32_h16*chain"; do
      step 100 kd bench "$serving" -k "${sel#*:}" "${wgmma2[@]}" --define bf16_wgmma2:WG2_LPT=1 \
          "${seg_builds[@]}" --time-limit "${SEGMENTS_SECONDS:-60}" --json "$out/bench-segments-${sel%%:*}.json"
    done
  else
    echo "== segments: the GPU tests did not all pass: no bench"
  fi
  [ -e goldens/verify_attn/bf16_paged_b4_h16_p1024_n16_mixed.kdtr ] || step 50 kd gen-refs specs/verify_attn.yaml -j 16 -q
  for build in bf16_wgmma2:WG2_LPT=2 "$seg_prefetch"; do
    tag=${build//[^A-Za-z0-9]/-}
    step 60 kd verify goldens/verify_attn --backend cuda --define "$build" --trials 2 -q --json "$rec/verify-attn-$tag.json"
    pack
  done
  pick_goldens goldens-sanitize-seg verify_attn/bf16_paged_b4_h16_p1024_n16_mixed \
      verify_attn/bf16_paged_b3_h128_p100_n1_mixed_chain_pages64
  for run in "$seg_prefetch racecheck" "$seg_prefetch synccheck" "$seg_prefetch memcheck" \
             "bf16_wgmma2:WG2_LPT=2 racecheck" "bf16_wgmma2:WG2_LPT=2 synccheck"; do
    read -r build tool <<< "$run"
    step 90 kd verify goldens-sanitize-seg --define "$build" --sanitize "$tool" -q \
        --json "$rec/sanitize-${build//[^A-Za-z0-9]/-}-$tool.json"
    pack
  done
fi
if want segquick; then
  # the segments part cut to a short call: its GPU tests, the mixed chain cases, racecheck on one golden
  if seg_tests_pass 60 -k seg; then
    step 70 kd bench "$serving" -k mixed_chain "${wgmma2[@]}" "${seg_builds[@]}" --time-limit 45 \
        --json "$out/bench-segments-mixed.json"
  fi
  [ -e goldens/verify_attn/bf16_paged_b4_h16_p1024_n16_mixed.kdtr ] || step 50 kd gen-refs specs/verify_attn.yaml -j 16 -q
  pick_goldens goldens-sanitize-seg verify_attn/bf16_paged_b4_h16_p1024_n16_mixed
  step 60 kd verify goldens-sanitize-seg --define "$seg_prefetch" --sanitize racecheck -q \
      --json "$rec/sanitize-segments-racecheck.json"
  pack
fi
if want chunks; then
  # does a chunk under the even share (two or three waves, longest first) balance the mixed batches better?
  lpt=bf16_wgmma2:WG2_LPT=1
  for sweep in "b32_h8_q4_p4096_mixed_chain 256 384 768 1024" "b128_h16_q4_p16384_mixed_chain 2048 3072 4096 6144"; do
    read -r c chunks <<< "$sweep"
    defs=(--define "$lpt")
    for n in $chunks; do defs+=(--define "$lpt,CHUNK=$n"); done
    step 100 kd bench "$serving" -k "$c" "${wgmma2[@]}" "${defs[@]}" --time-limit 90 \
        --json "$rec/bench-chunks-${c%%_*}.json"
    pack
  done
fi
if want targets; then
  step 150 kd bench results/suites/targets.yaml --no-baselines --no-sanity --time-limit 130 -q \
      --json "$rec/bench-targets.json"
  pack
fi
if want ncuboost; then
  # at the clocks the bench runs at (ncu's default locks the base clock, which slowed FlashMLA more
  # than ours in session 16's profile): kernel times with caches flushed, then the sections
  mkdir -p "$rec/ncu-boost"
  gmma=$(ncu --query-metrics 2>/dev/null | awk '/pipe_tensor_op_gmma.*cycles_active/{print $1; exit}')
  echo "== tensor pipe metric: ${gmma:-none found}"
  for c in b32_h8_q4_p4096_mixed_chain b8_h8_q4_p8192_chain; do
    for impl in cuda flashmla; do
      step 45 ncu --clock-control none --kernel-name regex:'verify_attn|flash|mla' --launch-count 8 \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second --csv \
          python3 scripts/launch-case.py --times 4 --impl "$impl" "$serving" "$c" > "$rec/ncu-boost/$c-$impl-time.csv" 2>&1
    done
  done
  for c in b32_h8_q4_p4096_mixed_chain b8_h8_q4_p8192_chain b1_h16_q4_p2048_chain; do
    step 60 python3 scripts/graph-overlap.py "$serving" "$c" --impl cuda --impl flashmla \
        >> "$rec/ncu-boost/graph-overlap.jsonl"
  done
  for impl in cuda flashmla; do
    step 60 ncu --clock-control none --kernel-name regex:'verify_attn|flash_fwd' --launch-count 2 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats ${gmma:+--metrics "$gmma.avg.pct_of_peak_sustained_active"} \
        --csv --page details python3 scripts/launch-case.py --times 2 --impl "$impl" "$serving" \
        b8_h8_q4_p8192_chain > "$rec/ncu-boost/b8_h8_q4_p8192_chain-$impl-sections.csv" 2>&1
  done
  pack
fi
if want sanitize90; then
  [ -e goldens/verify_attn/bf16_paged_b2_h16_p2048_n16.kdtr ] || step 50 kd gen-refs specs/verify_attn.yaml -j 16 -q
  pick_goldens goldens-sanitize-90 verify_attn/bf16_paged_b2_h16_p2048_n16 verify_attn/bf16_paged_b4_h16_p1024_n16_mixed
  for tool in racecheck synccheck memcheck; do
    step 60 kd verify goldens-sanitize-90 --sanitize "$tool" -q --json "$rec/sanitize-native-$tool.json"
  done
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
      tests/kernels/test_attn_launch.py --junitxml "$rec/pytest-isolation-schedule-native.xml"
  pack
fi
if want sglptx; then
  # which tensor-core instructions SGLang's Triton kernel runs here (Triton's cache: its PTX), beside
  # bf16_mma99 (mma.sync; launched natively here, not as sm_120) on the B=8 P=8192 cases, two of
  # them at Q·H >= 136 where the 99 KB kernel misses 8x
  export TRITON_CACHE_DIR=/tmp/triton-sglptx
  rm -rf "$TRITON_CACHE_DIR"
  step 120 kd bench "$serving" -k 'b8_h*_p8192*' "${mma99[@]}" --impl sglang_triton --time-limit 100 \
      --json "$rec/bench-sglptx.json"
  find "$TRITON_CACHE_DIR" -name '*.ptx' | while read -r f; do
    echo "$(basename "$f") wgmma=$(grep -c 'wgmma.mma_async' "$f") mma.sync=$(grep -c 'mma.sync' "$f") target=$(grep -m1 '^.target' "$f")"
  done | tee "$rec/sglang-triton-ptx.txt"
  unset TRITON_CACHE_DIR
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
if want mma99ab; then
  [ -e goldens/verify_attn/bf16_paged_b4_h16_p1024_n16_mixed.kdtr ] || step 50 kd gen-refs specs/verify_attn.yaml -j 16 -q
  # the two-knob build runs both new paths; the bench below checks each build's bytes against the default's
  KDTREE_GPU=sm_120 step 60 kd verify goldens/verify_attn -k 'bf16_paged*' --define "$m99both" --trials 2 -q \
      --json "$rec/verify-as-sm120-m99both.json"
  pack
  step 170 kd bench results/suites/mma99-8x.yaml "${mma99[@]}" "${m99_builds[@]}" --impl sglang_triton \
      --time-limit 150 --json "$out/bench-mma99-ab.json"
  pack
  pick_goldens goldens-sanitize-m99 verify_attn/bf16_paged_b2_h16_p2048_n16 verify_attn/bf16_paged_b4_h16_p1024_n16_mixed
  for tool in racecheck synccheck; do
    KDTREE_GPU=sm_120 step 75 kd verify goldens-sanitize-m99 --define "$m99both" --sanitize "$tool" -q \
        --json "$rec/sanitize-as-sm120-m99both-$tool.json"
  done
  pack
fi
if want mma99ncu; then
  mkdir -p "$rec/ncu-mma99"
  for flag in --kernel=bf16_mma99 --define="$m99both"; do
    build=${flag#*=}
    step 150 ncu --kernel-name verify_attn_bf16_mma99 --launch-skip 1 --launch-count 1 --set full --csv \
        --page details python3 scripts/launch-case.py --times 2 "$flag" "$serving" b8_h8_q33_p8192 \
        > "$rec/ncu-mma99/b8_h8_q33_p8192-${build//[:=,]/-}.csv" 2>&1
    gzip -f "$rec/ncu-mma99/b8_h8_q33_p8192-${build//[:=,]/-}.csv"
    pack
  done
fi
if want m99rows; then
  step 115 kd bench "$serving" "${mma99[@]}" --define bf16_mma99:M99_ROWS=32 --time-limit 100 \
      --json "$out/bench-mma99-rows.json"
  pack
fi
if want mma99; then
  step 115 kd bench "$serving" "${mma99[@]}" --impl sglang_triton --time-limit 100 \
      --json "$rec/bench-mma99.json"
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
if want pytest90; then
  refs
  step 280 python3 -m pytest -q -m gpu -p no:cacheprovider --junitxml "$rec/pytest-gpu-native.xml"
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
