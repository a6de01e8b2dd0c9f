#!/usr/bin/env bash
# bf16_wgmma2's knobs of session 15 (kernels/NOTES.md) on a lent H100/H200, from the repo root (no
# install of kdtree: PYTHONPATH=.); carry .whl (scripts/fetch-device-wheels.sh) for FlashMLA.
#   scripts/device-ab-wgmma2.sh OUT [part…]      (no part: the default order, which fits one 10-minute call)
# install  FlashMLA's and SGLang's wheels into /tmp/site
# ab       specs/ab/wgmma2_vs_flashmla.yaml (issue 37's chain shapes and four more mixed batches): the
#          new default, the f651642 kernel (WG2_LPT=0,WG2_PDL=0,WG2_STAGED_STORE=0: the same SASS) and
#          FlashMLA, one timing plan a case
# knobs    one knob at a time against the default: PDL and the staged epilogue on the one-request
#          cases, the balanced schedule on the mixed ones (WG2_STAGED_STORE=0 must give the same bytes)
# verify   the bf16_paged goldens (gen-refs of that variant) with --trials 3, the new default build
# pytest   the GPU tests of the balanced launch and of bf16_wgmma2 (forced splits, graph capture)
# Records go to OUT/records (each bench rewritten after every case), the log to OUT/log.
set -uo pipefail
out=${1:?usage: scripts/device-ab-wgmma2.sh OUT [install|ab|knobs|verify|pytest]...}
shift
parts=${*:-install ab knobs verify pytest}
rec="$out/records"
mkdir -p "$rec"
source scripts/device-lib.sh
suite=specs/ab/wgmma2_vs_flashmla.yaml
old=bf16_wgmma2:WG2_LPT=0,WG2_PDL=0,WG2_STAGED_STORE=0
bench=(kd bench "$suite" --no-baselines --no-sanity --kernel bf16_wgmma2 -q)

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
want install && install_wheels
if want ab; then
  step 230 "${bench[@]}" --define "$old" --impl flashmla --time-limit 210 --json "$rec/ab.json"
fi
if want knobs; then
  step 60 "${bench[@]}" -k 'b1_h*_p2*' --define bf16_wgmma2:WG2_PDL=0 --define bf16_wgmma2:WG2_STAGED_STORE=0 \
      --impl flashmla --time-limit 50 --json "$rec/knobs-small.json"
  step 70 "${bench[@]}" -k '*mixed*' --define bf16_wgmma2:WG2_LPT=0 --impl flashmla --time-limit 60 --json "$rec/knobs-mixed.json"
fi
if want verify; then
  step 60 kd gen-refs specs/verify_attn.yaml -k bf16_paged -j 16 -q
  step 70 kd verify goldens/verify_attn -k bf16_paged --backend cuda --trials 3 -q --json "$rec/verify.json"
fi
if want pytest; then
  step 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attn_schedule.py \
      tests/kernels/test_cuda_kernels.py -k "wgmma2 or balanced or graph" --junitxml "$rec/pytest-gpu.xml"
fi
} 2>&1 | tee -a "$out/log"
