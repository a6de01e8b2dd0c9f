#!/usr/bin/env bash
# bf16_wgmma2's knobs of session 15 (kernels/NOTES.md) on a lent H100/H200, from the repo root (no
# install of kdtree: PYTHONPATH=.); carry .whl (scripts/fetch-device-wheels.sh) for FlashMLA.
#   scripts/device-ab-wgmma2.sh OUT [part…]      (no part: the default order, which fits one 10-minute call)
# Every bench row of ours is the new default build beside the f651642 kernel ("old":
# WG2_LPT=0,WG2_PDL=0,WG2_STAGED_STORE=0, the same SASS) or one knob off, in one timing plan a case.
# default order:
#   install  FlashMLA's and SGLang's wheels into /tmp/site
#   chain    the serving suite's chain cases (issue 37's bar): new, old, FlashMLA
#   knobs    one knob at a time against the new default: PDL and the staged epilogue (which must give
#            the default's bytes) on the one-request cases of specs/ab/wgmma2_vs_flashmla.yaml, the
#            balanced schedule (WG2_LPT=0) on its mixed batches, FlashMLA beside
#   verify   the bf16_paged goldens (gen-refs of that variant), --trials 3, the new default build
#   pytest   the GPU tests of the balanced launch and of bf16_wgmma2 (forced splits, graph capture)
# more parts (name them; a second call):
#   ab       specs/ab/wgmma2_vs_flashmla.yaml (issue 37's table of chain shapes, 3 more mixed): new, old,
#            FlashMLA
# Records go to OUT/records (a bench rewrites its record after every case), the log to OUT/log.
set -uo pipefail
out=${1:?usage: scripts/device-ab-wgmma2.sh OUT [install|chain|knobs|verify|pytest|ab]...}
shift
parts=${*:-install chain knobs verify pytest}
rec="$out/records"
mkdir -p "$rec"
source scripts/device-lib.sh
suite=specs/ab/wgmma2_vs_flashmla.yaml
old=bf16_wgmma2:WG2_LPT=0,WG2_PDL=0,WG2_STAGED_STORE=0
ours=(--no-baselines --no-sanity --kernel bf16_wgmma2 --impl flashmla -q)

{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
want install && install_wheels
if want chain; then
  step 220 kd bench specs/bench/verify_attn_serving.yaml -k chain "${ours[@]}" --define "$old" --time-limit 200 \
      --json "$rec/chain.json"
fi
if want knobs; then
  step 50 kd bench "$suite" -k 'b1_h*_p2*' "${ours[@]}" --define bf16_wgmma2:WG2_PDL=0 \
      --define bf16_wgmma2:WG2_STAGED_STORE=0 --time-limit 40 --json "$rec/knobs-small.json"
  step 90 kd bench "$suite" -k '*mixed*' "${ours[@]}" --define bf16_wgmma2:WG2_LPT=0 --time-limit 80 \
      --json "$rec/knobs-mixed.json"
fi
if want verify; then
  step 50 kd gen-refs specs/verify_attn.yaml -k bf16_paged -j 16 -q
  step 70 kd verify goldens/verify_attn -k bf16_paged --backend cuda --trials 3 -q --json "$rec/verify.json"
fi
if want pytest; then
  step 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attn_schedule.py \
      tests/kernels/test_cuda_kernels.py -k "wgmma2 or balanced or graph" --junitxml "$rec/pytest-gpu.xml"
fi
if want ab; then
  step 540 kd bench "$suite" "${ours[@]}" --define "$old" --time-limit 520 --json "$rec/ab.json"
fi
} 2>&1 | tee -a "$out/log"
