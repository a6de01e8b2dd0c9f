#!/usr/bin/env bash
# Session 8, call 4: v8 committed (931e9a7) + the fp32 merges' first batch of o rows loaded together
# with m and l (one round trip fewer; the same arithmetic). GPU tests of every fp32 kernel (their merges
# changed); A/B v6 / cur / cur_plain / fp32_dmma, outputs compared bit for bit; timeline (the merge's
# duration against calls 1-3's 3.17-3.49 us); ncu per-instruction warp-stall samples of the main kernel
# (SASS page as CSV) to see where each warp role waits.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s8
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
el tests; timeout 200 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32" > "$OUT/tests.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/tests.log"
export AB_RUNS='[["v6", null, null], ["cur", null, null], ["cur_plain", null, null], ["fp32_dmma", null, null]]'
el ab; AB_JSON=ab.json timeout 120 python3 $D/ab.py > "$OUT/ab.log" 2>&1; echo "rc=$?"; tail -5 "$OUT/ab.log"; grep "round 0" "$OUT/ab.log"
el prof; PROF_ENTRIES='["cur_plain", "cur"]' timeout 90 python3 $D/prof.py > "$OUT/prof.log" 2>&1; echo "rc=$?"; grep -E "^== |^  verify" "$OUT/prof.log" | tail -22
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
el "ncu source"; timeout 150 "$NCU" --clock-control none -k "regex:^verify_attn_fp32_bf16x3$" -s 2 -c 1 --section SourceCounters --section WarpStateStats -o "$OUT/rep" python3 $D/once.py > "$OUT/ncu_src.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/ncu_src.log"
timeout 60 "$NCU" -i "$OUT/rep.ncu-rep" --page source --csv --print-source sass > "$OUT/sass.csv" 2> "$OUT/sass.err"; echo "rc=$? $(wc -l < "$OUT/sass.csv") lines"; head -c 600 "$OUT/sass.csv"; head -3 "$OUT/sass.err"
timeout 60 "$NCU" -i "$OUT/rep.ncu-rep" --page details --csv > "$OUT/details.csv" 2>&1; grep -i "stall\|warp cycles" "$OUT/details.csv" | head -30
el done
cd "$OUT" && tar czf call4.tgz *.log *.json *.csv *.err 2>/dev/null && find . -maxdepth 1 -type f ! -name call4.tgz -delete
