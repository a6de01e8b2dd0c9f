#!/usr/bin/env bash
# Longer coverage-guided fuzzing of both KDTR readers than CI's 40 s (tests/format/test_fuzz.py):
#   scripts/fuzz.sh [SECONDS]      default 600 per fuzzer; the two run side by side (2 cores)
# kdtr.h under libFuzzer with ASan/UBSan (tests/format/fuzz/fuzz_kdtr_h.c, needs clang) and kdtr.bundle.format
# under atheris (tests/format/fuzz/fuzz_format.py, in the dev extra). Corpora grow in .cache/fuzz/<name>/
# across runs; a finding's input lands in .cache/fuzz/<name>/artifacts/ and the exit status is 1.
# Prints one line per fuzzer: executions, rate, corpus size, verdict. Replay one input with
#   .cache/fuzz/fuzz_kdtr_h INPUT     or     .venv/bin/python tests/format/fuzz/fuzz_format.py INPUT
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
case "$seconds" in
  ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;;
esac
exec "${KDTREE_VENV:-.venv}/bin/python" tests/format/fuzz/run.py --seconds "$seconds"
