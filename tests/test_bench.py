"""kdtree bench on the CPU: timing statistics, the adaptive stop, records, --compare, CSV, the CLI.

The GPU paths (CUDA graphs, events, L2 flush, ceilings) run on the H200; their records are under
results/. Here they are exercised through synthetic records and the degraded host-timed run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from kdtr import bench
from kdtr.bench import runner as bench_runner
from kdtr.bench import schedule
from kdtr.backends import upload
from kdtr.bench import (BenchRecord, BenchRow, BenchSettings, Ceilings, TimingOptions, agree, compare_records,
                        judge, median_ci, relative_spread, summarize)
from kdtr.compare import compare_output
from kdtr.dtypes import to_numpy
from kdtr.ops import get_op
from kdtr.ops.base import Case

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# -- statistics -------------------------------------------------------------------------------------

def test_median_ci_uses_order_statistics():
    samples = list(range(1, 101))                       # 1..100
    lo, hi = median_ci(samples)
    # 1-based order statistics floor(50 - 9.8) = 40 and ceil(1 + 50 + 9.8) = 61
    assert (lo, hi) == (40, 61)
    assert median_ci([5.0]) == (5.0, 5.0)
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)    # few samples: the whole range
    with pytest.raises(ValueError):
        median_ci([])


def test_relative_spread():
    assert relative_spread([2.0] * 20) == 0.0
    assert relative_spread([1.0]) == math.inf
    samples = [10.0, 10.1, 9.9, 10.05, 9.95] * 8
    spread = relative_spread(samples)
    assert 0 < spread <= 0.01


def test_summarize():
    samples = [1.0, 2.0, 3.0, 4.0, 100.0]
    t = summarize(samples, stop_reason="budget", mode="hot", method="graph", calls_per_sample=7)
    assert t.median == 3.0 and t.n == 5 and t.samples_ms == tuple(samples)
    assert t.p10 == pytest.approx(np.percentile(samples, 10)) and t.p90 == pytest.approx(np.percentile(samples, 90))
    assert t.rel_std == pytest.approx(np.std(samples, ddof=1) / np.mean(samples))
    assert (t.stop_reason, t.mode, t.method, t.calls_per_sample) == ("budget", "hot", "graph", 7)
    steady = summarize([1.0] * 20, stop_reason="converged", mode="hot", method="graph", calls_per_sample=10,
                       resolution_ms=0.0005)
    assert steady.rel_ci == pytest.approx(0.0005 / 10)      # never below the timer's resolution
    floored = summarize([1.0] * 20, stop_reason="converged", mode="hot", method="graph", noise_floor=0.005)
    assert floored.rel_ci == 0.005


def test_agree_uses_the_reported_noise():
    a = summarize([1.00] * 9 + [1.02, 0.98], stop_reason="converged", mode="hot", method="graph")
    b = replace(a, median=1.01, rel_ci=0.01)
    assert agree(a, b)
    assert not agree(replace(a, rel_ci=0.001), replace(b, median=1.2, rel_ci=0.001))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_sampler(clock, value, seconds_per_sample, *, noise=0.0, drift=0.0, seed=0, log=None, name=None):
    """A synthetic implementation: each sample advances the fake clock and reads
    value * (1 + drift * clock) * (1 + noise * N(0, 1)): `drift` per second of the run, e.g. the GPU's
    clock sinking as it heats up."""
    rng = np.random.default_rng(seed)

    def take(n):
        out = []
        for _ in range(n):
            clock.now += seconds_per_sample
            out.append(value * (1 + drift * clock.now) * (1 + noise * rng.standard_normal()))
        if log is not None:
            log.append(name)
        return out
    return bench.Sampler(take, seconds_per_sample, "hot", "graph")


def test_t95_and_between_rounds():
    assert bench.t95(1) == 12.706 and bench.t95(4) == 2.776
    assert bench.t95(30) == pytest.approx(2.042, abs=2e-3) and bench.t95(200) == pytest.approx(1.972, abs=2e-3)
    assert bench.t95(0) == math.inf
    assert bench.between_rounds([1.0], 1.0) is None
    assert bench.between_rounds([1.0, 1.0, 1.0], 1.0) == 0.0
    medians = [1.00, 1.02, 0.98, 1.01, 0.99]
    assert bench.between_rounds(medians, 1.0) == pytest.approx(2.776 * np.std(medians, ddof=1) / math.sqrt(5))


def test_summarize_takes_the_larger_of_sample_and_round_noise():
    samples = [1.0] * 40
    t = summarize(samples, stop_reason="budget", mode="hot", method="graph",
                  round_medians=[1.0, 1.02, 0.98, 1.0, 1.0])
    assert t.rel_ci_samples == 0.0 and t.rel_ci_rounds == pytest.approx(t.rel_ci) and t.rel_ci > 0.01
    assert t.rounds == 5 and t.round_medians == (1.0, 1.02, 0.98, 1.0, 1.0)
    one = summarize(samples, stop_reason="budget", mode="hot", method="graph", round_medians=[1.0])
    assert one.rel_ci_rounds is None and one.rel_ci == 0.0


def test_interleave_stops_when_converged():
    clock = FakeClock()
    opts = TimingOptions(budget_s=10, target=0.01, min_samples=10, max_samples=1000)
    timings = bench.interleave([fake_sampler(clock, 1.0, 0.001), fake_sampler(clock, 5.0, 0.002)], opts, clock=clock)
    assert [t.stop_reason for t in timings] == ["converged", "converged"]
    assert all(t.rounds == opts.min_rounds and t.rel_ci == 0 for t in timings)
    assert [t.median for t in timings] == [1.0, 5.0]


def test_interleave_stops_at_the_budget_and_says_so():
    clock = FakeClock()
    opts = TimingOptions(budget_s=1.0, target=1e-6, min_samples=5, max_samples=10_000, rounds=8)
    samplers = [fake_sampler(clock, 1.0, 1 / 64, noise=0.3, seed=s) for s in range(3)]
    timings = bench.interleave(samplers, opts, clock=clock)
    assert {t.stop_reason for t in timings} == {"budget"}
    assert all(t.n == 64 and t.rounds == 8 for t in timings)       # 1/8 s turns of 1/64 s samples
    assert clock.now == 3.0                                          # the budget: 1 s per implementation


def test_interleave_stops_at_max_samples_and_max_rounds():
    clock = FakeClock()
    opts = TimingOptions(budget_s=100, target=1e-9, min_samples=4, max_samples=50, rounds=5)
    [t] = bench.interleave([fake_sampler(clock, 1.0, 0.001, noise=0.3)], opts, clock=clock)
    assert t.stop_reason == "max_samples" and t.n == 50 and t.rounds == 5
    opts = replace(opts, max_samples=100_000, rounds=50, max_rounds=7)
    [t] = bench.interleave([fake_sampler(clock, 1.0, 0.001, noise=0.3)], opts, clock=clock)
    assert t.stop_reason == "max_rounds" and t.rounds == 7


def test_interleave_slow_calls_get_min_rounds_then_stop_at_the_budget():
    clock = FakeClock()
    opts = TimingOptions(budget_s=0.5, target=1e-9, min_samples=10, max_samples=100)
    timings = bench.interleave([fake_sampler(clock, 200.0, 0.2, noise=0.1), fake_sampler(clock, 1.0, 0.001)],
                               opts, clock=clock)
    slow, fast = timings
    assert slow.stop_reason == "budget" and slow.n == opts.min_rounds == slow.rounds    # one sample a turn
    assert fast.rounds == opts.min_rounds and fast.n > slow.n


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7])
def test_balanced_turns_put_every_implementation_after_every_other_once_per_cycle(m):
    cycle = bench.balanced_turns(m)
    assert sorted(cycle) == sorted(list(range(m)) * max(1, m - 1))
    after = [(cycle[k - 1], cycle[k]) for k in range(len(cycle))] if m > 1 else []   # cyclic: across cycles too
    assert sorted(after) == sorted((a, b) for a in range(m) for b in range(m) if a != b)


def test_interleave_runs_whole_cycles_of_balanced_turns():
    clock, log = FakeClock(), []
    opts = TimingOptions(budget_s=10, target=0.5, min_samples=1, max_samples=100, min_rounds=3)
    bench.interleave([fake_sampler(clock, 1.0, 0.001, log=log, name=n) for n in "ABC"], opts, clock=clock)
    cycle = "".join("ABC"[i] for i in bench.balanced_turns(3))
    assert "".join(log) == cycle * 2          # 2 turns each per cycle: 2 cycles reach min_rounds = 3


def test_a_heavy_neighbour_no_longer_lands_on_one_implementation(monkeypatch):
    """What the H200 showed: a turn right after a heavy baseline runs 5% slow (clocks, power).
    Ours, the heavy one and ours again: in balanced turns both timings of ours follow the heavy one
    equally often, so they agree within their noise; in a rotated order the same one always followed
    it and the two timings disagreed."""
    def timings():
        state = {"last": None}
        rng = np.random.default_rng(3)

        def sampler(name, value):
            def take(n):                        # a turn right after the heavy one runs slow throughout
                slow = 1.05 if state["last"] == "heavy" else 1.0
                state["last"] = name
                return [value * slow * (1 + 0.002 * rng.standard_normal()) for _ in range(n)]
            return bench.Sampler(take, 0.001, "cold-flush", "graph")
        ours, heavy = sampler("ours", 1.0), sampler("heavy", 10.0)
        opts = TimingOptions(budget_s=0.05, target=1e-9, min_samples=10, max_samples=60, rounds=8)
        first, _, second = bench.interleave([ours, heavy, ours], opts)
        return first, second

    assert agree(*timings())
    monkeypatch.setattr(schedule, "balanced_turns", lambda m: [(r + j) % m for r in range(m) for j in range(m)])
    assert not agree(*timings())


def test_interleave_stops_at_the_deadline_after_min_rounds():
    clock = FakeClock()
    opts = TimingOptions(budget_s=100, target=1e-9, min_samples=1, max_samples=100_000)
    [t] = bench.interleave([fake_sampler(clock, 1.0, 0.01, noise=0.1)], opts, clock=clock, deadline=0.001)
    assert t.stop_reason == "time_limit" and t.rounds == opts.min_rounds


def test_interleave_drops_a_failing_implementation_and_goes_on():
    clock = FakeClock()
    calls = []

    def take(n):
        calls.append(n)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory")
        return [2.0] * n
    failing = bench.Sampler(take, 0.001, "cold-flush", "eager")
    opts = TimingOptions(budget_s=1, target=0.01, min_samples=1)
    ours, other = bench.interleave([fake_sampler(clock, 1.0, 0.001), failing], opts, clock=clock)
    assert ours.median == 1.0 and ours.rounds == opts.min_rounds
    assert isinstance(other, RuntimeError) and len(calls) == 2


DRIFT_OPTS = TimingOptions(budget_s=0.5, target=1e-9, min_samples=10, max_samples=10_000, rounds=8)


def _drifting(clock, seed=0):
    """Ours (1 ms), a heavy baseline (10 ms), ours again: 2%/s slower as the run goes on, 0.2% noise."""
    return (fake_sampler(clock, 1.0, 0.002, drift=0.02, noise=0.002, seed=seed),
            fake_sampler(clock, 10.0, 0.02, drift=0.02, noise=0.002, seed=seed + 1),
            fake_sampler(clock, 1.0, 0.002, drift=0.02, noise=0.002, seed=seed + 2))


def test_drift_biases_sequential_timings_and_interleaving_removes_it():
    # One after the other (the old way, and what --repeat did): ours again runs 1 s after ours
    # and comes out 2% slower; the speedup over the baseline is off by 1%. Even with its own
    # rounds' spread, a timing cannot see drift that happens after it: the repeat disagrees.
    clock = FakeClock()
    ours, base, again = (schedule._one([s], DRIFT_OPTS, clock=clock) for s in _drifting(clock))
    assert again.median / ours.median - 1 == pytest.approx(0.02, abs=0.003)
    assert not agree(ours, again)
    assert base.median / ours.median / 10 - 1 == pytest.approx(0.01, abs=0.002)
    # Interleaved rounds, same budget: all three see the same drift. Ours and ours again agree to
    # well inside their noise, the speedup is unbiased, and the drift inside the rounds shows up in
    # the reported noise (the rounds' spread), not hidden under the samples' tiny CI.
    clock = FakeClock()
    ours, base, again = bench.interleave(list(_drifting(clock)), DRIFT_OPTS, clock=clock)
    assert abs(again.median / ours.median - 1) < 0.003
    assert agree(ours, again)
    assert abs(base.median / ours.median / 10 - 1) < 0.003
    assert ours.rel_ci_rounds > 3 * ours.rel_ci_samples and ours.rel_ci == ours.rel_ci_rounds
    assert 3 * DRIFT_OPTS.budget_s <= clock.now <= 1.3 * 3 * DRIFT_OPTS.budget_s   # the same bound (+ the last cycle)


def test_reported_noise_is_a_real_measure_of_run_to_run_variation():
    # No drift, 1% noise: the reported 95% CI covers the true median in >= 90% of 200 timings, and
    # two interleaved timings of the same sampler disagree in at most a few percent of runs. With
    # no noise floor, the noise is never inflated past what the data show: its median stays < 1%.
    clock = FakeClock()
    opts = TimingOptions(budget_s=0.05, target=0.002, min_samples=10, max_samples=400)
    covered, disagree, noises = 0, 0, []
    for seed in range(200):
        shared = fake_sampler(clock, 1.0, 0.001, noise=0.01, seed=seed)
        first, second = bench.interleave([shared, shared], opts, clock=clock)
        covered += abs(first.median - 1.0) <= first.rel_ci * first.median
        disagree += not agree(first, second)
        noises.append(first.rel_ci)
    assert covered >= 180 and disagree <= 10
    assert float(np.median(noises)) < 0.01



def test_host_timer_measures_a_callable():
    import time

    timing = bench.HostTimer().measure([lambda: time.sleep(0.002)], options=TimingOptions(
        budget_s=0.2, target=0.2, min_samples=5, warmup_s=0.0))
    assert timing.mode == "host" and timing.method == "host" and timing.n >= 5
    assert 1.9 <= timing.median <= 20


def test_timing_options_are_checked():
    from kdtr.errors import UsageError

    with pytest.raises(UsageError):
        TimingOptions(budget_s=0).check()
    with pytest.raises(UsageError):
        TimingOptions(min_samples=10, max_samples=5).check()


def test_rotation_sets():
    flush = 120 << 20
    assert bench.rotation_sets(16 << 20, flush) == 8
    assert bench.rotation_sets(200 << 20, flush) == 1          # bigger than twice the L2: flush
    assert bench.rotation_sets(1000, flush) == 1               # too many sets: flush
    assert bench.rotation_sets(0, flush) == 1


# -- synthetic records ------------------------------------------------------------------------------

CEILINGS = Ceilings(hbm_read_gbps=4500.0, hbm_copy_gbps=4300.0, bf16_mma_tflops=790.0, fp32_fma_tflops=55.0,
                    l2_bytes=60 << 20)


def timing(median_ms, noise=0.002, n=41, seed=0):
    rng = np.random.default_rng(seed)
    samples = median_ms * (1 + noise * rng.standard_normal(n))
    return summarize(samples.tolist(), stop_reason="converged", mode="cold-flush", method="graph")


def row(case, impl, median_ms, *, primary, flops=1e12, nbytes=1e9, seed=0, noise=0.002, **kw):
    r = BenchRow(case=case, op="verify_attn", variant="bf16_paged", config={"B": 8, "H": 64},
                 impl=impl, mode="cold", primary=primary, timing=timing(median_ms, noise, seed=seed),
                 flops=flops, bytes=nbytes, check_passed=True, check="checked out, lse",
                 params={"batch": 8}, **kw)
    return bench.with_figures(r, CEILINGS)


def record(scale=1.0, noise=0.002, seed=0):
    rows = []
    for i, case in enumerate(("a", "b", "c")):
        rows += [row(case, "cuda", 2.0 * (i + 1) * scale, primary=True, seed=seed + i, noise=noise),
                 row(case, "torch", 20.0 * (i + 1), primary=False, seed=seed + 10 + i, noise=noise),
                 BenchRow(case=case, op="verify_attn", variant="bf16_paged", config={"B": 8, "H": 64},
                          impl="sdpa", mode="cold", primary=False, timing=None, flops=1e12, bytes=1e9,
                          skip="would need ~146 GB", params={"batch": 8})]
    rows = bench.with_speedups(rows)
    meta = {"device": {"gpu": "NVIDIA H200"}, "commit": "abc", "seconds": 1.0}
    settings = {"primary": "cuda", "gpu": True, "modes": ["cold"], "timer": "CUDA events",
                "timing": {"budget_s": 0.5, "target": 0.01}}
    return BenchRecord(meta, settings, CEILINGS, (), tuple(rows))


def test_figures_and_flags():
    r = row("a", "cuda", 2.0, primary=True)                  # 1e12 FLOP in 2 ms = 500 TFLOP/s
    assert r.tflops == pytest.approx(500, rel=0.01) and r.gbps == pytest.approx(500, rel=0.01)
    assert r.pct_compute == pytest.approx(500 / 790, rel=0.01)
    assert r.pct_bandwidth == pytest.approx(500 / 4500, rel=0.01) and not r.flagged
    fast = row("a", "cuda", 1.0, primary=True)                 # 1000 TFLOP/s > 790: impossible
    assert fast.flagged and fast.pct_compute > 1
    fp32 = row("a", "cuda", 2.0, primary=True, compute_unit="fp32_fma")
    assert fp32.pct_compute == pytest.approx(500 / 55, rel=0.01) and fp32.flagged
    no_ceiling = bench.with_figures(replace(r, tflops=None, pct_compute=None), None)
    assert no_ceiling.pct_compute is None and no_ceiling.tflops == pytest.approx(500, rel=0.01)


def test_speedups_are_baseline_over_ours_same_case_and_mode():
    rec = record()
    by = {(r.case, r.impl): r for r in rec.rows}
    assert by["a", "cuda"].speedups == {"torch": pytest.approx(10, rel=0.02)}
    assert by["c", "cuda"].speedups["torch"] == pytest.approx(10, rel=0.02)
    assert by["a", "torch"].speedups == {}                    # quoted for our rows only
    failed = bench.with_speedups([replace(by["a", "cuda"], speedups={}),
                                  replace(by["a", "torch"], check_passed=False)])
    assert failed[0].speedups == {}                           # a failed check is never a baseline


def test_record_json_round_trip(tmp_path):
    rec = record()
    path = tmp_path / "r.json"
    bench.write_record(path, rec)
    text = path.read_text()
    data = json.loads(text)
    assert data["kind"] == "kdtree.bench" and data["bench_format"] == bench.BENCH_FORMAT
    assert set(data) >= {"meta", "settings", "ceilings", "sanity", "rows", "errors", "not_run", "complete"}
    assert "\n " not in text and data["samples_file"] == "r.samples.npz"         # compact; names its sidecar
    first = data["rows"][0]
    assert set(first["timing"]) >= {"median", "p10", "p90", "rel_std", "rel_ci", "n", "rounds",
                                    "stop_reason", "mode", "method"}
    assert not {"samples_ms", "round_medians"} & set(first["timing"])          # the raw series: in the sidecar
    assert bench.load_record(path) == rec


def _all_timings(rec):
    return [t for r in (*rec.sanity, *rec.rows) for t in (r.timing, r.repeat) if t is not None] + \
        list((rec.ceilings.timings if rec.ceilings else {}).values())


def test_samples_come_back_from_the_sidecar_bit_for_bit(tmp_path):
    rng = np.random.default_rng(7)
    rec = record()
    rows = [replace(r, timing=replace(r.timing, samples_ms=tuple(rng.random(r.timing.n) * 3e-3)))
            if r.timing else r for r in rec.rows]
    rows[0] = replace(rows[0], repeat=replace(rows[0].timing, samples_ms=tuple(rng.random(rows[0].timing.n))))
    ceilings = replace(CEILINGS, timings={"hbm_read": timing(0.5, seed=3)})
    rec = replace(rec, rows=tuple(rows), ceilings=ceilings, sanity=(replace(rows[1], op="sanity"),))
    path = tmp_path / "bench.json"
    bench.write_record(path, rec)
    assert (tmp_path / "bench.samples.npz").is_file()
    back = bench.load_record(path)
    assert back == rec
    for a, b in zip(_all_timings(back), _all_timings(rec)):
        assert np.array_equal(np.asarray(a.samples_ms).view(np.uint64), np.asarray(b.samples_ms).view(np.uint64))
    assert len(_all_timings(back)) == 3 * 2 + 1 + 1 + 1          # 6 rows timed, a repeat, a sanity row, a ceiling


def test_a_record_without_its_sidecar_loads_with_summaries_only(tmp_path):
    path = tmp_path / "bench.json"
    bench.write_record(path, record())
    (tmp_path / "bench.samples.npz").unlink()
    rec = bench.load_record(path)
    assert all(t.samples_ms == () and t.n == 41 for t in _all_timings(rec))
    assert [r.timing.median for r in rec.rows if r.timing] == [r.timing.median for r in record().rows if r.timing]
    report = invoke("report", path, "--csv", tmp_path / "r.csv", "--quiet")
    assert report.exit_code == 0 and "vs_torch=10" in report.output, report.output
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 10
    assert invoke("bench", "--compare", path, path, "--quiet").exit_code == 0
    again = tmp_path / "again.json"                # written again without samples: still loads
    bench.write_record(again, rec)
    assert bench.load_record(again) == rec and not (tmp_path / "again.samples.npz").exists()


def test_a_sidecar_of_another_record_is_refused(tmp_path):
    from kdtr.errors import UsageError

    path = tmp_path / "bench.json"
    bench.write_record(path, record())
    other = tmp_path / "other.json"
    bench.write_record(other, replace(record(), rows=record().rows[:3]))
    (tmp_path / "other.samples.npz").replace(tmp_path / "bench.samples.npz")
    with pytest.raises(UsageError, match="bench.samples.npz.*a sidecar of another run"):
        bench.load_record(path)
    (tmp_path / "bench.samples.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match=r"bench.samples.npz.*not a samples sidecar"):
        bench.load_record(path)


def _default_suites_shape():
    """(op, variant) -> the implementations a GPU run times for each case of specs/bench (ours and
    the default baselines), and the number of cases."""
    from kdtr import spec
    from kdtr.config import REPO_ROOT

    small = {"tree_accept": dict(batch=2, budget=4, depth=3), "tree_build": dict(batch=2, depth=5, vocab=64, budget=12),
             "verify_attn": dict(batch=2, heads=4, prefix=30, budget=6)}
    items = bench.items_from_suites(spec.load_suites(REPO_ROOT / "specs" / "bench"))
    shape = {}
    for op_name, variant in sorted({(i.op, i.variant) for i in items}):
        op = get_op(op_name)
        gen = op.generate(Case("t", op_name, variant, 1, dict(op._defaults, **small[op_name])))
        baselines = [n for n, b in op.baselines(variant, gen.inputs, gen.params).items() if b.default]
        shape[op_name, variant] = (["cuda", *baselines], sum((i.op, i.variant) == (op_name, variant) for i in items))
    return shape


def test_a_repeat_run_of_the_default_suites_in_both_modes_writes_under_1_mb(tmp_path):
    """Every Timing at its caps (max_samples samples, max_rounds round medians, ours repeated),
    every sample a full-precision float: the worst case of `kdtree bench --repeat --mode both`."""
    opts = TimingOptions()
    rng = np.random.default_rng(0)

    def full(median_ms):
        samples = median_ms * (1 + 0.01 * rng.standard_normal(opts.max_samples))
        return summarize(samples.tolist(), stop_reason="max_samples", mode="cold-rotate", method="graph",
                         calls_per_sample=37, note="14 input sets rotated",
                         round_medians=(median_ms * (1 + 0.01 * rng.standard_normal(opts.max_rounds))).tolist())

    rows = []
    shape = _default_suites_shape()
    for (op_name, variant), (impls, cases) in shape.items():
        for case in range(cases):
            for mode in ("hot", "cold"):
                group = [BenchRow(case=f"{variant}_b8_h64_q33_p{case}", op=op_name, variant=variant,
                                  config={"B": 8, "H": 64, "Q": 33, "prefix": 8192}, impl=impl, mode=mode,
                                  primary=impl == "cuda", timing=full(0.03 * (k + 1)), flops=1.2e9, bytes=5.9e6,
                                  check_passed=True, check="checked out (rel. L2 1.1e-06), lse (rel. L2 3e-07)",
                                  repeat=full(0.03) if impl == "cuda" else None,
                                  repeat_agrees=True if impl == "cuda" else None, setup_s=0.151,
                                  params={"batch": 8, "heads": 64, "prefix": 8192, "prefix_mode": "same",
                                          "budget": 32, "depth": 6, "sharpness": 1.0, "sm_scale": 0.14467963},
                                  extra={"kv_tokens": 8225, "prefix_mode": "same", "kernel": "bf16_wgmma2"})
                         for k, impl in enumerate(impls)]
                rows += [bench.with_figures(r, CEILINGS) for r in bench.with_speedups(group)]
    sanity = tuple(replace(rows[0], case=f"sanity{i}", op="sanity") for i in range(7))
    ceilings = replace(CEILINGS, timings={k: full(1.0) for k in ("bf16_mma", "fp32_fma", "hbm_read", "hbm_copy",
                                                                 "hbm_copy_eager")})
    rec = BenchRecord(record().meta, record().settings, ceilings, sanity, tuple(rows))
    assert len(rows) == 2 * sum(len(impls) * cases for impls, cases in shape.values()) >= 260
    path = tmp_path / "bench.json"
    bench.write_record(path, rec)
    size = path.stat().st_size
    assert size < 1_000_000, f"{size} bytes"
    assert bench.load_record(path) == rec


def test_cli_bench_json_to_stdout_is_json_alone(suites, tmp_path):
    from kdtr.device import gpu_available

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
    monkeypatch.setattr(bench, "collect_items", lambda *a: pytest.fail("the cases were collected"))
    (tmp_path / "file.txt").write_text("x")
    target = tmp_path if where == "folder" else tmp_path / "file.txt" / "bench.json"
    result = invoke("bench", suites, "--json", target)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and str(target) in result.output
    assert "Traceback" not in result.output


def test_bench_meta_names_no_folder_of_the_machine(tmp_path, monkeypatch):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "cli" / "__main__.py"), "bench", str(tmp_path / "specs"),
                                      f"--json={tmp_path / 'out' / 'b.json'}", "/elsewhere/x.kdtr"])
    monkeypatch.setattr(sys, "orig_argv", ["/opt/venv/bin/python", "-m", "cli", *sys.argv[1:]])
    meta = bench.bench_meta()
    elsewhere = os.path.relpath("/elsewhere/x.kdtr")
    assert meta["argv"] == ["kdtree", "bench", "specs", "--json=out/b.json", elsewhere]
    assert meta["command_line"] == f"python -m cli bench specs --json=out/b.json {elsewhere}"
    assert str(tmp_path) not in json.dumps(meta)


def test_load_record_refuses_what_is_not_a_record(tmp_path):
    from kdtr.errors import UsageError

    (tmp_path / "x.json").write_text("{not json")
    (tmp_path / "y.json").write_text(json.dumps({"kind": "kdtree.verify"}))
    for name in ("x.json", "y.json", "missing.json"):
        with pytest.raises(UsageError, match=name):
            bench.load_record(tmp_path / name)


def test_judge():
    old = timing(2.0, 0.002)
    assert judge(old, old, 0.1)[0] == "same"
    verdict, ratio, noise, regression = judge(old, timing(2.4, 0.002, seed=5), 0.1)
    assert verdict == "slower" and ratio == pytest.approx(1.2, rel=0.01) and regression
    assert judge(old, timing(2.1, 0.002, seed=5), 0.1)[0] == "slower"       # real, below the threshold
    assert not judge(old, timing(2.1, 0.002, seed=5), 0.1)[3]
    assert judge(old, timing(1.6, 0.002, seed=5), 0.1)[0] == "faster"
    noisy_old, noisy_new = replace(old, rel_ci=0.3), replace(old, median=2.2, rel_ci=0.3)
    assert judge(noisy_old, noisy_new, 0.1)[0] == "ambiguous"


def test_compare_records():
    same = compare_records(record(), record())
    assert not same.regressions and same.count("same") == 6 and same.count("untimed") == 3
    slower = compare_records(record(), record(scale=1.2, seed=100))
    assert len(slower.regressions) == 3 and all(r.impl == "cuda" for r in slower.regressions)
    assert {r.verdict for r in slower.rows if r.impl == "cuda"} == {"slower"}
    faster = compare_records(record(), record(scale=0.8, seed=100))
    assert not faster.regressions and faster.count("faster") == 3
    new = record()
    rows = list(new.rows)
    rows[0] = replace(rows[0], timing=None, check_passed=False, check="out: 3 of 10 elements fail")
    failing = compare_records(record(), replace(new, rows=tuple(rows[:-3])))
    assert [r.verdict for r in failing.regressions] == ["failed"]
    assert failing.count("missing") == 3
    other = replace(record(), meta={"device": {"gpu": "NVIDIA H100"}},
                    ceilings=replace(CEILINGS, bf16_mma_tflops=600.0))
    notes = compare_records(record(), other).notes
    assert any("different GPUs" in n for n in notes) and any("bf16_mma_tflops" in n for n in notes)


def test_csv_has_one_line_per_row_and_a_speedup_column_per_baseline():
    text = bench.bench_csv(record())
    lines = list(csv.reader(io.StringIO(text)))
    header, body = lines[0], lines[1:]
    assert header[:len(bench.CSV_HEADER)] == bench.CSV_HEADER
    assert header[len(bench.CSV_HEADER):] == ["speedup_vs_torch"]
    assert len(body) == 9 and all(len(line) == len(header) for line in body)
    first = dict(zip(header, body[0]))
    assert first["impl"] == "cuda" and float(first["median_us"]) == pytest.approx(2000, rel=0.01)
    assert float(first["speedup_vs_torch"]) == pytest.approx(10, rel=0.02)


# -- the CLI: --compare -----------------------------------------------------------------------------

@pytest.fixture
def records(tmp_path):
    paths = {}
    for name, rec in (("base", record()), ("slow", record(scale=1.2, seed=100)),
                      ("fast", record(scale=0.8, seed=100))):
        paths[name] = tmp_path / f"{name}.json"
        bench.write_record(paths[name], rec)
    return paths


def test_cli_compare_with_itself_exits_0(records):
    result = invoke("bench", "--compare", records["base"], records["base"])
    assert result.exit_code == 0, result.output
    assert "0 regression(s)" in result.output


def test_cli_compare_20_percent_slower_exits_1(records):
    result = invoke("bench", "--compare", records["base"], records["slow"], "--quiet")
    assert result.exit_code == 1, result.output
    assert "SLOWER" in result.output and "REGRESSION" in result.output
    assert "3 regression(s) beyond 10%" in result.output


def test_cli_compare_faster_exits_0_and_threshold_applies(records, tmp_path):
    assert invoke("bench", "--compare", records["base"], records["fast"]).exit_code == 0
    # 20% slower is no regression when the threshold is 25%
    assert invoke("bench", "--compare", records["base"], records["slow"], "--threshold", "0.25").exit_code == 0
    out = tmp_path / "cmp.json"
    result = invoke("bench", "--compare", records["base"], records["slow"], "--json", out)
    assert result.exit_code == 1
    data = json.loads(out.read_text())
    assert data["threshold"] == 0.1 and sum(r["regression"] for r in data["rows"]) == 3


def test_cli_compare_bad_records_exit_2(records, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    result = invoke("bench", "--compare", bad, records["base"])
    assert result.exit_code == 2 and "not a kdtree bench record" in result.output
    assert invoke("bench", "--compare", tmp_path / "absent.json", records["base"]).exit_code == 2
    assert invoke("bench", records["base"]).exit_code == 2          # a record without --compare


def test_cli_report_renders_and_writes_csv(records, tmp_path):
    out = tmp_path / "r.csv"
    result = invoke("report", records["base"], "--csv", out)
    assert result.exit_code == 0, result.output
    assert "NVIDIA H200" in result.output and "10.00×" in result.output
    assert "skipped sdpa in 3 case(s): would need ~146 GB" in result.output
    assert len(out.read_text().splitlines()) == 10


def test_cli_report_names_the_kernel_our_launch_picked(tmp_path):
    """A GPU record keeps the kernel each case launched (extra["kernel"]): shown beside our rows only."""
    rec = record()
    rows = [replace(r, extra={"kernel": "bf16_wgmma2"}) if i < 2 else r   # ours and a baseline of case a
            for i, r in enumerate(rec.rows)]
    rec = replace(rec, rows=tuple(rows))
    path = tmp_path / "k.json"
    bench.write_record(path, rec)
    table = invoke("report", path)
    assert table.exit_code == 0 and table.output.count("bf16_wgmma2") == 1, table.output
    plain = invoke("report", path, "--quiet")
    lines = [line for line in plain.output.splitlines() if "kernel=" in line]
    assert len(lines) == 1 and lines[0].startswith("cuda verify_attn/bf16_paged a cold kernel=bf16_wgmma2 ")


def test_cli_report_shows_the_grid_our_launch_picked(tmp_path):
    """The launch's shape-dependent choices (extra["grid"]: row tiles, B, KV splits) stand beside
    the kernel: in the table, and as grid= in the plain lines."""
    rec = record()
    rows = [replace(r, extra={"kernel": "bf16_wgmma2", "grid": [9, 8, 3]}) if i == 0 else r
            for i, r in enumerate(rec.rows)]
    path = tmp_path / "g.json"
    bench.write_record(path, replace(rec, rows=tuple(rows)))
    table = invoke("report", path)
    assert table.exit_code == 0 and "9×8×3" in table.output, table.output
    plain = invoke("report", path, "--quiet")
    assert " kernel=bf16_wgmma2 grid=9x8x3 median=" in plain.output, plain.output


def test_cli_report_plot(records, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    result = invoke("report", records["base"], "--plot", png, "--quiet")
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_series():
    from kdtr.plot import prefix_series, roofline_points

    rec = record()
    prefixes = {0: 1024, 3: 4096}                   # case a and b of our kernel: a prefix sweep
    rows = [replace(r, config={"B": 1, "H": 16, "prefix": prefixes[i]}) if i in prefixes else r
            for i, r in enumerate(rec.rows)]
    rec = replace(rec, rows=tuple(rows))
    series = prefix_series(rec)
    assert list(series.values()) == [[(1024, rec.rows[0].timing.median), (4096, rec.rows[3].timing.median)]]
    groups = roofline_points(rec)
    assert set(groups) == {"cuda (verify_attn/bf16_paged)", "torch (verify_attn/bf16_paged)"}


# -- the CLI: a degraded run on the CPU -------------------------------------------------------------

SUITES = {
    "tree_build": "op: tree_build\nseed: 1\ncases:\n  - {name: tb_small, batch: 3, depth: 5, vocab: 64, budget: 12}\n",
    "tree_accept": "op: tree_accept\nseed: 1\ncases:\n  - {name: ta_small, batch: 4, budget: 8, depth: 4}\n"
                   "  - {name: ta_other, batch: 2, budget: 4, depth: 3}\n  - {name: ta_third, batch: 2, budget: 6}\n",
    "verify_attn": "op: verify_attn\nseed: 1\ncases:\n"
                   "  - {name: va_fp32, variant: fp32, batch: 2, heads: 4, prefix: 30, budget: 6}\n"
                   "  - {name: va_bf16, variant: bf16_paged, batch: 2, heads: 4, prefix: 30, budget: 6, prefix_mode: mixed}\n",
}


@pytest.fixture
def suites(tmp_path):
    folder = tmp_path / "bench"
    folder.mkdir()
    for op, text in SUITES.items():
        (folder / f"{op}.yaml").write_text(text)
    return folder


FAST = ("--time-budget", "0.05", "--target", "0.2")


def test_cli_bench_cpu_run_json_csv(suites, tmp_path):
    from kdtr.device import gpu_available

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
    from kdtr.device import gpu_available

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
    from kdtr.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    result = invoke("bench", suites, "--backend", "cuda")
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


def test_cli_bench_exit_1_when_our_implementation_is_wrong(suites, tmp_path, monkeypatch):
    from kdtr.device import gpu_available

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
    from kdtr.device import gpu_available

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


def test_cli_report_names_baselines_cut_by_the_time_limit_and_repeat_disagreements(tmp_path):
    rec = record()
    rows = list(rec.rows)
    ours = rows[0]
    rows[0] = replace(ours, repeat=replace(ours.timing, median=ours.timing.median * 1.02),
                      repeat_agrees=False)
    rows[3] = replace(rows[3], repeat=rows[3].timing, repeat_agrees=True)
    rows[4] = replace(rows[4], timing=None, skip=bench.TIME_LIMIT_SKIP, speedups={})
    path = tmp_path / "cut.json"
    bench.write_record(path, replace(rec, rows=tuple(rows), complete=False, not_run=("verify_attn/bf16_paged d",)))
    result = invoke("report", path, "--quiet")
    assert result.exit_code == 0, result.output
    assert "skipped torch in 1 case(s): the run's time limit was reached: b" in result.output
    assert "repeat: 1 of 2 second timings agree with the first within the reported noise: not a (+2.0%" in result.output
    assert "not run (time limit): 1 case(s): verify_attn/bf16_paged d" in result.output
    assert "rounds stopped: 3 converged" in result.output


def test_cli_bench_bundles(tmp_path):
    from kdtr.device import gpu_available

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


# -- the default suites and the ops' bench hooks ----------------------------------------------------

def test_default_bench_suites():
    from kdtr import spec
    from kdtr.config import REPO_ROOT

    suites = spec.load_suites(REPO_ROOT / "specs" / "bench")
    assert {s.op for s in suites} == {"tree_build", "verify_attn", "tree_accept"}
    attn = {(c.variant, c.params["batch"], c.params["heads"], c.params["budget"] + 1, c.params["prefix"])
            for s in suites if s.op == "verify_attn" for c in s.cases}
    for perf_case in [("fp32", 1, 16, 17, 2048), ("bf16_paged", 8, 64, 33, 8192),
                      ("bf16_paged", 64, 16, 65, 32768), ("bf16_paged", 1, 128, 65, 131072),
                      ("fp32", 4, 16, 17, 8192)]:
        assert perf_case in attn
    # where it serves (TP8: 8 heads a GPU): the shapes of the serving issue's table
    for serving_case in [("bf16_paged", 1, 8, 9, 21), ("bf16_paged", 1, 16, 17, 2048),
                         ("bf16_paged", 8, 8, 33, 8192), ("bf16_paged", 32, 8, 65, 4096),
                         ("bf16_paged", 16, 16, 33, 4096)]:
        assert serving_case in attn
    # the latency sweeps: prefix 21 .. 32768 at B in {1, 8}, H in {8, 16}; Q in {9, 17, 33, 65}
    for b in (1, 8):
        for h in (8, 16):
            assert {p for _, bb, hh, q, p in attn if (bb, hh, q) == (b, h, 17)} >= {21, 2048}
        assert {p for _, bb, hh, q, p in attn if (bb, hh, q) == (b, 8, 17)} >= {21, 2048, 32768}
        assert {q for _, bb, hh, q, p in attn if (bb, hh, p) == (b, 8, 2048)} >= {9, 17, 65}
    assert {h for _, _, h, _, _ in attn} >= {8, 16, 64, 128}
    assert {q for _, _, _, q, _ in attn} >= {5, 9, 17, 33, 65}
    assert min(p for *_, p in attn) <= 21 and max(p for *_, p in attn) == 131072
    assert {b for _, b, *_ in attn} >= {1, 64}
    for s in suites:
        if s.op in ("tree_build", "tree_accept"):
            assert all(c.params["depth"] == 15 for c in s.cases)
            assert {c.params["batch"] for c in s.cases} >= {1, 256}
            assert {c.params["budget"] for c in s.cases} >= {8, 64}
    quick = bench.items_from_suites(suites, quick=True)
    assert len(quick) == len(suites) * bench.QUICK_CASES_PER_SUITE
    assert any(i.op == "verify_attn" and i.params["heads"] == 8 for i in quick)     # --quick keeps TP8


@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
def test_verify_attn_dense_reference_and_sdpa_baseline(variant):
    op = get_op("verify_attn")
    case = Case("t", "verify_attn", variant, 5, dict(op._defaults, batch=3, heads=8, prefix=40, budget=6,
                                                     prefix_mode="mixed"))
    generated = op.generate(case)
    expected = op.reference(variant, generated.inputs, generated.params)
    inputs = upload(generated.inputs, "cpu")
    for chunk in (None, 4000, 1):                    # whole, request chunks, head chunks
        got = op.dense_reference(variant, inputs, generated.params, chunk_bytes=chunk)
        for name in ("out", "lse"):
            np.testing.assert_allclose(to_numpy(got[name]), expected[name], rtol=1e-6, atol=1e-6)
    assert op.bench_reference(variant, inputs, generated.params) is None      # CPU: the numpy reference
    baselines = op.baselines(variant, generated.inputs, generated.params)
    if variant == "fp32":
        assert set(baselines) == {"torch", "torch_compile", "sdpa"}
        assert baselines["torch_compile"].slow_setup and baselines["torch"].backend == "torch"
    else:
        assert set(baselines) == {"torch_bf16", "torch_compile_bf16", "torch_fp32", "torch_compile_fp32", "sdpa"}
        assert baselines["torch_compile_bf16"].slow_setup and baselines["torch_fp32"].backend == "torch"
        assert not baselines["torch_compile_fp32"].default                # only when --baseline names it
        assert all(b.default for name, b in baselines.items() if name != "torch_compile_fp32")
    got = baselines["sdpa"].prepare(variant, inputs, generated.params)()
    assert set(got) == {"out"}
    tol = op.tolerances(variant)["out"]
    assert compare_output("out", to_numpy(got["out"]), expected["out"], tol).passed
    assert op.compute_unit(variant) == ("fp32_fma" if variant == "fp32" else "bf16_mma")
    assert op.bench_extra(variant, generated.inputs, generated.params)["kv_tokens"] > 0


def test_tree_build_cpu_heap_baseline_is_the_reference():
    op = get_op("tree_build")
    case = Case("t", "tree_build", "default", 3, dict(op._defaults, batch=4, depth=15, vocab=128, budget=32))
    generated = op.generate(case)
    baselines = op.baselines("default", generated.inputs, generated.params)
    assert set(baselines) == {"torch", "cpu_heap"} and baselines["cpu_heap"].clock == "host"
    got = baselines["cpu_heap"].prepare("default", upload(generated.inputs, "cpu"), generated.params)()
    expected = op.reference("default", generated.inputs, generated.params)
    for name, value in expected.items():
        np.testing.assert_array_equal(to_numpy(got[name]), value)


def test_default_baseline_is_the_torch_backend():
    op = get_op("tree_accept")
    baselines = op.baselines("default", {}, {})
    assert list(baselines) == ["torch"] and baselines["torch"].clock == "device"
    assert op.compute_unit("default") == "bf16_mma" and op.bench_reference("default", {}, {}) is None


# -- the device timer's logic against a fake CUDA (the real one runs on the H200) --------------------

class FakeCuda:
    """Events read a fake device clock that advances as fake kernels 'run'; a graph records the
    kernels called while it captures and runs them again on replay."""

    def __init__(self):
        self.now = 0.0
        self.capturing = None
        self.flushes = 0
        self.fail_capture = False

    def kernel(self, ms, log=None):
        def run():
            if self.capturing is not None:
                if self.fail_capture:
                    raise RuntimeError("operation not permitted when stream is capturing")
                self.capturing.nodes.append(run)
                return
            self.now += ms
            if log is not None:
                log.append(ms)
        return run

    def install(self, monkeypatch):
        import contextlib

        import torch

        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = fake.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        class Graph:
            def __init__(self):
                self.nodes = []

            def replay(self):
                for node in self.nodes:
                    node()

        @contextlib.contextmanager
        def graph(g, **_):
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None

        class Stream:
            def wait_stream(self, other):
                pass

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)

        def flush(timer):
            fake.flushes += 1
        monkeypatch.setattr(bench.DeviceTimer, "flush", flush)
        return self


OPTS = TimingOptions(budget_s=5, target=0.01, min_samples=10, max_samples=100, warmup_s=0, sample_ms=0.5)


def test_device_timer_hot_graph_divides_by_calls_per_sample(monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    t = bench.DeviceTimer(60 << 20).measure([fake.kernel(0.002)], options=OPTS, mode="hot")
    assert (t.mode, t.method) == ("hot", "graph")
    assert t.calls_per_sample == 250                      # 0.5 ms samples of 2 us calls
    assert t.median == pytest.approx(0.002) and t.stop_reason == "converged"
    assert t.rel_ci == pytest.approx(0.0005 / (t.calls_per_sample * 0.002))     # the event resolution
    assert t.rounds == OPTS.min_rounds and t.rel_ci_rounds == pytest.approx(0, abs=1e-9)
    t = bench.DeviceTimer(60 << 20).measure([fake.kernel(0.002)], options=replace(OPTS, noise_floor=0.005), mode="hot")
    assert t.rel_ci == pytest.approx(0.005)                      # a noise floor, when asked for one
    assert fake.flushes == 0


def test_device_timer_cold_flush_and_rotate(monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    timer = bench.DeviceTimer(60 << 20)
    t = timer.measure([fake.kernel(0.05)], options=OPTS, mode="cold")
    assert (t.mode, t.method, t.calls_per_sample) == ("cold-flush", "graph", 1)
    assert fake.flushes == t.n and t.median == pytest.approx(0.05)
    logs = [[] for _ in range(3)]
    calls = [fake.kernel(0.01 * (i + 1), log) for i, log in enumerate(logs)]
    t = timer.measure(calls, options=OPTS, mode="cold")
    assert (t.mode, t.method) == ("cold-rotate", "graph") and t.calls_per_sample % 3 == 0
    assert t.median == pytest.approx(0.02)                # the mean over the three sets
    assert "3 input sets rotated" in t.note
    assert len(logs[1]) == len(logs[2]) and 0 < len(logs[0]) - len(logs[1]) < 10   # set 0 also calibrates


def test_device_timer_falls_back_to_eager_when_capture_fails(monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    fake.fail_capture = True
    t = bench.DeviceTimer(60 << 20).measure([fake.kernel(0.004)], options=OPTS, mode="hot")
    assert t.method == "eager" and "graph capture failed (RuntimeError" in t.note
    assert t.median == pytest.approx(0.004) and t.calls_per_sample == 125
    t = bench.DeviceTimer(60 << 20).measure([fake.kernel(1.0)], options=OPTS, mode="hot", graph=False)
    assert t.method == "eager" and t.calls_per_sample == 1 and t.note == ""


def _fake_gpu_env(monkeypatch, l2_bytes=4096, modes=("cold",), fake=None):
    (fake or FakeCuda()).install(monkeypatch)
    env = object.__new__(bench_runner._Env)
    env.gpu, env.primary, env.device, env.modes = True, "cuda", "cpu", modes
    env.timer = bench.DeviceTimer(l2_bytes)
    env.host_timer = bench.HostTimer()
    env.ceilings = CEILINGS
    return env


def _fake_run_cuda(op, wrong=False):
    """A stand-in kernel: the torch backend's outputs copied into the preallocated ones."""
    def run_cuda(variant, inputs, params, outputs):
        for name, value in op.run_torch(variant, inputs, params).items():
            outputs[name].copy_(value)
        if wrong:
            outputs[op.outputs[0]].view(-1)[0] += 1
    return run_cuda


