#!/usr/bin/env bash
# Session 7, call 7: the bench record at commit b84ae0f (fp32_bf16x3 v6 the fp32 default), and doctor.
set -u
export PYTHONPATH=. KDTREE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
python3 -m cli doctor --json "$OUT/r/doctor.json" > /dev/null 2> "$OUT/r/doctor.err"; echo "doctor rc=$?"
timeout 450 python3 -m cli bench --repeat --time-limit 340 --json "$OUT/r/bench.json" --csv "$OUT/r/bench.csv" > "$OUT/r/bench.log" 2>&1; echo "bench rc=$?"; tail -30 "$OUT/r/bench.log"
cd "$OUT" && tar czf call7.tgz r && rm -rf r
