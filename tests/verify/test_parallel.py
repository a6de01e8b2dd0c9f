"""Shards cover a suite exactly once; worker processes give the same verdicts as a plain run."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from kdtr.errors import UsageError
from kdtr.scaleout.parallel import Shard, balance, map_on_devices, parse_devices, shard_items



@given(st.lists(st.text(min_size=1, max_size=30), unique=True, max_size=200), st.integers(1, 9))
def test_shards_cover_every_item_exactly_once(names, count):
    taken = [name for index in range(1, count + 1) for name in shard_items(names, str, Shard(index, count))]
    assert sorted(taken) == sorted(names)


def test_shard_parse_errors():
    assert Shard.parse("2/4") == Shard(2, 4)
    for bad in ("0/4", "5/4", "a/b", "3", "1/0"):
        with pytest.raises(UsageError):
            Shard.parse(bad)


def test_device_parsing():
    assert parse_devices(None, 4) is None
    assert parse_devices("all", 2) == ["0", "1"]
    assert parse_devices("1,0", 2) == ["1", "0"]
    for bad, available in (("all", 0), ("0,0", 2), ("2", 2), ("x", 2), ("-1", 2)):
        with pytest.raises(UsageError):
            parse_devices(bad, available)


def test_balance_spreads_cost():
    groups = balance([5, 4, 3, 3, 2, 1], float, 2)
    assert sorted(sum(g) for g in groups) == [9, 9]


def _square(x):
    return x * x


def _die_on_three(x):
    if x == 3:
        os._exit(7)
    return x


def test_workers_run_and_pin_devices():
    results = dict(map_on_devices(["0", "1"], [[1, 2], [3]], _square, lambda item, why: why))
    assert results == {1: 1, 2: 4, 3: 9}


def test_a_crashing_worker_fails_its_items_not_the_run():
    results = dict(map_on_devices(["0", "1"], [[1, 2], [3, 4]], _die_on_three, lambda item, why: f"crash: {why}"))
    assert results[1] == 1 and results[2] == 2
    assert results[3].startswith("crash: the worker on device 1") and results[4].startswith("crash:")


def test_devices_on_cpu_equal_a_plain_run(goldens):  # noqa: F811
    runner = CliRunner()
    plain = runner.invoke(app, ["verify", str(goldens), "--backend", "torch", "-q"])
    workers = runner.invoke(app, ["verify", str(goldens), "--backend", "torch", "-q", "--devices", "0,1"])
    assert plain.exit_code == workers.exit_code == 0
    assert sorted(plain.stdout.splitlines()) == sorted(workers.stdout.splitlines())   # stderr: the CPU note


def test_shards_of_verify_add_up(goldens):  # noqa: F811
    runner = CliRunner()
    counts = []
    for index in (1, 2, 3):
        result = runner.invoke(app, ["verify", str(goldens), "--backend", "numpy", "-q", "--shard", f"{index}/3"])
        assert result.exit_code in (0, 2)          # 2: an empty shard says so
        counts.append(sum(line.startswith("PASS") for line in result.output.splitlines()))
    assert sum(counts) == 5


def test_report_merges_shard_records(goldens, tmp_path):  # noqa: F811
    runner = CliRunner()
    records = []
    for index in (1, 2):
        record = tmp_path / f"shard{index}.json"
        runner.invoke(app, ["verify", str(goldens), "--backend", "numpy", "-q", "--shard", f"{index}/2",
                            "--json", str(record)])
        if record.exists():
            records.append(str(record))
    merged = tmp_path / "merged.json"
    result = runner.invoke(app, ["report", *records, "--merge", str(merged)])
    assert result.exit_code == 0, result.output
    data = json.loads(merged.read_text())
    assert data["summary"]["cases"] == 5 and data["summary"]["passed"] == 5
    shard_cases = [row["case"] for r in records for row in json.loads(Path(r).read_text())["rows"]]
    assert [row["case"] for row in data["rows"]] == shard_cases


def test_bench_with_worker_processes_times_every_case_once(tmp_path):
    suite = tmp_path / "accept.yaml"
    suite.write_text("op: tree_accept\ncases:\n  - {batch: 2, budget: 4}\n  - {batch: 3, budget: 8}\n"
                     "  - {batch: 4, budget: 2}\n")
    runner = CliRunner()
    record = tmp_path / "bench.json"
    args = ["bench", str(suite), "--no-sanity", "--time-budget", "0.02", "--target", "0.5", "-q"]
    plain = runner.invoke(app, args)
    workers = runner.invoke(app, args + ["--devices", "0,1", "--json", str(record)])
    assert plain.exit_code == workers.exit_code == 0, workers.output
    data = json.loads(record.read_text())
    cases = sorted(row["case"] for row in data["rows"] if row["primary"])
    assert cases == ["b2_n4", "b3_n8", "b4_n2"]
    assert len(data["meta"]["merged_from"]) == 2


def _occupancy(task):
    """A worker's unit for bounded_map: how many tasks (itself included) run while it does."""
    import time
    from pathlib import Path

    folder, index = task
    marker = Path(folder) / f"running-{index}"
    marker.touch()
    time.sleep(0.3)
    seen = len(list(Path(folder).glob("running-*")))
    marker.unlink()
    if index == 99:
        raise ValueError("task 99 fails")
    return index, seen