@pytest.mark.parametrize("op_name,case_params,l2_bytes,baselines", [
    ("tree_accept", {"batch": 4, "budget": 8, "depth": 4}, 4096, ["torch"]),
    ("verify_attn", {"batch": 2, "heads": 4, "prefix": 30, "budget": 6, "prefix_mode": "mixed"}, 1 << 20,
     ["torch_bf16", "torch_fp32"]),
])
def test_case_runner_cuda_path_on_a_fake_device(monkeypatch, op_name, case_params, l2_bytes, baselines):
    op = get_op(op_name)
    monkeypatch.setattr(op, "run_cuda", _fake_run_cuda(op))
    env = _fake_gpu_env(monkeypatch, l2_bytes)
    variant = op.variants[-1]
    case = Case("c", op_name, variant, 9, dict(op._defaults, **case_params))
    item = bench.BenchItem("c", op_name, variant, case.params, "test",
                           lambda: (lambda g: (g.inputs, g.params))(op.generate(case)))
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), repeat=True,
                             baselines=("torch", "torch_bf16", "torch_fp32"))
    seen = []
    rows = bench_runner._CaseRunner(env, settings, item, seen.append, None).run()
    ours = next(r for r in rows if r.primary)
    assert ours.impl == "cuda" and ours.check_passed, ours.check
    assert ours.timing.mode == "cold-rotate" and "input sets rotated" in ours.timing.note
    assert ours.repeat is not None and ours.repeat_agrees is not None and ours.setup_s >= 0
    # ours, the baselines and ours again were timed in the same rounds
    assert ours.repeat.rounds == ours.timing.rounds >= OPTS.min_rounds
    assert ours.compute_unit == op.compute_unit(variant)
    assert ours.extra.get("kernel") == op.kernel_choice(variant, *item.load())   # None: one kernel
    assert [r.impl for r in rows] == ["cuda", *baselines]
    for r in rows[1:]:
        assert r.check_passed and r.timing.method == "eager" and r.timing.rounds == ours.timing.rounds, r.check
    assert any("inputs" in s for s in seen)
    assert any(s.endswith(f"rounds (cold): cuda, {', '.join(baselines)}, cuda again") for s in seen), seen


