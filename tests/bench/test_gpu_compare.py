"""Records keyed by GPU: meta.gpu, `report --compare-gpus` and `--merge` refusing shards of two GPUs.

The other GPU's record is a copy of the real H200 record (results/bench.json) whose meta names a
B200 with every ceiling twice the H200's and every time of ours half: each case must then run 2x
as fast, at the same share of its own (doubled) ceiling as the H200 run recorded for it."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from kdtr.config import REPO_ROOT
from kdtr.errors import UsageError
from kdtr.reports.gpu_compare import compare_gpus
from kdtr.runtime.gpu_identity import gpu_meta, record_gpu
from kdtr.bench import BenchRecord
from kdtr.records.report import check_shards, record_meta
from tests.bench.fakes import H200, h200, other_gpu
from tests.helpers import kdtree_env, run_kdtree

def host_run(data: dict) -> dict:
    """An older-format CPU record: no meta.gpu, no device, no ceilings, host-timed rows."""
    data = copy.deepcopy(data)
    data.pop("samples_file", None)
    data["meta"]["device"] = {"gpu": None}
    data["meta"].pop("gpu", None)
    data["ceilings"] = None
    data["settings"].update(primary="torch", gpu=False)
    for row in data["rows"]:
        row["mode"] = "host"
    return data


def write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_every_record_meta_names_its_gpu_or_the_host():
    meta = record_meta("test")
    assert set(meta["gpu"]) == {"model", "arch", "sms", "clock_sm_max", "clock_mem", "ceilings"}
    assert gpu_meta({"gpu": None})["model"] == "host"


def test_an_older_record_is_read_from_its_device_and_ceilings():
    gpu = record_gpu(h200()["meta"], BenchRecord.from_plain(h200()).ceilings)
    assert (gpu.model, gpu.arch, gpu.sms, gpu.clock_sm_max) == ("NVIDIA H200", "sm_90", 132, "1980 MHz")
    assert gpu.ceilings["hbm_read_gbps"] == h200()["ceilings"]["hbm_read_gbps"]


def test_compare_gpus_matches_cases_against_each_gpus_own_ceilings():
    first, second = h200(), other_gpu(h200())
    comparison = compare_gpus([BenchRecord.from_plain(first), BenchRecord.from_plain(second)], ["h200", "b200"])
    assert [g.model for g in comparison.gpus] == ["NVIDIA H200", "NVIDIA B200"]
    timed = [r for r in first["rows"] if r["timing"]]
    assert len(comparison.rows) == len(timed) and comparison.unmatched == (0, 0)
    recorded = {(r["op"], r["variant"], r["case"], r["impl"]): r for r in timed}
    for row in comparison.rows:
        h, b = row.figures
        original = recorded[(row.op, row.variant, row.case, row.impl)]
        share = original["pct_compute"] if row.unit == "TFLOP/s" else original["pct_bandwidth"]
        assert h.share == pytest.approx(share, rel=1e-9)     # the H200 share its own run recorded
        if row.impl == "cuda":
            assert b.speed == pytest.approx(2.0) and b.share == pytest.approx(share, rel=1e-9)
        else:                                   # peers untouched: same time, half the share of a 2x ceiling
            assert b.speed == pytest.approx(1.0) and b.share == pytest.approx(share / 2, rel=1e-9)


def test_cases_are_matched_on_every_parameter():
    second = other_gpu(h200())
    second["rows"][0]["params"]["sm_scale"] = 0.5          # another case now, though its name is the same
    comparison = compare_gpus([BenchRecord.from_plain(h200()), BenchRecord.from_plain(second)], ["a", "b"])
    assert comparison.unmatched == (1, 1)
    assert len(comparison.rows) == sum(1 for r in h200()["rows"] if r["timing"]) - 1


def test_a_host_timed_record_is_refused():
    with pytest.raises(UsageError, match="b: timed on the host CPU"):
        compare_gpus([BenchRecord.from_plain(h200()), BenchRecord.from_plain(host_run(h200()))], ["a", "b"])


def kdtree(*args):
    """kdtree in a real process, 250 columns wide: rich wraps none of the lines these tests read."""
    return run_kdtree(*args, cwd=REPO_ROOT, env=kdtree_env(COLUMNS="250"))


def test_compare_gpus_on_the_command_line(tmp_path):
    other = write(tmp_path / "b200.json", other_gpu(h200()))
    run = kdtree("report", H200, other, "--compare-gpus")
    assert run.returncode == 0, run.stderr
    assert "NVIDIA H200 (sm_90, 132 SMs, 1980 MHz)" in run.stdout and "NVIDIA B200 (sm_100" in run.stdout
    assert "2.00×" in run.stdout and "cases compared" in run.stdout
    host = tmp_path / "cpu.json"          # a real bench run here, on the CPU: meta.gpu says "host"
    bench = kdtree("bench", REPO_ROOT / "specs" / "bench" / "tree_accept.yaml", "--quick", "--no-sanity",
                   "--no-baselines", "-k", "b1_n8_l15", "--json", host, "-q")
    assert bench.returncode == 0, bench.stderr
    assert json.loads(host.read_text())["meta"]["gpu"] == {"model": "host", "arch": None, "sms": None,
                                                           "clock_sm_max": None, "clock_mem": None, "ceilings": None}
    refused = kdtree("report", H200, host, "--compare-gpus")
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1 and "timed on the host CPU" in refused.stderr


def _shard(data: dict, index: int) -> dict:
    data = copy.deepcopy(data)
    data.pop("samples_file", None)
    data["meta"]["shard"] = f"{index}/2"
    data["rows"] = data["rows"][index - 1::2]
    return data


def test_merge_of_shards_from_two_gpus_is_an_error(tmp_path):
    one = write(tmp_path / "one.json", _shard(h200(), 1))
    same = write(tmp_path / "two.json", _shard(h200(), 2))
    runner = CliRunner()
    ok = runner.invoke(app, ["report", str(one), str(same), "--merge", str(tmp_path / "merged.json")])
    assert ok.exit_code == 0, ok.output                  # the control: one GPU merges
    other = write(tmp_path / "other.json", _shard(other_gpu(h200()), 2))
    bad = runner.invoke(app, ["report", str(one), str(other), "--merge", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "ran on NVIDIA B200" in bad.output
    assert not (tmp_path / "bad.json").exists()
    problems = check_shards([_shard(h200(), 1)["meta"], _shard(other_gpu(h200()), 2)["meta"]])
    assert len(problems) == 1 and "--compare-gpus" in problems[0]
