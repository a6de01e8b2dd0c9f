"""The one evaluator (kdtr.impl.evaluate): verify, bench, parity and e2e reach it; its Outcome's
closed statuses; what it guarantees against hostile implementations (issue 30 rows 1, 5, 8, 9, 17),
the CLI cases in real subprocesses where the exit code or the stream is the point."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

import kdtr.impl
from kdtr.errors import UsageError, reason
from kdtr.impl import CaseData, ImplRef, Outcome, Status, evaluate, resolve
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.helpers import kdtree_env, run_kdtree


def _small(op_name="tree_accept", variant="default", **params):
    op = get_op(op_name)
    generated = op.generate(Case("t", op_name, variant, 3, dict(op._defaults, **params)))
    return CaseData(op, variant, generated.inputs, generated.params)


ACCEPT = dict(batch=2, budget=6, depth=3)


# -- one evaluator for the four callers ----------------------------------------------------------------

@pytest.fixture
def spy(monkeypatch):
    """Every call of kdtr.impl.evaluate, as (implementation name, op, variant)."""
    calls = []
    real = kdtr.impl.evaluate

    def watched(impl, case, *args, **kwargs):
        calls.append((impl.name, case.op.name, case.variant))
        return real(impl, case, *args, **kwargs)
    monkeypatch.setattr(kdtr.impl, "evaluate", watched)
    return calls


def test_verify_bench_parity_and_e2e_reach_the_same_evaluate(goldens, spy):
    from kdtr import bench
    from kdtr.verify.e2e import DecodeOptions, ModelConfig, make_prompts, run_e2e
    from kdtr.verify import Options, verify_bundle

    bundle = sorted((goldens / "tree_accept").glob("*.kdtr"))[0]
    (row,) = verify_bundle(bundle, Options(backend="numpy"))
    assert row.passed and spy == [("numpy", "tree_accept", "default")]

    spy.clear()
    (row,) = verify_bundle(bundle, Options(backend="numpy", against=ImplRef("torch", "torch")))
    assert row.parity and not row.parity.get("reason"), row.parity
    assert spy == [("numpy", "tree_accept", "default"), ("torch", "tree_accept", "default")]

    spy.clear()
    if not torch.cuda.is_available():          # on the CPU the torch backend is the one under test
        items = bench.cases.items_from_bundles([bundle])
        timing = bench.TimingOptions(budget_s=0.02, target=0.5, min_samples=2, max_samples=5, warmup_s=0.0)
        record = bench.bench_items(items, bench.BenchSettings(timing=timing, baselines=("cpu_heap",), sanity=False))
        assert not record.errors and any(r.primary and r.check_passed for r in record.rows)
        assert ("torch", "tree_accept", "default") in spy

    spy.clear()
    cfg = ModelConfig()
    (run,) = run_e2e(make_prompts(1, 6, cfg.vocab, seed=1), 4, [DecodeOptions("numpy", "fp32", 4, depth=2)], cfg)
    assert run.tokens == 4
    assert {name for name, _, _ in spy} == {"numpy"}
    assert {op for _, op, _ in spy} == {"tree_build", "verify_attn", "tree_accept"}


# -- the Outcome: a closed set of statuses, validated ------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(status=Status.PASSED, impl="x", reason="but why"),
    dict(status=Status.FAILED, impl="x"),
    dict(status=Status.ERROR, impl="x", reason="boom"),                      # no error_type
    dict(status=Status.SKIPPED, impl="x"),
    dict(status=Status.NOT_RUN, impl="x", reason="r", outputs={}),
    dict(status="maybe", impl="x", reason="r"),
])
def test_an_outcome_is_validated_per_status(kwargs):
    with pytest.raises(ValueError):
        Outcome(**kwargs)


def test_each_status_from_the_evaluator():
    data = _small(**ACCEPT)
    expected = data.op.reference(data.variant, data.inputs, data.params)
    tols = data.op.tolerances(data.variant)
    assert evaluate(resolve("numpy"), data, expected, tols).status is Status.PASSED
    wrong = {k: v.copy() for k, v in expected.items()}
    wrong["accept_len"][0] += 1
    failed = evaluate(resolve("numpy"), data, wrong, tols)
    assert failed.status is Status.FAILED and failed.reason.startswith("accept_len:") and failed.failed
    assert evaluate(resolve("verify_attn=math:sqrt"), data).status is Status.NOT_RUN
    if not torch.cuda.is_available():
        assert evaluate(resolve("cuda"), data).status is Status.SKIPPED


def test_one_reason_for_every_error():
    assert reason(ValueError("bad tree\nmore")) == "ValueError: bad tree"
    assert reason(SystemExit(3)) == "SystemExit: 3"
    assert reason(GeneratorExit()) == "GeneratorExit"
    assert reason(UsageError("--x 3: must be >= 0")) == "--x 3: must be >= 0"
    assert len(reason(RuntimeError("x" * 1000))) < 250


# -- hostile implementations, in-process ----------------------------------------------------------------

def _impl(tmp_path, body, name="fn", op="tree_accept"):
    path = tmp_path / f"impl_{abs(hash(body))}.py"
    path.write_text(textwrap.dedent(body))
    return resolve(f"{op}={path}:{name}")


@pytest.mark.parametrize("body, message", [
    ("import sys\ndef fn(inputs, params):\n    sys.exit(0)\n", "SystemExit: 0"),
    ("def fn(inputs, params):\n    raise SystemExit(3)\n", "SystemExit: 3"),
    ("def fn(inputs, params):\n    raise GeneratorExit()\n", "GeneratorExit"),
])
def test_an_exit_from_an_implementation_is_its_cases_error(tmp_path, body, message):
    outcome = evaluate(_impl(tmp_path, body), _small(**ACCEPT))
    assert outcome.status is Status.ERROR and outcome.reason == message


@pytest.mark.parametrize("make, message", [
    ("torch.empty(t.shape, dtype=t.dtype, device='meta')", "is on the meta device"),
    ("t.to_sparse()", "is a sparse_coo tensor, not a dense one"),
])
def test_meta_and_sparse_outputs_break_the_contract(tmp_path, make, message):
    body = f"""
        import torch
        from kdtr.ops import get_op
        def fn(inputs, params):
            good = get_op("tree_accept").run_torch("default", inputs, params)
            return {{n: ({make} if n == "accept_len" else t) for n, t in good.items()}}
    """
    outcome = evaluate(_impl(tmp_path, body), _small(**ACCEPT))
    assert outcome.status is Status.FAILED and message in outcome.reason and outcome.outputs is None


def test_each_implementation_gets_its_own_copy_of_params(tmp_path):
    data = _small("verify_attn", "fp32", batch=1, heads=2, prefix=4, budget=3)
    before = dict(data.params)
    greedy = _impl(tmp_path, """
        from kdtr.ops import get_op
        def fn(inputs, params):
            params["sm_scale"] *= 2
            return get_op("verify_attn").run_torch("fp32", inputs, params)
    """, op="verify_attn")
    expected = data.op.reference(data.variant, data.inputs, data.params)
    tols = data.op.baseline_tolerances(data.variant)
    assert evaluate(greedy, data, expected, tols).status is Status.FAILED
    assert dict(data.params) == before
    assert evaluate(resolve("torch"), data, expected, tols).status is Status.PASSED


def test_a_case_timeout_stops_a_looping_implementation(tmp_path):
    looping = _impl(tmp_path, "def fn(inputs, params):\n    while True:\n        pass\n")
    outcome = evaluate(looping, _small(**ACCEPT), timeout_s=0.3)
    assert outcome.status is Status.ERROR and outcome.reason == "CaseTimeout: ran past the case timeout of 0.3 s"
    assert outcome.seconds < 5


# -- the same through the CLI, in real subprocesses -----------------------------------------------------

def _kdtree(*args, cwd):
    return run_kdtree(*args, cwd=cwd, env=kdtree_env(OMP_NUM_THREADS="1"))


def _write_impl(tmp_path, body):
    path = tmp_path / "user_impl.py"
    path.write_text(textwrap.dedent(body))
    return f"tree_accept={path}:fn"


@pytest.mark.parametrize("body, message", [
    ("import sys\ndef fn(inputs, params):\n    sys.exit(0)\n", "SystemExit: 0"),
    ("def fn(inputs, params):\n    raise SystemExit(3)\n", "SystemExit: 3"),
    ("def fn(inputs, params):\n    raise GeneratorExit()\n", "GeneratorExit"),
    ("import torch\nfrom kdtr.ops import get_op\ndef fn(inputs, params):\n"
     "    return {n: t.to('meta') for n, t in get_op('tree_accept').run_torch('default', inputs, params).items()}\n",
     "meta device"),
])
def test_verify_an_exiting_or_hostile_impl_fails_its_rows_and_writes_the_record(goldens, tmp_path, body, message):
    """Issue 30 rows 1 and 9: exit 1, every row of the implementation failed with the reason, the
    other bundles still run (the --against case too), the record written."""
    record = tmp_path / "r.json"
    done = _kdtree("verify", goldens, "--impl", _write_impl(tmp_path, body), "--quiet", "--json", record,
                   cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    data = json.loads(record.read_text())
    rows = data["rows"]
    assert len(rows) == 1 and not rows[0]["passed"] and message in rows[0]["error"]
    assert len(data["not_run"]) == 4                  # the other ops' bundles: listed, the run went on
    against = _kdtree("verify", goldens / "tree_accept", "--backend", "numpy", "--against",
                      _write_impl(tmp_path, body), "--quiet", "--json", record, cwd=tmp_path)
    assert against.returncode == 2 and "compared no case" in against.stderr      # a skip is not a pass
    assert message in json.loads(record.read_text())["rows"][0]["parity"]["reason"]


def test_an_implementation_that_prints_keeps_json_on_stdout(goldens, tmp_path):
    """Issue 30 row 5: its prints (at import and while running, Python's and a C-level write to
    fd 1) go to stderr; stdout holds the JSON alone."""
    spec = _write_impl(tmp_path, """
        import os
        print("hello at import")
        from kdtr.ops import get_op
        def fn(inputs, params):
            print("hello while running")
            os.write(1, b"raw fd write\\n")
            return get_op("tree_accept").run_torch("default", inputs, params)
    """)
    done = _kdtree("verify", goldens / "tree_accept", "--impl", spec, "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["passed"] == 1
    assert "hello at import" in done.stderr and "hello while running" in done.stderr and "raw fd write" in done.stderr


def test_an_import_time_exit_is_one_line_exit_2(goldens, tmp_path):
    """An implementation file that exits as it is imported is refused up front (as one that raises)."""
    spec = _write_impl(tmp_path, "import sys\nsys.exit(0)\n")
    done = _kdtree("verify", goldens, "--impl", spec, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "SystemExit: 0" in done.stderr


def test_two_impls_one_mutating_params_leave_the_other_honest(goldens, tmp_path):
    """Issue 30 row 8: the first doubles sm_scale; the second (the torch backend) still passes."""
    greedy = tmp_path / "greedy.py"
    greedy.write_text(textwrap.dedent("""
        from kdtr.ops import get_op
        def fn(inputs, params):
            params["sm_scale"] *= 2
            return get_op("verify_attn").run_torch("fp32", inputs, params)
    """))
    record = tmp_path / "r.json"
    done = _kdtree("verify", goldens / "verify_attn", "--impl", f"verify_attn/fp32={greedy}:fn", "--impl", "torch",
                   "--determinism", "--quiet", "--json", record, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    rows = {r["impl"]: r for r in json.loads(record.read_text())["rows"] if r["variant"] == "fp32"}
    assert not rows[f"verify_attn/fp32={greedy}:fn"]["passed"]
    assert rows["torch"]["passed"] and rows["torch"]["deterministic"] is True


def test_case_timeout_fails_the_looping_case_and_the_run_goes_on(goldens, tmp_path):
    """Issue 30 row 17: --case-timeout S; the looping implementation's case fails with the reason,
    the others run, the record is written, exit 1."""
    spec = _write_impl(tmp_path, """
        from kdtr.ops import get_op
        def fn(inputs, params):
            while True:
                pass
    """)
    record = tmp_path / "r.json"
    done = _kdtree("verify", goldens, "--impl", spec, "--impl", "numpy", "--case-timeout", "0.5", "--quiet",
                   "--json", record, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    rows = json.loads(record.read_text())["rows"]
    looped = [r for r in rows if r["impl"] == spec]
    assert len(looped) == 1 and "ran past the case timeout of 0.5 s" in looped[0]["error"]
    assert sum(r["passed"] for r in rows if r["impl"] == "numpy") == 5
    bad = _kdtree("verify", goldens, "--case-timeout", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--case-timeout" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