def test_case_runner_reports_a_wrong_kernel_and_a_missing_one(monkeypatch):
    op = get_op("tree_accept")
    env = _fake_gpu_env(monkeypatch, modes=("hot",))
    case = Case("c", "tree_accept", "default", 9, dict(op._defaults, batch=4, budget=8, depth=4))
    item = bench.BenchItem("c", "tree_accept", "default", case.params, "test",
                           lambda: (lambda g: (g.inputs, g.params))(op.generate(case)))
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), baselines=())
    monkeypatch.setattr(op, "run_cuda", _fake_run_cuda(op, wrong=True))
    [row_] = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    assert row_.check_passed is False and row_.timing is None and "accept_len" in row_.check
    monkeypatch.setattr(op, "run_cuda", lambda *a: (_ for _ in ()).throw(NotImplementedError()))
    [row_] = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    assert row_.skip == "tree_accept/default has no run_cuda yet" and row_.check_passed is None


# -- kernel experiments: --kernel and --define, against a fake device ---------------------------------

def _fake_kernels(op, fake, ms, nudge=(), calls=None):
    """run_cuda of fake kernels: the torch backend's outputs, each kernel taking `ms[name]` of fake
    device time per call; a build whose defines name NUDGE, or a kernel in `nudge`, moves the first
    output by one part in 1e7 (well inside verify_attn fp32's tolerances, but not the same bytes)."""
    def run_cuda(variant, inputs, params, outputs, *, kernel=None, defines=None):
        if calls is not None:
            calls.append((kernel, dict(defines or {})))
        for name, value in op.run_torch(variant, inputs, params).items():
            outputs[name].copy_(value)
        if "NUDGE" in (defines or {}) or kernel in nudge:
            first = outputs[op.outputs[0]].view(-1)
            first[0] = first[0] * (1 + 1e-7) + 1e-7
        fake.kernel(ms[kernel])()
    return run_cuda


