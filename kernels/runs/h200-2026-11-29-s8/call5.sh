#!/usr/bin/env bash
# Session 8, call 5: v10 = v8 with (a) four softmax warps (warpgroup 3, two keys a thread; call 4's
# stall samples: the O warps wait on P_FULL 41% of their time, the lone softmax warp is never idle)
# and (b) on sm_90a a fourth K-piece slot in the Q tile's room once the S warps hold Q (the S warps
# wait on KP_FULL 34% of theirs). GPU tests; A/B v6 / v8 / cur / cur_plain / fp32_dmma (+ cur's FX_DIAG
# 1, 2) with outputs compared bit for bit; B=4 P=8192; timeline; racecheck, synccheck; stall samples.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s8
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el tests; timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -15 "$OUT/tests.log"
export AB_RUNS='[["v6", null, null], ["v8", null, null], ["cur", null, null], ["cur_plain", null, null], ["fp32_dmma", null, null], ["cur", null, {"FX_DIAG": 1}], ["cur", null, {"FX_DIAG": 2}]]'
el ab; AB_JSON=ab.json timeout 150 python3 $D/ab.py > "$OUT/ab.log" 2>&1; echo "rc=$?"; tail -9 "$OUT/ab.log"; grep "round 0" "$OUT/ab.log"
el prof; PROF_ENTRIES='["cur_plain", "v8"]' timeout 90 python3 $D/prof.py > "$OUT/prof.log" 2>&1; echo "rc=$?"; grep -E "^== |^  verify" "$OUT/prof.log" | tail -22
export AB_RUNS='[["fp32_dmma", null, null], ["cur", null, null]]'
el "ab B=4 P=8192"; AB_SHAPE=4,16,8192,16 AB_JSON=ab_b4.json timeout 120 python3 $D/ab.py > "$OUT/ab_b4.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/ab_b4.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
el "ncu source"; timeout 150 "$NCU" --clock-control none -k "regex:^verify_attn_fp32_bf16x3$" -s 2 -c 1 --section SourceCounters --section WarpStateStats -o "$OUT/rep" python3 $D/once.py > "$OUT/ncu_src.log" 2>&1; echo "rc=$?"
timeout 60 "$NCU" -i "$OUT/rep.ncu-rep" --page source --csv --print-source sass > "$OUT/sass.csv" 2>/dev/null; python3 $D/stalls.py "$OUT/sass.csv"; gzip -9 "$OUT/sass.csv"; rm -f "$OUT/rep.ncu-rep"
el done
cd "$OUT" && tar czf call5.tgz *.log *.json *.gz 2>/dev/null && find . -maxdepth 1 -type f ! -name call5.tgz -delete
