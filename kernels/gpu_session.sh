#!/usr/bin/env bash
# One device call for the kernels work: (0) GPU facts, (1) a smoke run of the non-default kernels
# with a hard timeout (a hung kernel is left out of the rest), (2) the GPU kernel tests on fresh
# seeds with poisoned outputs, every kernel variant, (3) the timings, old and new kernels side by
# side in one process (CUDA-graph replay, clocks warmed first). Logs go to $OUT (device tool).
#   bash kernels/gpu_session.sh     # env: PYTEST_ARGS (default -x), PYTEST_K (a -k filter), RACECHECK_K, *_TIMEOUT
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
export KDTREE_TEST_SEED="${KDTREE_TEST_SEED:-$(python3 -c 'import secrets; print(secrets.randbelow(1 << 31))')}"
OUT="${OUT:-/tmp/kdtree_out}"
mkdir -p "$OUT"
echo "seed $KDTREE_TEST_SEED"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,driver_version --format=csv \
    2>&1 | tee "$OUT/smi.txt"

timeout "${SMOKE_TIMEOUT:-60}" python3 tests/test_cuda_kernels.py --smoke 2>&1 | tee "$OUT/smoke.log"
rc=${PIPESTATUS[0]}
echo "smoke rc=$rc"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    export KDTREE_SKIP_KERNELS="bf16_wgmma2"         # hung: keep it out of the tests and timings
    echo "smoke timed out: KDTREE_SKIP_KERNELS=$KDTREE_SKIP_KERNELS"
fi

timeout "${TEST_TIMEOUT:-150}" python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider \
    ${PYTEST_ARGS:--x} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/tests.log" | grep -v "^\(\.\|s\)*\( *\[ *[0-9]*%\]\)\?$" | tail -60
echo "tests rc=${PIPESTATUS[0]}"

timeout "${BENCH_TIMEOUT:-150}" python3 tests/test_cuda_kernels.py --bench > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
sed -n '/^summary/,$p' "$OUT/bench.log"
# (4) racecheck of the kernels named in RACECHECK_K (a pytest -k filter over small GPU tests)
if [ -n "${RACECHECK_K:-}" ]; then
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout "${RACECHECK_TIMEOUT:-120}" "$cs" --tool racecheck --report-api-errors no \
        python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider -k "$RACECHECK_K" > "$OUT/racecheck.log" 2>&1
    echo "racecheck rc=$?"
    grep -E "RACECHECK SUMMARY|passed|failed|Error|Hazard" "$OUT/racecheck.log" | sort | uniq -c | head -20
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1 | tee -a "$OUT/smi.txt"