def _attn_fp32_item():
    op = get_op("verify_attn")
    case = Case("c", "verify_attn", "fp32", 9, dict(op._defaults, batch=2, heads=4, prefix=30, budget=6))
    return op, bench.BenchItem("c", "verify_attn", "fp32", case.params, "test",
                               lambda: (lambda g: (g.inputs, g.params))(op.generate(case)))


def _run_builds(monkeypatch, builds, ms, nudge=(), repeat=False):
    op, item = _attn_fp32_item()
    fake, calls = FakeCuda(), []
    monkeypatch.setattr(op, "run_cuda", _fake_kernels(op, fake, ms, nudge, calls))
    env = _fake_gpu_env(monkeypatch, 1 << 20, ("hot",), fake)
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), baselines=(), kernels=builds,
                             repeat=repeat)
    seen = []
    rows = bench_runner._CaseRunner(env, settings, item, seen.append, None).run()
    return rows, calls, seen


def test_kernel_builds_are_named_parsed_and_checked():
    from kdtr.errors import UsageError

    builds = bench.kernel_builds(["fp32_bf16x3"], ["fp32_bf16x3:FX_NREG_S=232", "sorted:TB_FORCE_EXACT=1,TB_X=-2"])
    assert [b.label for b in builds] == ["fp32_bf16x3", "fp32_bf16x3[FX_NREG_S=232]", "sorted[TB_FORCE_EXACT=1,TB_X=-2]"]
    assert builds[2].defines == (("TB_FORCE_EXACT", "1"), ("TB_X", "-2"))
    with pytest.raises(UsageError, match=r"unknown kernel 'nope'; known: .*sorted \(tree_build\).*fp32_bf16x3 \(verify_attn\)"):
        bench.kernel_builds(["nope"])
    with pytest.raises(UsageError, match="unknown kernel 'nope'"):
        bench.kernel_builds([], ["nope:A=1"])
    for bad in ("fp32_dmma", "fp32_dmma:", "fp32_dmma:A", "fp32_dmma:1A=2", "fp32_dmma:A=1;rm", "fp32_dmma:A=1,"):
        with pytest.raises(UsageError, match="expected KERNEL:KNOB=VALUE"):
            bench.kernel_builds([], [bad])
    with pytest.raises(UsageError, match="given twice: fp32_dmma"):
        bench.kernel_builds(["fp32_dmma", "fp32_dmma"])


