#!/usr/bin/env bash
# Session 7, call 9: fp32_bf16x3 with 2-CTA clusters sharing the K-piece loads (multicast): GPU tests,
# the A/B against the unclustered kernel (FX_CLUSTER=1) and fp32_dmma, verify --trials 20 on the fp32
# suites with it forced, racecheck and synccheck. Each step only if the one before passed.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
D=kernels/runs/h200-2026-11-29-s7
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
go() {
el tests; timeout 45 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -x -k "fp32_bf16x3" > "$OUT/tests.log" 2>&1 || { tail -30 "$OUT/tests.log"; return 1; }; tail -1 "$OUT/tests.log"
export FD_RUNS='[["fp32_dmma", null, null], ["fp32_bf16x3", null, null], ["fp32_bf16x3_c1", null, {"FX_CLUSTER": 1}]]'
el ab; FD_JSON=fx_ab.json timeout 45 python3 $D/fx_ab.py > "$OUT/fx_ab.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/fx_ab.log"; grep "round 0" "$OUT/fx_ab.log"
el verify; timeout 25 python3 -m cli gen-refs -q specs/verify_attn.yaml > "$OUT/gen.log" 2>&1; timeout 60 python3 -m cli verify goldens/verify_attn -k fp32 --backend cuda --trials 20 --kernel fp32_bf16x3 -q --json "$OUT/verify-fp32-bf16x3.json" > "$OUT/verify.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/verify.log"
for tool in racecheck synccheck; do
  el "$tool"; timeout 55 "$cs" --tool $tool --report-api-errors no python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_bf16x3 and forced_splits" > "$OUT/$tool.log" 2>&1; echo "rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
}
go; el done
cd "$OUT" && tar czf call9.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name call9.tgz -delete
