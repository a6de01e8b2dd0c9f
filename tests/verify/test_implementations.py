"""verify --impl / --against and bench --impl on the CPU: a user's file implementation through a
real subprocess, a wrong one failing with the reason, parity, unavailable peers, capture bundles."""

from __future__ import annotations

import importlib.util
import json
import textwrap

import numpy as np
import pytest
import torch

from kdtr.bundle.capture import save_bundle
from kdtr.verify import DEVICE_REFERENCE, GOLDEN, Options, VerifyRow, verify_bundle
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case
from tests.helpers import invoke, run_kdtree as kdtree

USER = """
    import torch
    from kdtr.ops import get_op

    def attn(inputs, params):
        return get_op("verify_attn").run_torch("bf16_paged", inputs, params)

    def scaled(inputs, params):          # 1% too large: past bf16_paged's rtol 2^-7 and its l2 bound
        got = attn(inputs, params)
        return {"out": got["out"] * 1.01, "lse": got["lse"]}

    def wrong_dtype(inputs, params):
        got = attn(inputs, params)
        return {"out": got["out"], "lse": got["lse"].to(torch.int32)}
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_attn.py"
    path.write_text(textwrap.dedent(USER))
    return path


def test_a_users_file_passes_and_a_wrong_one_fails_with_the_reason(goldens, user_file, tmp_path):
    record = tmp_path / "r.json"
    good = kdtree("verify", goldens, "--impl", f"verify_attn/bf16_paged={user_file}:attn", "--trials", "1",
                  "--json", record, cwd=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "PASS" in good.stdout and "not run:" in good.stdout and "Traceback" not in good.stderr
    data = json.loads(record.read_text())
    rows = data["rows"]
    assert len(rows) == 2 and {r["trial"] for r in rows if "trial" in r} == {1}
    assert all(r["impl"] == f"verify_attn/bf16_paged={user_file}:attn" and r["passed"] for r in rows)
    assert len(data["not_run"]) == 4 and all("served by none of" in n for n in data["not_run"])
    assert set(data["meta"]["implementations"]) == {rows[0]["impl"]}
    for name, reason in (("scaled", "out: "), ("wrong_dtype", "output 'lse' has dtype i32, expected f32")):
        bad = kdtree("verify", goldens, "--impl", f"verify_attn={user_file}:{name}", cwd=tmp_path)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "FAIL" in bad.stdout and reason in bad.stdout and "Traceback" not in bad.stderr


def test_an_unavailable_peer_is_a_skip_and_exit_2_when_nothing_ran(goldens):
    if importlib.util.find_spec("sglang"):
        pytest.skip("sglang is installed here")
    result = invoke("verify", goldens, "--impl", "sglang_triton")
    assert result.exit_code == 2
    assert "SKIP" in result.output and "nothing ran: sglang_triton: sglang is not importable" in result.output
    both = invoke("verify", goldens, "--impl", "sglang_triton", "--impl", "torch")
    assert both.exit_code == 0 and "1 skipped" in both.output and "SKIP" in both.output


def test_impl_usage_errors_are_one_line(goldens):
    for args, message in ((["--impl", "nope"], "unknown implementation 'nope'"),
                          (["--impl", "torch", "--against", "numpy"], "does not combine with --impl"),
                          (["--impl", "torch", "--kernel", "warp"], "--kernel")):
        result = invoke("verify", goldens, *args)
        assert result.exit_code == 2 and message in result.output, result.output


def test_against_reports_parity_in_the_table_and_the_record(goldens, tmp_path):
    record = tmp_path / "a.json"
    result = invoke("verify", goldens, "--backend", "numpy", "--against", "torch", "--json", record)
    assert result.exit_code == 0, result.output
    assert "parity — numpy vs torch" in result.output and "max ulps" in result.output
    rows = json.loads(record.read_text())["rows"]
    paged = next(r for r in rows if r["variant"] == "bf16_paged")
    out = next(o for o in paged["parity"]["outputs"] if o["name"] == "out")
    # the torch backend's fp32 math against the float64 reference, both rounded to bf16 at the end:
    # at most a couple of bf16 rounding steps apart, and not bit-identical everywhere
    assert 0 < out["max_ulps"] <= 2 and set(out["worst_position"]) >= {"batch", "node", "head"}
    accept = next(r for r in rows if r["op"] == "tree_accept")
    assert all(o["exact"] and o["mismatches"] == 0 for o in accept["parity"]["outputs"])


def test_against_an_unavailable_peer_compares_nothing_exit_2(goldens):
    if importlib.util.find_spec("sglang"):
        pytest.skip("sglang is installed here")
    result = invoke("verify", goldens, "--backend", "torch", "--against", "sglang_triton")
    assert result.exit_code == 2 and "--against sglang_triton: compared no case" in result.output


def test_bench_impl_times_a_file_implementation_in_the_same_run(goldens, user_file, tmp_path):
    """The right one is timed; the wrong one is a failed row, and (an implementation under test
    failed: issue 35) exit 1."""
    record = tmp_path / "b.json"
    bundle = next((goldens / "verify_attn").glob("bf16_paged*.kdtr"))
    result = kdtree("bench", bundle, "--quick", "--no-sanity", "--impl", f"verify_attn={user_file}:attn",
                    "--impl", f"verify_attn={user_file}:scaled", "--json", record, "-v", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {r["impl"]: r for r in json.loads(record.read_text())["rows"]}
    mine, scaled = rows[f"verify_attn={user_file}:attn"], rows[f"verify_attn={user_file}:scaled"]
    assert mine["timing"] is not None and mine["check_passed"] and "implementation" in mine["extra"]
    assert scaled["timing"] is None and scaled["check_passed"] is False and "out" in scaled["check"]
    assert f"verify_attn={user_file}:attn" in rows["torch"]["speedups"]


def test_a_bundle_without_outputs_is_compared_with_the_reference(tmp_path):
    op, inputs, params = small_case("verify_attn", "bf16_paged", **VERIFY_SMALL)
    path = save_bundle(tmp_path / "c.kdtr", "verify_attn", "bf16_paged", inputs, params=params)
    (row,) = verify_bundle(path, Options(backend="torch"))
    assert row.passed and row.expected_from == "reference" and row.impl is None
    result = invoke("verify", path, "--backend", "torch")
    assert result.exit_code == 0 and "computed here" in result.output, result.output


def test_captured_outputs_are_that_implementations_row_against_the_reference(tmp_path):
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    good = {k: torch.from_numpy(v) for k, v in op.reference("default", inputs, params).items()}
    path = save_bundle(tmp_path / "a.kdtr", "tree_accept", "default", inputs, good, params=params,
                       captured_by="engine")
    ours, captured = verify_bundle(path, Options(backend="torch"))
    assert ours.impl is None and ours.passed and ours.expected_from == "reference"
    assert captured.impl == "engine" and captured.captured and captured.passed
    wrong = dict(good, accept_len=good["accept_len"] + 1)
    path = save_bundle(tmp_path / "b.kdtr", "tree_accept", "default", inputs, wrong, params=params,
                       captured_by="engine")
    ours, captured = verify_bundle(path, Options(backend="torch"))
    assert ours.passed and not captured.passed
    assert next(o for o in captured.outputs if o.name == "accept_len").mismatches == int(np.prod(wrong["accept_len"].shape))
    result = invoke("verify", path, "--backend", "torch")
    assert result.exit_code == 1 and "(captured)" in result.output and "engine" in result.output


def test_trials_record_which_reference_computed_their_expected_outputs(goldens, monkeypatch):  # noqa: F811
    """On the CPU the numpy reference computes a trial's expected outputs, as before (the record
    leaves the field out); where the float64 device reference does (a GPU), the row says so."""
    from kdtr.verify import run as verify_run

    bundle = next((goldens / "verify_attn").glob("bf16_paged*.kdtr"))
    golden, trial = verify_bundle(bundle, Options(backend="torch", trials=1))
    assert golden.expected_from == trial.expected_from == GOLDEN and "expected_from" not in trial.to_plain()
    numpy_reference = verify_run.reference_outputs
    monkeypatch.setattr(verify_run, "reference_outputs", lambda *args: (numpy_reference(*args)[0], True))
    golden, trial = verify_bundle(bundle, Options(backend="torch", trials=1))
    assert golden.expected_from == GOLDEN and trial.passed and trial.expected_from == DEVICE_REFERENCE
    assert VerifyRow.from_plain(trial.to_plain()).expected_from == DEVICE_REFERENCE
    result = invoke("verify", bundle, "--backend", "torch", "--trials", "1")
    assert result.exit_code == 0 and "float64 torch reference" in result.output, result.output