def test_forced_kernels_are_timed_against_each_other_in_one_run(monkeypatch):
    builds = bench.kernel_builds(["fp32_dmma", "fp32_bf16x3"], ["fp32_dmma:FX_X=1"])
    rows, calls, seen = _run_builds(monkeypatch, builds, {"fp32_dmma": 0.004, "fp32_bf16x3": 0.002}, repeat=True)
    assert [r.impl for r in rows] == ["fp32_dmma", "fp32_bf16x3", "fp32_dmma[FX_X=1]"]
    assert [(r.kernel, r.defines) for r in rows] == [("fp32_dmma", {}), ("fp32_bf16x3", {}), ("fp32_dmma", {"FX_X": "1"})]
    assert all(r.primary and r.check_passed and r.timing is not None for r in rows), [r.check for r in rows]
    assert {(k, tuple(d.items())) for k, d in calls} == {("fp32_dmma", ()), ("fp32_bf16x3", ()),
                                                         ("fp32_dmma", (("FX_X", "1"),))}
    # one run: every build in the same interleaved rounds (and again, with --repeat)
    assert any(s.endswith("rounds (hot): fp32_dmma, fp32_bf16x3, fp32_dmma[FX_X=1], fp32_dmma again, "
                          "fp32_bf16x3 again, fp32_dmma[FX_X=1] again") for s in seen), seen
    assert len({r.timing.rounds for r in rows}) == 1 and all(r.repeat is not None for r in rows)
    ffma, gemm, knob = rows
    assert ffma.timing.median == pytest.approx(0.004) and gemm.timing.median == pytest.approx(0.002)
    # speedups over the first named kernel, as over a baseline: its median / this one's
    assert ffma.speedups == {} and gemm.speedups == {"fp32_dmma": pytest.approx(2.0)}
    assert knob.speedups == {"fp32_dmma": pytest.approx(1.0)}
    assert "bit for bit equal to fp32_dmma" in knob.check and "bit for bit equal to fp32_dmma" in gemm.check


