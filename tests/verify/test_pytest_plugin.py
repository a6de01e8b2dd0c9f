"""`pytest --kdtree`: the plugin driven by pytest's own pytester, on small goldens made here."""

from __future__ import annotations

import shutil
from xml.etree import ElementTree

import pytest
# pytester's in-process runs drop the modules a run imported; torch (imported by the torch backend)
# must not be imported a second time into one process, so it is imported here, before any run
import torch  # noqa: F401

from kdtr import pytest_plugin

pytest_plugins = ["pytester"]

# five bundles: two tree_build, one tree_accept, two verify_attn (fp32 and bf16_paged)
SUITES = {
    "tree_build": "  - {batch: 3, depth: 4, vocab: 16, budget: 12}\n"
                  "  - {batch: 2, depth: 3, vocab: 8, budget: 6, quantize: 0.5}",
    "tree_accept": "  - {batch: 4, budget: 12, mode: mixed}",
    "verify_attn": "  - {variant: fp32, batch: 2, heads: 4, prefix: 20, budget: 6}\n"
                   "  - {variant: bf16_paged, batch: 2, heads: 4, prefix: 20, budget: 6, prefix_mode: mixed}",
}
BUNDLES = 5
# an --impl for verify_attn/fp32 that is wrong at one element of `out` (request 1, node 2, head 3)
WRONG = """\
import torch

def attend(inputs, params):
    from kdtr.ops import get_op
    out = get_op("verify_attn").run_torch("fp32", inputs, params)
    out = dict(out)
    bad = out["out"].clone()
    bad[1, 2, 3, 0] += 1.0
    out["out"] = bad
    return out
"""


@pytest.fixture(scope="module")
def made_goldens(tmp_path_factory):
    from typer.testing import CliRunner

    from cli.main import app

    base = tmp_path_factory.mktemp("plugin")
    specs = base / "specs"
    specs.mkdir()
    for op, cases in SUITES.items():
        (specs / f"{op}.yaml").write_text(f"op: {op}\nseed: 3\ncases:\n{cases}\n")
    result = CliRunner().invoke(app, ["gen-refs", str(specs), "-o", str(base / "goldens"), "-q"])
    assert result.exit_code == 0, result.output
    return base / "goldens"


@pytest.fixture
def goldens(made_goldens, pytester):
    """A copy of the goldens inside pytester's folder (a test may damage its copy)."""
    target = pytester.path / "goldens"
    shutil.copytree(made_goldens, target)
    return target


def test_one_item_per_bundle_and_all_pass(pytester, goldens, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "torch", "-v")
    result.assert_outcomes(passed=BUNDLES)
    result.stdout.fnmatch_lines(["*::tree_accept/b4_n12[[]torch[]] PASSED*",
                                 "*::tree_build/b2_l3_v8_n6_q0.5[[]torch[]] PASSED*",
                                 "*::verify_attn/bf16_paged_*[[]torch[]] PASSED*"])


def test_without_test_paths_only_the_bundles_are_collected(pytester, goldens):
    pytester.makepyfile(test_other="def test_unrelated():\n    assert False\n")
    pytester.makeini("[pytest]\ntestpaths = .\n")
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy", "--co", "-q")
    assert f"{BUNDLES} tests collected" in result.stdout.str()
    assert "test_unrelated" not in result.stdout.str()


def test_k_and_m_select(pytester, goldens):
    by_k = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy", "-k", "tree_accept", "-q")
    by_k.assert_outcomes(passed=1, deselected=BUNDLES - 1)
    by_m = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy", "-m", "bf16_paged", "-q")
    by_m.assert_outcomes(passed=1, deselected=BUNDLES - 1)
    by_op = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy", "-m", "tree_build", "-q")
    by_op.assert_outcomes(passed=2, deselected=BUNDLES - 2)


def test_junitxml_lists_each_bundle_with_its_row(pytester, goldens):
    xml = pytester.path / "junit.xml"
    pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy", f"--junitxml={xml}")
    cases = ElementTree.parse(xml).getroot().iter("testcase")
    names = sorted(case.get("name") for case in cases)
    assert len(names) == BUNDLES and all(name.endswith("[numpy]") for name in names)
    rows = [p.get("value") for p in ElementTree.parse(xml).getroot().iter("property") if p.get("name") == "kdtree_row"]
    assert len(rows) == BUNDLES and all('"passed":true' in row for row in rows)


