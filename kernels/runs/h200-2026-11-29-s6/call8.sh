#!/usr/bin/env bash
# Session 6, call 8: fp32_bf16x3's GPU tests again at the committed code (its header and a host-figure
# guard changed since call 7), memcheck and initcheck over its forced-split tests, then the bench record
# (fp32_dmma still the fp32 default) and doctor.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
mkdir -p "$OUT/r"
el tests; timeout 100 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/r/tests.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/r/tests.log"
for tool in memcheck initcheck; do
  el "$tool"; timeout 120 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/r/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/r/$tool.log" | tail -2
done
el doctor; python3 -m cli doctor --json > "$OUT/r/doctor.json" 2> "$OUT/r/doctor.err"; echo "rc=$?"
el bench; timeout 400 python3 -m cli bench --repeat --time-limit 340 --json "$OUT/r/bench.json" --csv "$OUT/r/bench.csv" > "$OUT/r/bench.log" 2>&1; echo "rc=$?"; tail -25 "$OUT/r/bench.log"
el done
cd "$OUT" && tar czf call8.tgz r && rm -rf r