def test_a_knob_build_that_changes_the_bytes_fails_untimed(monkeypatch):
    builds = bench.kernel_builds(["fp32_dmma"], ["fp32_dmma:NUDGE=1"])
    rows, _, seen = _run_builds(monkeypatch, builds, {"fp32_dmma": 0.004})
    plain, knob = rows
    assert plain.check_passed and plain.timing is not None
    assert knob.check_passed is False and knob.timing is None and knob.speedups == {}
    assert knob.check.startswith("checked out (rel. L2")                     # within the op's tolerances...
    assert "differs bit for bit from fp32_dmma: out (1 of " in knob.check      # ...but not the same bytes
    assert any(s.endswith("rounds (hot): fp32_dmma") for s in seen), seen     # never timed
    assert bench.exit_status(BenchRecord({}, {}, None, (), tuple(rows))) == 1


def test_another_kernel_may_round_differently_within_the_tolerances(monkeypatch):
    builds = bench.kernel_builds(["fp32_dmma", "fp32_bf16x3"])
    rows, _, _ = _run_builds(monkeypatch, builds, {"fp32_dmma": 0.004, "fp32_bf16x3": 0.002}, nudge=("fp32_bf16x3",))
    assert all(r.check_passed and r.timing is not None for r in rows)
    assert "differs bit for bit from fp32_dmma (another kernel): out (1 of " in rows[1].check