def test_a_corrupted_bundle_is_one_failing_item(pytester, goldens):
    victim = next(goldens.glob("tree_accept/*.kdtr"))
    victim.write_bytes(victim.read_bytes()[:100])
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy")
    result.assert_outcomes(passed=BUNDLES - 1, failed=1)
    result.stdout.fnmatch_lines([f"*{victim.name}*"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_a_failure_reports_kdtrees_row(pytester, goldens, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (pytester.path / "wrong.py").write_text(WRONG)
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-impl", "verify_attn/fp32=wrong.py:attend")
    result.assert_outcomes(failed=1)      # it serves verify_attn/fp32 only: one item
    text = result.stdout.str()
    assert "verify_attn/fp32_" in text and "[verify_attn/fp32=wrong.py:attend]" in text
    # the worst element, where it sits in the tree, and the share of its tolerance
    result.stdout.fnmatch_lines(["*out: *worst at [[]1, 2, 3, 0[]] (batch 1, node 2, head 3*tol share*"])


def test_an_implementation_that_cannot_run_here_is_a_skip(pytester, goldens):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("the cuda implementation runs on this machine")
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-impl", "cuda", "-rs")
    result.assert_outcomes(skipped=BUNDLES)
    result.stdout.fnmatch_lines(["*SKIPPED*cuda*"])


def test_an_unknown_implementation_is_a_usage_error(pytester, goldens):
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-impl", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown implementation 'nope'*"])


def test_kdtree_case_fixture_runs_a_users_kernel(pytester, goldens, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pytester.makepyfile(test_mine="""
        import pytest

        def test_mine(kdtree_case):
            if kdtree_case.op != "tree_accept":
                pytest.skip("mine is a tree_accept")
            from kdtr.ops import get_op
            op = get_op("tree_accept")
            rows = kdtree_case.check(lambda inputs, params: op.run_torch(kdtree_case.variant, inputs, params))
            assert rows and all(row.passed for row in rows)

        def test_broken(kdtree_case):
            if kdtree_case.op != "tree_accept":
                pytest.skip("mine is a tree_accept")
            from kdtr.ops import get_op
            op = get_op("tree_accept")
            def broken(inputs, params):
                out = dict(op.run_torch(kdtree_case.variant, inputs, params))
                first = next(iter(out))
                out[first] = out[first] + 1
                return out
            kdtree_case.check(broken)
    """)
    result = pytester.runpytest("test_mine.py", "--kdtree", str(goldens))
    result.assert_outcomes(passed=1, failed=1, skipped=2 * (BUNDLES - 1))
    result.stdout.fnmatch_lines(["*FAIL tree_accept/default*"])


def test_kdtree_case_fixture_checks_outputs_through_kdtr_testing(pytester, goldens, monkeypatch):
    """`kdtree_case.assert_close(outputs)`: kdtr.testing.assert_op_close against the bundle's
    golden; one element off fails the test with the element named and where it sits."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pytester.makepyfile(test_mine="""
        import pytest
        from kdtr.ops import get_op

        def test_golden(kdtree_case):
            op = get_op(kdtree_case.op)
            row = kdtree_case.assert_close(op.reference(kdtree_case.variant, kdtree_case.inputs, kdtree_case.params))
            assert row.passed and row.case == kdtree_case.case

        def test_off(kdtree_case):
            if kdtree_case.variant != "fp32":
                pytest.skip("one case is enough")
            out = dict(get_op("verify_attn").reference("fp32", kdtree_case.inputs, kdtree_case.params))
            out["out"] = out["out"].copy()
            out["out"][1, 2, 3, 0] += 1.0
            kdtree_case.assert_close(out)
    """)
    result = pytester.runpytest("test_mine.py", "--kdtree", str(goldens))
    result.assert_outcomes(passed=BUNDLES, failed=1, skipped=BUNDLES - 1)
    result.stdout.fnmatch_lines(["*out: *worst at [[]1, 2, 3, 0[]] (batch 1, node 2, head 3*tol share*"])


def test_xdist_runs_the_items_on_two_workers(pytester, goldens):
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess("--kdtree", str(goldens), "--kdtree-backend", "numpy", "-n", "2", "-v")
    result.assert_outcomes(passed=BUNDLES)
    text = result.stdout.str()
    assert "[gw0]" in text and "[gw1]" in text       # both workers ran items


@pytest.mark.parametrize("worker, visible, pinned", [("gw0", "0,1,2", "0"), ("gw4", "0,1,2", "1"),
                                                     ("gw1", "5,7", "7"), ("master", "0,1", "0,1")])
def test_each_xdist_worker_pins_one_gpu(monkeypatch, worker, visible, pinned):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    pytest_plugin._pin_worker_gpu()
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == pinned


# an implementation of tree_build that segfaults on its first call (a marker file remembers, across
# its worker processes) and is right on every later one
CRASHING_ONCE = """\
import ctypes
from pathlib import Path
from kdtr.ops import get_op

def build(inputs, params):
    mark = Path(__file__).with_suffix(".crashed")
    if not mark.exists():
        mark.touch()
        ctypes.string_at(0)
    return get_op("tree_build").run_torch("default", inputs, params)
"""


def test_a_crashing_implementation_fails_its_item_and_the_session_goes_on(pytester, goldens):
    """Issue 35: before, the segfault ended pytest itself (no summary; exit by the signal). Now the
    item fails with the cause, the other tree_build item passes in a fresh worker, exit 1."""
    (pytester.path / "crashing.py").write_text(CRASHING_ONCE)
    result = pytester.runpytest_subprocess("--kdtree", str(goldens), "--kdtree-impl", "tree_build=crashing.py:build")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*its worker process died running this case: killed by SIGSEGV*"])


def test_kdtree_case_check_runs_a_module_level_function_in_a_worker(pytester, goldens):
    pytester.makepyfile(test_mine="""
        import ctypes
        import pytest

        def crash(inputs, params):
            ctypes.string_at(0)

        def test_mine(kdtree_case):
            if kdtree_case.op != "tree_accept":
                pytest.skip("mine is a tree_accept")
            kdtree_case.check(crash)

        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess("test_mine.py", "--kdtree", str(goldens))
    result.assert_outcomes(passed=1, failed=1, skipped=BUNDLES - 1)
    result.stdout.fnmatch_lines(["*killed by SIGSEGV*"])


# an implementation of tree_build that is wrong on one of the two tree_build bundles (batch 3)
WRONG_ON_ONE = """\
from kdtr.ops import get_op

def build(inputs, params):
    out = dict(get_op("tree_build").run_torch("default", inputs, params))
    if params["batch"] == 3:
        out["tokens"] = out["tokens"] + 1
    return out
"""


def test_lf_sw_and_k_find_the_items_again(pytester, goldens):
    """Issue 35: `--lf` reran everything ("1 known failures not in selected tests"): pytest 9 parses
    a cached id's [..] as params, and our items kept the bracket in their name."""
    (pytester.path / "wrong.py").write_text(WRONG_ON_ONE)
    args = ("--kdtree", str(goldens), "--kdtree-impl", "tree_build=wrong.py:build", "-p", "cacheprovider")
    pytester.runpytest(*args).assert_outcomes(passed=1, failed=1)
    last_failed = pytester.runpytest(*args, "--lf")
    last_failed.assert_outcomes(failed=1)
    last_failed.stdout.fnmatch_lines(["*rerun previous 1 failure*"])
    pytester.runpytest(*args, "--sw").assert_outcomes(passed=1, failed=1)     # stops at the failure
    stepwise = pytester.runpytest(*args, "--sw")
    stepwise.assert_outcomes(failed=1, deselected=1)          # and starts again there
    by_k = pytester.runpytest(*args, "-k", "b2_l3 and wrong.py")
    by_k.assert_outcomes(passed=1, deselected=1)


@pytest.mark.parametrize("fault, words", [("dangling", "a dangling symbolic link"), ("empty", "an empty path")])
def test_the_plugin_refuses_what_verify_refuses(pytester, goldens, fault, words):
    """Issue 35: a dangling *.kdtr link made `kdtree verify DIR` exit 2 but the plugin collect five
    items fewer, silently; `--kdtree ''` collected the current folder. One finder for both now."""
    from tests.helpers import invoke

    target = str(goldens)
    if fault == "dangling":
        (goldens / "tree_accept" / "gone.kdtr").symlink_to(goldens / "nowhere.kdtr")
    else:
        target = ""
    result = pytester.runpytest("--kdtree", target, "--kdtree-backend", "numpy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{words}*"])
    verified = invoke("verify", target, "--backend", "numpy")
    assert verified.exit_code == 2 and words in verified.output


def test_every_bundle_the_finder_finds_is_an_item(pytester, goldens):
    """Bundles under a folder pytest's own walk skips (norecursedirs: build/, dotted folders) are
    items all the same, as verify verifies them."""
    shutil.move(goldens / "tree_accept", goldens / "build")
    result = pytester.runpytest("--kdtree", str(goldens), "--kdtree-backend", "numpy")
    result.assert_outcomes(passed=BUNDLES)
