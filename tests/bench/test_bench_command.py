"""`kdtree bench` through the CLI on a machine without a GPU: the degraded host-timed run and its exits."""

from __future__ import annotations

import json

import pytest

from kdtr import bench
from kdtr.bench import runner as bench_runner
from kdtr.ops import get_op
from tests.bench.fakes import SUITES, record
from tests.helpers import invoke


# -- the CLI: a degraded run on the CPU -------------------------------------------------------------

FAST = ("--time-budget", "0.05", "--target", "0.2")


def test_cli_bench_cpu_run_json_csv(suites, tmp_path):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("this test covers the degraded run on a machine without a GPU")
    out, table = tmp_path / "run.json", tmp_path / "run.csv"
    result = invoke("bench", suites, *FAST, "--json", out, "--csv", table)
    assert result.exit_code == 0, result.output
    assert "CPU run (no GPU)" in result.output
    data = json.loads(out.read_text())
    assert data["complete"] and data["ceilings"] is None and data["settings"]["primary"] == "torch"
    assert data["settings"]["timer"].startswith("host perf_counter")
    assert data["meta"]["command_line"] and data["meta"]["commit"] is not None
    rows = data["rows"]
    cases = {r["case"] for r in rows}
    assert cases == {"tb_small", "ta_small", "ta_other", "ta_third", "va_fp32", "va_bf16"}
    primary = [r for r in rows if r["primary"]]
    assert all(r["impl"] == "torch" and r["check_passed"] and r["timing"]["mode"] == "host" for r in primary)
    assert not any("kernel" in (r["extra"] or {}) for r in rows)        # none of our kernels ran
    heap = next(r for r in rows if r["impl"] == "cpu_heap")
    assert heap["check_passed"] and heap["timing"]["n"] >= 1
    tb = next(r for r in primary if r["case"] == "tb_small")
    assert set(tb["speedups"]) == {"cpu_heap"}
    sdpa = [r for r in rows if r["impl"] == "sdpa"]
    assert sdpa and all(r["skip"] == "needs a GPU (this run has none)" for r in sdpa)
    assert len(table.read_text().splitlines()) == len(rows) + 1


def test_cli_bench_quick_and_pattern(suites, tmp_path):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("CPU run")
    result = invoke("bench", suites, "--quick", "-k", "ta_*", "--quiet")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("torch ")]
    assert [line.split()[2] for line in lines] == ["ta_small", "ta_other"]    # --quick: first 2 per suite
    assert invoke("bench", suites, "-k", "nothing_matches").exit_code == 2


def test_cli_bench_usage_errors(suites):
    assert invoke("bench", suites, "--mode", "lukewarm").exit_code == 2
    assert invoke("bench", suites, "--time-budget", "0").exit_code == 2
    assert invoke("bench", suites, "--budget", "1").exit_code == 2             # renamed: one meaning per name
    assert invoke("bench", suites, "--time-limit", "-1").exit_code == 2
    assert invoke("bench", suites / "absent.yaml").exit_code == 2


def test_cli_bench_cuda_backend_without_gpu_exits_2(suites):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    result = invoke("bench", suites, "--backend", "cuda")
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


def test_cli_bench_exit_1_when_our_implementation_is_wrong(suites, tmp_path, monkeypatch):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("CPU run: the torch backend is the implementation under test")
    op = get_op("tree_accept")
    original = op.run_torch

    def wrong(variant, inputs, params):
        out = original(variant, inputs, params)
        out["bonus"] = out["bonus"] + 1
        return out
    monkeypatch.setattr(op, "run_torch", wrong)
    out = tmp_path / "bad.json"
    result = invoke("bench", suites, "-k", "ta_small", *FAST, "--json", out)
    assert result.exit_code == 1, result.output
    assert "FAIL tree_accept/default ta_small torch" in result.output
    row_ = json.loads(out.read_text())["rows"][0]
    assert row_["timing"] is None and row_["check_passed"] is False and "bonus" in row_["check"]