def test_items_for_kernels_keeps_the_cases_of_their_op_and_variant(suites):
    from kdtr.errors import UsageError

    items = bench.collect_items([suites])
    assert [i.name for i in bench.items_for_kernels(items, bench.kernel_builds(["fp32_dmma"]))] == ["va_fp32"]
    both = bench.items_for_kernels(items, bench.kernel_builds(["sorted", "bf16_mma"]))
    assert [i.name for i in both] == ["tb_small", "va_bf16"]
    assert bench.items_for_kernels(items, ()) == items
    with pytest.raises(UsageError, match="no case to bench has kernel fp32_dmma"):
        bench.items_for_kernels([i for i in items if i.op != "verify_attn"], bench.kernel_builds(["fp32_dmma"]))


def test_cli_bench_kernel_errors_exit_2(suites):
    unknown = invoke("bench", suites, "--kernel", "nope")
    assert unknown.exit_code == 2 and "unknown kernel 'nope'; known: " in unknown.output
    assert len(unknown.output.strip().splitlines()) == 1
    bad = invoke("bench", suites, "--define", "fp32_dmma")
    assert bad.exit_code == 2 and "expected KERNEL:KNOB=VALUE" in bad.output
    from kdtr.device import gpu_available

    if not gpu_available():
        cpu = invoke("bench", suites, "--kernel", "fp32_dmma")
        assert cpu.exit_code == 2 and "need the cuda backend, not torch" in cpu.output, cpu.output