def test_bounded_map_keeps_the_order_and_the_budget(tmp_path):
    from kdtr.scaleout.parallel import bounded_map

    tasks = [(str(tmp_path), i) for i in range(5)]
    got = list(bounded_map(_occupancy, tasks, jobs=3, cost=lambda task: 1, budget=1))
    assert [index for index, _ in got] == list(range(5))
    assert max(seen for _, seen in got) == 1          # a budget of one cost unit: one at a time
    got = list(bounded_map(_occupancy, tasks, jobs=3, cost=lambda task: 1, budget=2))
    assert [index for index, _ in got] == list(range(5)) and max(seen for _, seen in got) <= 2


def test_bounded_map_raises_a_workers_error_in_its_turn(tmp_path):
    from kdtr.scaleout.parallel import bounded_map

    results = bounded_map(_occupancy, [(str(tmp_path), 0), (str(tmp_path), 99), (str(tmp_path), 1)], jobs=2)
    assert next(results)[0] == 0
    with pytest.raises(ValueError, match="task 99 fails"):
        next(results)


def _thread_settings(_task):
    """A worker's unit: the BLAS/OpenMP thread counts numpy (imported after it) starts with."""
    import os

    from kdtr.scaleout.parallel import THREAD_VARIABLES

    return {name: os.environ.get(name) for name in THREAD_VARIABLES}


