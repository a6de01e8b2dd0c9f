"""scripts/launch-case.py (the profilers' target): one line and exit 2 for a bad case or no GPU."""

import subprocess
import sys

import pytest

from kdtr.config import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "launch-case.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


@pytest.mark.parametrize("case", ["b*", "nothing_*"])
def test_a_case_name_must_match_one_case(case):
    from kdtr.bundle.spec import load_suite, select

    matches = len(select(load_suite(REPO_ROOT / "specs/bench/verify_attn.yaml").cases, case))
    assert matches != 1
    done = run("specs/bench/verify_attn.yaml", case)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"matches {matches} cases, not one" in done.stderr


def test_a_missing_suite_is_one_line():
    done = run("no-such-suite.yaml", "x")
    assert done.returncode == 2 and "no-such-suite.yaml" in done.stderr and "Traceback" not in done.stderr


def test_without_a_gpu_it_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would launch")
    done = run("specs/bench/verify_attn.yaml", "b64_h16_q65_p32768")
    assert done.returncode == 2 and done.stderr == "launch-case: no CUDA GPU (torch.cuda.is_available() is False)\n"


def test_graph_overlap_takes_the_same_case_argument():
    """scripts/graph-overlap.py picks its case as launch-case.py does (scripts/suite_case.py)."""
    script = REPO_ROOT / "scripts" / "graph-overlap.py"
    done = subprocess.run([sys.executable, str(script), "specs/bench/verify_attn_serving.yaml", "b*"],
                          capture_output=True, text=True, cwd=REPO_ROOT,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("graph-overlap: ") and done.stderr.count("\n") == 1
    assert "matches" in done.stderr and "not one" in done.stderr


@pytest.mark.parametrize("flag,says", [("--define=bf16_wgmma2:WG2_LPT=3", "WG2_LPT=3: a launch knob takes"),
                                       ("--define=no_such_kernel:X=1", "unknown kernel 'no_such_kernel'"),
                                       ("--impl=no_such_impl", "unknown implementation 'no_such_impl'")])
def test_graph_overlap_refuses_a_bad_build_in_one_line(flag, says):
    """--impl and --define (a forced build of ours, as `kdtree bench --define` takes it) are checked
    before the case is generated or a GPU is looked for."""
    script = REPO_ROOT / "scripts" / "graph-overlap.py"
    done = subprocess.run([sys.executable, str(script), "specs/bench/verify_attn_serving.yaml",
                           "b8_h8_q4_p8192_chain", flag], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("graph-overlap: ") and done.stderr.count("\n") == 1
    assert says in done.stderr, done.stderr


@pytest.mark.parametrize("flags,says", [(["--define=bf16_mma99:M99_ROWS=x"], "M99_ROWS=x: a launch knob takes"),
                                        (["--kernel=no_such_kernel"], "unknown kernel 'no_such_kernel'"),
                                        (["--kernel=bf16_mma", "--define=bf16_mma99:M99_SUM_SCATTER=1"],
                                         "one build at a time"),
                                        (["--impl=no_such_impl"], "unknown implementation 'no_such_impl'")])
def test_launch_case_refuses_a_bad_build_in_one_line(flags, says):
    """A forced build (what ncu profiles in scripts/device-round.sh) is checked before the case is
    generated or a GPU is looked for."""
    done = run("specs/bench/verify_attn_serving.yaml", "b8_h8_q33_p8192", *flags)
    assert done.returncode == 2 and done.stderr.startswith("launch-case: ") and done.stderr.count("\n") == 1
    assert says in done.stderr, done.stderr