def _forced_record():
    """Both modes, three builds of long names in a case of a long name, every baseline."""
    rows = []
    for mode in ("hot", "cold"):
        group = [replace(row("b64_h16_q33_p4096_mixed_long_name", label, 2.0 + k, primary=True, seed=k),
                         mode=mode, kernel=label.split("[")[0], defines={"FX_NREG_S": "232"} if "[" in label else {},
                         impl=label)
                 for k, label in enumerate(["fp32_bf16x3", "fp32_bf16x3[FX_NREG_S=232,FX_QREG=1]", "fp32_dmma"])]
        group += [replace(row("b64_h16_q33_p4096_mixed_long_name", b, 20.0 + k, primary=False, seed=9 + k), mode=mode)
                  for k, b in enumerate(["torch_compile_bf16", "torch_compile_fp32", "torch_bf16", "sdpa"])]
        rows += bench.with_speedups(group)
    return replace(record(), rows=tuple(rows))


def test_the_default_table_fits_120_columns_and_wide_shows_every_column(tmp_path):
    from rich.console import Console

    from cli.bench_view import bench_view

    rec = _forced_record()
    for r in rec.rows[:3]:
        assert r.primary
    assert rec.rows[1].speedups["fp32_bf16x3"] == pytest.approx(2.0 / 3.0, rel=0.02)

    def render(**kw):
        buffer = io.StringIO()
        bench_view(rec, console=Console(file=buffer, width=120 if not kw else 400, color_system=None), **kw)
        return buffer.getvalue()

    text = render()
    assert max(map(len, text.splitlines())) <= 120, text
    for shown in ("case", "kernel", "time ± noise", "throughput", "best baseline", "speedup", "vs 1st",
                  "torch_compile_bf16", "fp32_dmma", "TFLOP/s", "0.67×"):    # the fastest baseline; vs the 1st
        assert shown in text, shown
    wide = render(wide=True)
    for column in ("config", "how", "GB/s", "% peak", "% HBM", "vs torch_compile_fp32", "vs sdpa", "vs fp32_bf16x3"):
        assert column in wide, column
    path = tmp_path / "f.json"
    bench.write_record(path, rec)
    data = json.loads(path.read_text())
    assert data["rows"][1]["kernel"] == "fp32_bf16x3" and data["rows"][1]["defines"] == {"FX_NREG_S": "232"}
    assert data["rows"][1]["speedups"]["fp32_bf16x3"] == pytest.approx(2.0 / 3.0, rel=0.02)
    assert bench.load_record(path) == rec


def test_baseline_tolerances():
    attn, accept = get_op("verify_attn"), get_op("tree_accept")
    assert accept.baseline_tolerances("default") == accept.tolerances("default")
    bf16, kernel = attn.baseline_tolerances("bf16_paged"), attn.tolerances("bf16_paged")
    assert bf16["out"] == kernel["out"] and bf16["lse"].atol == 1e-4 > kernel["lse"].atol
    strict, loose = attn.tolerances("fp32")["out"], attn.baseline_tolerances("fp32")["out"]
    assert (loose.atol, loose.rtol) == (strict.atol, strict.rtol) and loose.l2 == 1e-5 > strict.l2


def test_check_outputs_names_what_it_compared():
    op = get_op("verify_attn")
    case = Case("t", "verify_attn", "fp32", 5, dict(op._defaults, batch=2, heads=4, prefix=20, budget=4))
    generated = op.generate(case)
    expected = op.reference("fp32", generated.inputs, generated.params)
    ok, note = bench.check_outputs(op, {"out": expected["out"]}, expected, op.tolerances("fp32"), require_all=False)
    assert ok and note == "checked out (rel. L2 0); it gives no lse"
    ok, note = bench.check_outputs(op, {"out": expected["out"]}, expected, op.tolerances("fp32"), require_all=True)
    assert not ok and note == "produced no lse"


def test_committed_h200_records_still_load_and_render(tmp_path):
    """Records of the format before the sidecar (indented, samples inline) still load and render."""
    from kdtr.config import REPO_ROOT

    records = sorted((REPO_ROOT / "results").glob("**/bench*.json"))
    if not records:
        pytest.skip("no committed bench records")
    for path in records:
        rec = bench.load_record(path)
        assert rec.ceilings is not None and rec.rows
        assert all(len(r.timing.samples_ms) == r.timing.n for r in rec.rows if r.timing)   # inline samples
        result = invoke("report", path, "--csv", tmp_path / "r.csv")
        assert result.exit_code == 0, result.output
        assert "ceilings measured in this run" in result.output
        assert invoke("bench", "--compare", path, path, "--quiet").exit_code == 0


def test_a_device_error_at_cleanup_stops_the_run_with_a_record_not_a_traceback(suites, tmp_path, monkeypatch):
    """A kernel's illegal address surfaces late (at the next synchronizing call, e.g. empty_cache
    after a case): the run stops there, names the case and every case not run, writes its record
    and exits 1 (seen on the H200 when a captured graph's inputs had been freed)."""
    from kdtr import bench
    from kdtr.device import gpu_available

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


def test_source_digest_names_the_code_not_the_checkout(tmp_path):
    """A record's sources_sha256 follows the files (a copied tree with a stale .git still says which
    code ran) and ignores what is not code."""
    from kdtr.report import source_digest

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kdtr").mkdir()
    (tmp_path / "kernels" / "a.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "kdtr" / "x.py").write_text("X = 1\n")
    first = source_digest.__wrapped__(tmp_path)
    (tmp_path / "results.md").write_text("not code\n")
    assert source_digest.__wrapped__(tmp_path) == first
    (tmp_path / "kdtr" / "x.py").write_text("X = 2\n")
    changed = source_digest.__wrapped__(tmp_path)
    assert changed != first
    (tmp_path / "kdtr" / "x.py").rename(tmp_path / "kdtr" / "y.py")     # same bytes, other path
    assert source_digest.__wrapped__(tmp_path) != changed


def test_bench_shards_merge_only_when_they_make_one_run():
    """`report --merge` of bench records: the shards of one selection join; a shard twice, a
    missing one or one of another selection is refused, naming the record."""
    from dataclasses import replace

    from kdtr.errors import UsageError

    def shard(i, n, suite="a" * 64):
        rec = record(seed=i)
        return replace(rec, meta=rec.meta | {"shard": f"{i}/{n}", "suite_sha256": suite})

    merged = bench.merge_shards([shard(2, 2), shard(1, 2)], ["b.json", "a.json"])
    assert merged.meta["shards"] == ["1/2", "2/2"] and merged.meta["shard"] == "1/1"
    assert len(merged.rows) == 2 * len(record().rows)
    for bad in ([shard(1, 2), shard(1, 2)], [shard(1, 2)], [shard(1, 2), shard(2, 2, suite="b" * 64)]):
        with pytest.raises(UsageError, match="not the shards of one run"):
            bench.merge_shards(bad, [f"r{i}.json" for i in range(len(bad))])


def test_bench_selection_meta_names_the_shard_and_the_whole_selection():
    from kdtr.parallel import Shard

    items = [bench.BenchItem(f"c{i}", "tree_accept", "default", {"batch": i}, "s.yaml", lambda: None)
             for i in range(4)]
    whole = bench.selection_meta(items, None)
    assert whole["shard"] == "1/1"
    assert bench.selection_meta(items, Shard(2, 3)) == {"shard": "2/3", "suite_sha256": whole["suite_sha256"]}
    other = bench.selection_meta(items[:3], None)["suite_sha256"]
    assert other != whole["suite_sha256"]


def test_a_launch_knob_is_a_positive_integer_and_may_round_differently(monkeypatch):
    """SPLITS (verify_attn's launch knob) is read by the launch, not the compiler: a build that sets
    it may round differently (another split count, another merge), so it is checked like another
    kernel: timed, its byte differences reported; a value that is no positive integer exits 2."""
    from kdtr.errors import UsageError

    plain, forced = bench.kernel_builds(["fp32_dmma"], ["fp32_dmma:SPLITS=3,NUDGE=1"])
    assert plain.launch == () and forced.launch == ("SPLITS",) and forced.label == "fp32_dmma[SPLITS=3,NUDGE=1]"
    for bad in ("0", "-1", "x", "2.5"):
        with pytest.raises(UsageError, match=f"SPLITS={re.escape(bad)}: a launch knob takes a positive integer"):
            bench.kernel_builds([], [f"fp32_dmma:SPLITS={bad}"])
    rows, _, _ = _run_builds(monkeypatch, (plain, forced), {"fp32_dmma": 0.004})
    assert all(r.check_passed and r.timing is not None for r in rows), [r.check for r in rows]
    assert "differs bit for bit from fp32_dmma (another launch): out (1 of " in rows[1].check
