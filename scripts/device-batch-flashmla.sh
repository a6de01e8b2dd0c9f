#!/usr/bin/env bash
# Issue 29 on the lent H200, from the repo root (no install of kdtree: PYTHONPATH=.); docs/flashmla.md
# and docs/timing.md say what each part shows.
#   scripts/device-batch-flashmla.sh OUT_DIR [install|verify|pytest|bench|neighbour|all]...
# install:   sgl-flash-mla, sglang and nvidia-ml-py from .whl/ (scripts/fetch-device-wheels.sh here,
#            then carry .whl; the machine reaches no index), into /tmp/site on PYTHONPATH. Every call
#            starts a bare machine, so each call's parts should include install.
# verify:    gen-refs of the default suites (the chain goldens among them), then verify -k chain on
#            our kernel and --against flashmla (parity record)
# pytest:    the GPU tests of the flashmla peer and of the bench's one-method timing
# bench:     the serving suite's chain cases: ours, flashmla and sglang_triton in one run, every row
#            captured into a CUDA graph, with telemetry and back-to-back figures
# neighbour: the 7-11% neighbour effect: the two seeds cases alone, beside sglang_triton, and beside
#            it with the SM clock locked at its base clock (--lock-clocks; refused where not allowed)
# Each part fits one 10-minute device call; records go to OUT_DIR/records and a log to OUT_DIR/log.
set -uo pipefail
out=${1:?usage: scripts/device-batch-flashmla.sh OUT_DIR [install|verify|pytest|bench|neighbour|all]...}
shift
parts=${*:-all}
rec="$out/records"
mkdir -p "$rec"
source scripts/device-lib.sh

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
if want install; then
  install_wheels
fi
if want verify; then
  step 240 python3 -m cli gen-refs -q
  step 120 python3 -m cli verify goldens/verify_attn -k chain --backend cuda -q --json "$rec/verify-chain-cuda.json"
  step 120 python3 -m cli verify goldens/verify_attn -k chain --backend cuda --against flashmla -q --json "$rec/verify-chain-flashmla.json"
fi
if want pytest; then
  step 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/impl/test_flashmla_peer.py tests/impl/test_gpu.py
fi
if want bench; then
  step 560 python3 -m cli bench specs/bench/verify_attn_serving.yaml -k chain --impl flashmla --impl sglang_triton \
      --no-sanity --time-limit 500 --json "$rec/bench-flashmla.json" --csv "$rec/bench-flashmla.csv" -q
fi
if want neighbour; then
  seeds=results/suites/seeds.yaml
  step 150 python3 -m cli bench "$seeds" -k _rec --no-baselines --no-sanity --json "$rec/neighbour-alone.json" -q
  step 200 python3 -m cli bench "$seeds" -k _rec --no-baselines --no-sanity --impl sglang_triton \
      --json "$rec/neighbour-sglang.json" -q
  step 200 python3 -m cli bench "$seeds" -k _rec --no-baselines --no-sanity --impl sglang_triton --lock-clocks \
      --json "$rec/neighbour-sglang-locked.json" -q
  nvidia-smi --query-gpu=clocks.sm,clocks.applications.graphics,power.draw --format=csv,noheader
fi
} 2>&1 | tee -a "$out/log"
