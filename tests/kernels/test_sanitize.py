"""Parsing compute-sanitizer output into per-case verdicts (synthetic streams; the real runs are on the GPU)."""

from __future__ import annotations

from kdtr.runtime.sanitize import SanitizeResult, parse

CLEAN = """\
========= COMPUTE-SANITIZER
PASS tree_build/default example_a max_abs=0 rel_l2=0
PASS tree_build/default example_b max_abs=0 rel_l2=0
2 passed, 0 failed
========= ERROR SUMMARY: 0 errors
"""

DIRTY = """\
========= COMPUTE-SANITIZER
PASS tree_build/default example_a max_abs=0 rel_l2=0
========= Invalid __global__ read of size 4 bytes
=========     at verify_attn_fp32+0x1a0 in verify_attn_fp32.cu:88
=========     by thread (3,0,0) in block (0,0,0)
PASS verify_attn/fp32 b2_h8 max_abs=1e-7 rel_l2=2e-7
1 passed, 0 failed
========= ERROR SUMMARY: 1 error
"""

RACE = """\
PASS tree_accept/default x max_abs=0 rel_l2=0
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""


def test_clean_run_passes():
    result = SanitizeResult("memcheck")
    cases = list(parse(CLEAN.splitlines(), "memcheck", result))
    assert [c.passed for c in cases] == [True, True] and result.errors == 0 and result.passed


def test_a_report_fails_the_case_it_happened_in_even_when_verify_passed():
    result = SanitizeResult("memcheck")
    cases = list(parse(DIRTY.splitlines(), "memcheck", result))
    assert [c.passed for c in cases] == [True, False]
    assert "Invalid __global__ read" in cases[1].reports[0]
    assert result.errors == 1 and not result.passed


def test_racecheck_summary_and_missing_summary():
    result = SanitizeResult("racecheck")
    list(parse(RACE.splitlines(), "racecheck", result))
    assert result.errors == 0 and result.passed
    silent = SanitizeResult("memcheck")
    list(parse(["PASS a/b c max_abs=0 rel_l2=0"], "memcheck", silent))
    assert silent.errors is None and not silent.passed        # no summary: never a pass