def test_cli_bench_time_limit_lists_cases_not_run(suites, tmp_path):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("CPU run")
    out = tmp_path / "partial.json"
    result = invoke("bench", suites, *FAST, "--time-limit", "1e-9", "--json", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert not data["complete"] and len(data["not_run"]) == 6 and data["rows"] == []
    assert "not run (time limit): 6 case(s)" in result.output
    for name in ("tb_small", "ta_small", "ta_other", "ta_third", "va_fp32", "va_bf16"):   # every cut case named
        assert name in result.output


def test_cli_bench_bundles(tmp_path):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("CPU run")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "tree_accept.yaml").write_text(SUITES["tree_accept"])
    assert invoke("gen-refs", specs, "-o", tmp_path / "goldens", "--quiet").exit_code == 0
    bundle = tmp_path / "goldens" / "tree_accept" / "ta_small.kdtr"
    out = tmp_path / "b.json"
    result = invoke("bench", bundle, *FAST, "--json", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [r["case"] for r in data["rows"]] == ["ta_small"]
    assert data["rows"][0]["params"]["batch"] == 4


def test_cli_bench_json_to_stdout_is_json_alone(suites, tmp_path):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("CPU run")
    result = invoke("bench", suites, *FAST, "-k", "ta_small", "--json", "-", "--quiet",
                    "--compare", _written(tmp_path))
    data = json.loads(result.stdout)                         # nothing else on stdout
    assert data["kind"] == "kdtree.bench" and [r["case"] for r in data["rows"]] == ["ta_small"]
    assert data["rows"][0]["timing"]["samples_ms"]             # no sidecar on stdout: samples inline
    assert "compare" in result.stderr and result.exit_code == 0, result.output


def _written(tmp_path):
    path = tmp_path / "old.json"
    bench.write_record(path, record())
    return path


@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_cli_bench_refuses_an_unwritable_json_path_before_any_work(suites, tmp_path, monkeypatch, where):
    monkeypatch.setattr(bench.run, "collect_items", lambda *a: pytest.fail("the cases were collected"))
    (tmp_path / "file.txt").write_text("x")
    target = tmp_path if where == "folder" else tmp_path / "file.txt" / "bench.json"
    result = invoke("bench", suites, "--json", target)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and str(target) in result.output
    assert "Traceback" not in result.output


def test_a_device_error_at_cleanup_stops_the_run_with_a_record_not_a_traceback(suites, tmp_path, monkeypatch):
    """A kernel's illegal address surfaces late (at the next synchronizing call, e.g. empty_cache
    after a case): the run stops there, names the case and every case not run, writes its record
    and exits 1 (seen on the H200 when a captured graph's inputs had been freed)."""
    from kdtr import bench
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("CPU run")
    cleanups = []

    def cleanup(self):
        cleanups.append(1)
        if len(cleanups) == 2:              # the second cleanup: within or right after the first case
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(bench_runner._Env, "cleanup", cleanup)
    out = tmp_path / "lost.json"
    result = invoke("bench", suites, *FAST, "-k", "ta_*", "--json", out)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    data = json.loads(out.read_text())
    assert not data["complete"]
    assert any("the device failed after" in e and "illegal memory access" in e for e in data["errors"])
    assert data["not_run"], data


def test_an_entry_point_whose_implementation_names_itself_otherwise_is_benched(suites, tmp_path, monkeypatch):
    """Issue 27: `--impl myimpl` (an entry point) whose Implementation is named "plugged" passed the
    up-front check, then every case errored "unknown implementation 'plugged'" (bench resolved the
    name as a spec), exit 1."""
    from kdtr.runtime.device import gpu_available
    from tests.helpers import install_plugin

    if gpu_available():
        pytest.skip("CPU run: the plug-in is the torch backend on the host")
    install_plugin(tmp_path, monkeypatch, "kdtree_plugin_mod:IMPL", body="""
        from kdtr.impl import Implementation, Serves
        from kdtr.impl.builtin import TORCH
        IMPL = Implementation("plugged", (Serves("tree_accept"),), TORCH.prepare, device="cpu", doc="torch, renamed")
    """)
    out = tmp_path / "run.json"
    result = invoke("bench", suites, *FAST, "-k", "ta_small", "--impl", "myimpl", "--no-baselines", "--json", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert not data["errors"], data["errors"]
    plugged = [r for r in data["rows"] if r["impl"] == "plugged"]
    assert len(plugged) == 1 and plugged[0]["check_passed"] and plugged[0]["timing"]["n"] >= 1


def test_bench_items_are_plain_data_a_worker_receives(suites, goldens, tmp_path):
    """Issue 27: a --devices worker gets its items pickled (it re-collected every suite before, a
    bench item being a closure); an unpickled item draws or reads the same inputs."""
    import pickle

    bundle = sorted((goldens / "tree_accept").glob("*.kdtr"))[0]
    items = bench.cases.collect_items([suites, bundle], "*")
    assert {i.case is not None for i in items} == {True, False}
    job = bench.run.WorkerJob(tuple(items), bench.BenchSettings())
    received = pickle.loads(pickle.dumps(job))
    assert received == job and received.names == tuple(f"{i.op}/{i.name}" for i in items)
    for sent, got in zip(items, received.items):
        (a, pa), (b, pb) = sent.load(), got.load()
        assert pa == pb and all(a[k].tobytes() == b[k].tobytes() for k in a)     # NaN-poisoned slots too