def test_bounded_map_workers_share_the_cores_among_their_blas_threads(monkeypatch):
    """Issue 30 row 13: two gen-refs workers each ran a BLAS pool as wide as the machine, slower
    than one process (174 s against 80 s). Each now gets its share of the cores (at least one),
    so workers x threads <= cores; a lower count the user set is kept."""
    from kdtr.scaleout.parallel import THREAD_VARIABLES, bounded_map, cpu_count

    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    share = str(max(1, cpu_count() // 2))
    for got in bounded_map(_thread_settings, [0, 1, 2], jobs=2):
        assert got == {**{name: share for name in THREAD_VARIABLES}, "MKL_NUM_THREADS": "1"}


class _Live:
    """Counts the work items started whose results are still alive (running, queued or held)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = self.most = 0
        self.threads = set()

    def work(self, barrier):
        def run(item):
            with self.lock:
                self.live += 1
                self.most = max(self.most, self.live)
                self.threads.add(threading.current_thread().name)
            if barrier is not None and item < barrier.parties:
                barrier.wait(timeout=60)    # the first `parties` items meet: they run at once
            if item == 99:
                raise ValueError("item 99 fails")
            return _Result(self, item)
        return run


class _Result:
    def __init__(self, live, item):
        self.live, self.item = live, item

    def __del__(self):
        with self.live.lock:
            self.live.live -= 1


def test_threaded_map_overlaps_in_order_within_its_window():
    from kdtr.scaleout.parallel import threaded_map

    live = _Live()
    got = []
    for result in threaded_map(live.work(threading.Barrier(3)), range(10), window=3):
        got.append(result.item)
        del result                             # drop each before asking for the next
    assert got == list(range(10))
    assert live.most == 3 and live.live == 0   # three at once (the barrier), never more alive
    assert threading.current_thread().name not in live.threads


def test_threaded_map_of_window_one_runs_each_in_turn_here():
    from kdtr.scaleout.parallel import threaded_map

    live = _Live()
    assert [r.item for r in threaded_map(live.work(None), range(4), window=1)] == list(range(4))
    assert live.threads == {threading.current_thread().name} and live.most <= 2


@pytest.mark.parametrize("window", [1, 3])
def test_threaded_map_raises_an_items_error_in_its_turn(window):
    from kdtr.scaleout.parallel import threaded_map

    results = threaded_map(_Live().work(None), [0, 99, 1, 2], window=window)
    assert next(results).item == 0
    with pytest.raises(ValueError, match="item 99 fails"):
        next(results)
    with pytest.raises(StopIteration):
        next(results)


def _plain(rows):
    return [{k: v for k, v in row.to_plain().items() if k != "seconds"} for row in rows]


def test_trials_drawn_in_threads_give_the_rows_of_one_at_a_time(goldens, monkeypatch):  # noqa: F811
    """verify --trials draws the trials' inputs `trial_window` at once: the same seeds, inputs and
    rows, in trial order, as one trial at a time in this thread."""
    from kdtr import verify
    from kdtr.verify import Options, find_bundles, verify_bundle

    drawn_in = []
    real_map = verify.run.parallel.threaded_map

    def recording_map(work, items, *, window):
        def drawing(case):
            drawn_in.append(threading.current_thread().name)
            return work(case)
        return real_map(drawing, items, window=window)

    monkeypatch.setattr(verify.run.parallel, "threaded_map", recording_map)
    options = Options(backend="numpy", trials=4)
    for bundle in find_bundles([goldens]):
        monkeypatch.setattr(verify.run, "trial_window", lambda *args: 1)
        alone = verify_bundle(bundle, options)
        assert set(drawn_in) == {threading.current_thread().name}
        drawn_in.clear()
        monkeypatch.setattr(verify.run, "trial_window", lambda *args: 3)
        threaded = verify_bundle(bundle, options)
        assert threading.current_thread().name not in drawn_in and len(drawn_in) == 4
        drawn_in.clear()
        assert [r.trial for r in threaded] == [0, 1, 2, 3, 4]
        assert _plain(threaded) == _plain(alone), bundle


def test_the_trial_window_takes_the_cores_and_the_gen_refs_memory_bound(monkeypatch):
    from kdtr import verify
    from kdtr.config import config
    from kdtr.ops import get_op

    op = get_op("verify_attn")
    params = {"batch": 8, "heads": 16, "prefix": 8192, "budget": 16}
    estimate = op.estimate_bytes("bf16_paged", params)
    monkeypatch.setattr(verify.run.parallel, "cpu_count", lambda: 16)
    try:
        monkeypatch.setenv("KDTREE_MEM_LIMIT", str(100 * estimate))
        config.cache_clear()
        assert verify.trial_window(op, "bf16_paged", params, 5) == 5          # the trials
        monkeypatch.setattr(verify.run.parallel, "cpu_count", lambda: 2)
        assert verify.trial_window(op, "bf16_paged", params, 5) == 2          # the cores
        monkeypatch.setattr(verify.run.parallel, "cpu_count", lambda: 16)
        monkeypatch.setenv("KDTREE_MEM_LIMIT", str(4 * estimate))
        config.cache_clear()
        assert verify.trial_window(op, "bf16_paged", params, 5) == 3          # memory, beside the golden
        monkeypatch.setenv("KDTREE_MEM_LIMIT", str(estimate))
        config.cache_clear()
        assert verify.trial_window(op, "bf16_paged", params, 5) == 1          # one at a time, as before
        assert verify.trial_window(op, "bf16_paged", {"batch": 8}, 5) == 1    # no estimate: as before
    finally:
        config.cache_clear()
