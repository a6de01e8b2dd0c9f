"""`kdtr.bench.run_bench(Selection, settings, progress)`: bench as a library, without the CLI, on the
CPU (the degraded host-timed run): collection, -k and shards, the memory bound, up-front refusals,
and spreading over --devices with a worker that crashes."""

from __future__ import annotations

import pytest

from kdtr import bench
from kdtr.scaleout import parallel
from kdtr.runtime.device import gpu_available
from kdtr.errors import DeviceError, LimitError, UsageError
from kdtr.scaleout.parallel import Shard

pytestmark = pytest.mark.skipif(gpu_available(), reason="covers the host-timed run of a machine without a GPU")

FAST = bench.BenchSettings(timing=bench.TimingOptions(budget_s=0.02, target=0.5, min_samples=2, max_samples=5,
                                                      warmup_s=0.0), baselines=(), sanity=False)


def test_a_selection_runs_without_the_command_line(suites):
    seen = []
    record = bench.run_bench(bench.Selection((suites,), "ta_*"), FAST, lambda what, done, total: seen.append(done))
    assert {r.case for r in record.rows} == {"ta_small", "ta_other", "ta_third"}
    assert all(r.check_passed and r.timing is not None for r in record.rows)
    assert record.meta["shard"] == "1/1" and len(record.meta["suite_sha256"]) == 64
    assert seen and seen[-1] == 3


def test_shards_of_a_selection_cover_it_once_and_share_its_digest(suites):
    whole = {i.name for i in bench.Selection((suites,)).items()[0]}
    parts = [bench.Selection((suites,), shard=Shard(index, 2)).items() for index in (1, 2)]
    assert sorted(i.name for items, _ in parts for i in items) == sorted(whole)
    assert parts[0][1]["suite_sha256"] == parts[1][1]["suite_sha256"]
    assert [meta["shard"] for _, meta in parts] == ["1/2", "2/2"]


def test_nothing_selected_and_forced_kernels_on_torch_are_refused_up_front(suites):
    with pytest.raises(UsageError, match="no case matches -k 'nope'"):
        bench.run_bench(bench.Selection((suites,), "nope"), FAST)
    with pytest.raises(UsageError, match="need the cuda backend"):
        bench.run_bench(bench.Selection((suites,)), bench.BenchSettings(kernels=bench.kernel_builds(["sorted"], [])))
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        bench.run_bench(bench.Selection((suites,), devices=("0", "1")), bench.BenchSettings(backend="cuda"))


def test_a_case_over_the_memory_bound_is_refused_before_any_runs(suites, monkeypatch):
    monkeypatch.setattr(bench.run, "bench_items", lambda *a, **k: pytest.fail("a case ran"))
    with pytest.raises(LimitError, match="over the memory limit"):
        bench.run_bench(bench.Selection((suites,), "va_*"), FAST, mem_limit=1024)


def test_on_partial_gets_the_record_so_far_with_the_selection_meta(suites):
    partial = []
    bench.run_bench(bench.Selection((suites,), "ta_*"), FAST, on_partial=partial.append)
    assert [len(r.rows) for r in partial] == [1, 2, 3]
    assert all(r.meta["shard"] == "1/1" and not r.complete for r in partial)


def _one_worker_crashes(devices, groups, work, on_crash):
    """map_on_devices in this process: the first worker's jobs run, the others' worker crashed."""
    for index, group in enumerate(groups):
        for job in group:
            yield job, work(job) if index == 0 else on_crash(job, f"the worker on device {devices[index]} crashed")


def test_a_crashed_worker_fails_its_cases_and_the_others_merge(suites, monkeypatch):
    monkeypatch.setattr(parallel, "map_on_devices", _one_worker_crashes)
    progress = []
    record = bench.run_bench(bench.Selection((suites,), "ta_*", devices=("0", "1")), FAST,
                             lambda what, done, total: progress.append((what, done, total)))
    assert not record.complete and len(record.errors) == 1
    crashed = record.errors[0]
    assert crashed.startswith("the worker on device 1 crashed: its cases tree_accept/")
    timed = {r.case for r in record.rows}
    assert timed and all(f"tree_accept/{case}" not in crashed for case in timed)
    assert len(timed) + crashed.count("tree_accept/") == 3
    assert progress[-1] == ("worker done (2/2)", 2, 2) and record.meta["shard"] == "1/1"


def test_every_worker_crashed_is_one_error(suites, monkeypatch):
    def all_crash(devices, groups, work, on_crash):
        for device, group in zip(devices, groups):
            for job in group:
                yield job, on_crash(job, f"the worker on device {device} crashed")
    monkeypatch.setattr(parallel, "map_on_devices", all_crash)
    with pytest.raises(UsageError, match="every bench worker crashed: the worker on device 0 crashed"):
        bench.run_bench(bench.Selection((suites,), "ta_*", devices=("0", "1")), FAST)


def test_devices_spawn_workers_whose_records_merge(suites):
    """Real spawned workers (on the CPU here): each times its share, the records join into one."""
    record = bench.run_bench(bench.Selection((suites,), "ta_*", devices=("0", "1")), FAST)
    assert sorted(r.case for r in record.rows) == ["ta_other", "ta_small", "ta_third"]
    assert record.complete and not record.errors and len(record.meta["merged_from"]) == 2
