#!/usr/bin/env bash
# Device call 3 (session 3): tb_sorted v4 (checkpoints, word-store epilogue) and fp32_gemm v2 on the H200 — probes, GPU tests (fresh seed,
# poisoned outputs; tree_build also with TB_FORCE_EXACT=1), racecheck of the two, timings side by side.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/kdtree_out}"; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

el tb_profile; timeout 60 python3 kernels/runs/h200-2026-11-29-s3/tb_profile.py > "$OUT/tb_profile.log" 2>&1; tail -25 "$OUT/tb_profile.log"
el exact-path tests; KDTREE_TEST_DEFINES="tb_sorted:TB_FORCE_EXACT=1" timeout 90 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build" > "$OUT/tests-exact.log" 2>&1; tail -2 "$OUT/tests-exact.log"
el tb_ck tests; for ck in 2 16; do KDTREE_TEST_DEFINES="tb_sorted:TB_CK=$ck" timeout 60 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build and tb_sorted" > "$OUT/tests-ck$ck.log" 2>&1; tail -1 "$OUT/tests-ck$ck.log"; done
el fp32_gemm knobs tests; KDTREE_TEST_DEFINES="fp32_gemm:FK_QB=1,FK_PB=1" timeout 60 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "fp32_gemm" > "$OUT/tests-fk.log" 2>&1; tail -2 "$OUT/tests-fk.log"
el session; RACECHECK_K="${RACECHECK_K:-fp32_gemm and forced_splits or tb_sorted and bit_exact}" TEST_TIMEOUT=170 BENCH_TIMEOUT=200 RACECHECK_TIMEOUT=90 bash kernels/gpu_session.sh
el done
# memcheck + synccheck over the two changed kernels' small tests
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck; do
  el $tool; timeout 70 "$cs" --tool $tool python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider \
      -k "fp32_gemm and forced_splits or tb_sorted and bit_exact" > "$OUT/$tool.log" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/$tool.log" | tail -2
done
el done
# the device returns at most 8 files: one archive
cd "$OUT" && tar czf call3.tgz *.log *.json *.txt 2>/dev/null && find . -maxdepth 1 -type f ! -name call3.tgz -delete
