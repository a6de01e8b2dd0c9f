#!/usr/bin/env bash
# Session 8, call 6: at the commit of v10 with the register split 104/240/64 (O/S/softmax; call 5 ran
# 120/192/80, where the S warps' code used at most R170): GPU tests; A/B v8 / cur / cur at 120/192/80,
# outputs compared bit for bit; racecheck, synccheck; doctor; the bench record (results/).
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s8
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 100 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/tests.log"
export AB_RUNS='[["v8", null, null], ["cur", null, null], ["cur", null, {"FX_NREG_O": 120, "FX_NREG_S": 192, "FX_NREG_SM": 80}]]'
el ab; AB_JSON=ab.json timeout 100 python3 $D/ab.py > "$OUT/ab.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/ab.log"; grep "round 0" "$OUT/ab.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 80 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
mkdir -p "$OUT/r"
el doctor; python3 -m cli doctor --json "$OUT/r/doctor.json" > /dev/null 2> "$OUT/r/doctor.err"; echo "doctor rc=$?"
el bench; timeout 440 python3 -m cli bench --repeat --time-limit 400 --json "$OUT/r/bench.json" --csv "$OUT/r/bench.csv" > "$OUT/r/bench.log" 2>&1; echo "bench rc=$?"; grep -v "^bench \[\|Warning\|warn\|W1129\|^ \|^$\|This call" "$OUT/r/bench.log" | tail -40
el done
cd "$OUT" && tar czf call6.tgz *.log *.json r 2>/dev/null && rm -rf r && find . -maxdepth 1 -type f ! -name call6.tgz -delete
