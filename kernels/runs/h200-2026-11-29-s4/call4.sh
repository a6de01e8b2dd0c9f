#!/usr/bin/env bash
# Session 4, call 4: TB_LEAN=1 by default and BAR_FULL through one instruction (call3's synccheck
# reported divergent threads at the two bar.sync sites): tests, synccheck and racecheck, the A/B.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s4
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build" > "$OUT/tests-default.log" 2>&1; tail -1 "$OUT/tests-default.log"
el tests prefetch; KDTREE_TEST_DEFINES="tb_sorted:TB_LEAN=0" timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build" > "$OUT/tests-prefetch.log" 2>&1; tail -1 "$OUT/tests-prefetch.log"
for tool in synccheck racecheck; do
  el "$tool"; timeout 150 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tb_sorted" > "$OUT/$tool-default.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool-default.log" | tail -2
done
el tb_stream; timeout 200 python3 $D/tb_stream.py > "$OUT/tb_stream.log" 2>&1; tail -16 "$OUT/tb_stream.log"
el done
cd "$OUT" && tar czf call4.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call4.tgz -delete
