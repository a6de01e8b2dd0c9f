#!/usr/bin/env bash
# Session 6, call 11: fp32_bf16x3 v3 with an mbarrier instead of its closing named barrier
# (fx_v3fin.py): the checks at three shapes under racecheck and synccheck, then the A/B against v4
# and fp32_dmma.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s6
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
el once; timeout 60 python3 $D/fx_v3fin.py once 2>&1 | tee "$OUT/once.log" | tail -4
for tool in racecheck synccheck; do
  el "$tool"; timeout 100 "$cs" --tool $tool --report-api-errors no python3 $D/fx_v3fin.py once > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|rel_l2" "$OUT/$tool.log" | tail -4
done
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3_v3fin", null, null]]'
el ab; FD_JSON=fx_ab.json timeout 100 python3 $D/fx_v3fin.py ab > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/fx_ab.log"; grep "round 0" "$OUT/fx_ab.log"
el done
cd "$OUT" && tar czf call11.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call11.tgz -delete
