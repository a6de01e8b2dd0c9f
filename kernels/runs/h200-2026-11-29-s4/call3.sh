#!/usr/bin/env bash
# Session 4, call 3: tb_sorted with the streamed epilogue v2 (no trailing barriers) and the redo from the first flagged pop.
# Correctness first (GPU tests at the defaults and with each knob off, the exact pop forced, TB_CK=2
# for many chunks; the four sanitizers over the tb_sorted tests), then TB_PROFILE and the A/B timing.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s4
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tests() {  # name, defines
  el "tests $1"; KDTREE_TEST_DEFINES="$2" timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build" > "$OUT/tests-$1.log" 2>&1; tail -1 "$OUT/tests-$1.log"
}
tests default ""
tests s0 "tb_sorted:TB_STREAM=0"
tests lean "tb_sorted:TB_LEAN=1"
tests exact "tb_sorted:TB_FORCE_EXACT=1"
tests ck2 "tb_sorted:TB_CK=2"
for tool in racecheck synccheck memcheck initcheck; do
  vs="default ck2"; [ $tool = racecheck ] && vs="default ck2 s0"
  for v in $vs; do
    defs=""; [ $v = ck2 ] && defs="tb_sorted:TB_CK=2"; [ $v = s0 ] && defs="tb_sorted:TB_STREAM=0"
    el "$tool $v"; KDTREE_TEST_DEFINES="$defs" timeout 150 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tb_sorted" > "$OUT/$tool-$v.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool-$v.log" | tail -2
  done
done
el tb_profile; timeout 60 python3 kernels/runs/h200-2026-11-29-s3/tb_profile.py > "$OUT/tb_profile.log" 2>&1; tail -6 "$OUT/tb_profile.log"
el tb_stream; timeout 200 python3 $D/tb_stream.py > "$OUT/tb_stream.log" 2>&1; tail -16 "$OUT/tb_stream.log"
el done
cd "$OUT" && tar czf call3.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call3.tgz -delete
