#!/usr/bin/env bash
# Next device call: tb_sorted TB_LEAN=1 (the next head's log-probs loaded after it is chosen; see the
# header of kernels/tree_build_fast.cu). Not yet run on a GPU. Correctness first (GPU tests with the
# knob, with the exact pop forced, racecheck over both), then the per-pop cycles (TB_PROFILE) and the
# timing of TB_LEAN 0 against 1 with outputs checked bit for bit.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/kdtree_out}"; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

el tests TB_LEAN=1; KDTREE_TEST_DEFINES="tb_sorted:TB_LEAN=1" timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build" > "$OUT/tests-lean.log" 2>&1; tail -2 "$OUT/tests-lean.log"
el tests TB_LEAN=1 exact; KDTREE_TEST_DEFINES="tb_sorted:TB_LEAN=1,TB_FORCE_EXACT=1" timeout 120 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tree_build and tb_sorted" > "$OUT/tests-lean-exact.log" 2>&1; tail -2 "$OUT/tests-lean-exact.log"
el racecheck TB_LEAN=1; KDTREE_TEST_DEFINES="tb_sorted:TB_LEAN=1" timeout 150 "$cs" --tool racecheck python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tb_sorted" > "$OUT/racecheck-lean.log" 2>&1; echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed" "$OUT/racecheck-lean.log" | tail -2
el racecheck TB_LEAN=1 exact; KDTREE_TEST_DEFINES="tb_sorted:TB_LEAN=1,TB_FORCE_EXACT=1" timeout 150 "$cs" --tool racecheck python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tb_sorted" > "$OUT/racecheck-lean-exact.log" 2>&1; echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed" "$OUT/racecheck-lean-exact.log" | tail -2
el memcheck TB_LEAN=1; KDTREE_TEST_DEFINES="tb_sorted:TB_LEAN=1" timeout 150 "$cs" --tool memcheck python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "tb_sorted" > "$OUT/memcheck-lean.log" 2>&1; echo "rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck-lean.log" | tail -2
el tb_profile default; timeout 60 python3 kernels/runs/h200-2026-11-29-s3/tb_profile.py > "$OUT/tb_profile.log" 2>&1; cp -f "$OUT/tb_profile.json" "$OUT/tb_profile-lean0.json" 2>/dev/null; tail -12 "$OUT/tb_profile.log"
el tb_profile TB_LEAN=1; TB_DEFINES="TB_LEAN=1" timeout 60 python3 kernels/runs/h200-2026-11-29-s3/tb_profile.py > "$OUT/tb_profile-lean.log" 2>&1; cp -f "$OUT/tb_profile.json" "$OUT/tb_profile-lean1.json" 2>/dev/null; tail -12 "$OUT/tb_profile-lean.log"
el tb_lean timing; timeout 120 python3 kernels/runs/next/tb_lean.py > "$OUT/tb_lean.log" 2>&1; tail -14 "$OUT/tb_lean.log"
el done
cd "$OUT" && tar czf tb_lean.tgz *.log *.json 2>/dev/null && find . -maxdepth 1 -type f ! -name tb_lean.tgz -delete
