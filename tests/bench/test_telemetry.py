"""Timing a kernel engineer trusts (docs/timing.md): the throttling rule, throttled samples left out,
the back-to-back figure beside the interleaved one (the tables quote the slower), no ratio across
timing methods, and --lock-clocks (reset on the way out, refused with one line)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kdtr import bench
from kdtr.bench import TimingOptions
from kdtr.bench.notes import back_to_back_line, method_line, telemetry_line
from kdtr.bench.record import with_figures, with_speedups
from kdtr.bench.schedule import back_to_back
from kdtr.bench.telemetry import (ClockLockRefused, Nvml, Reading, kept_turns, locked_clocks, throttle_reasons,
                                  turn_record, watching)
from tests.bench.fakes import CEILINGS, record, row, timing
from tests.bench.fakes import FakeClock
from tests.helpers import invoke, run_kdtree

OPTS = TimingOptions(budget_s=10, target=0.0, min_samples=10, max_samples=100000, min_rounds=6, max_rounds=6)


def reading(reasons=0, power_ns=0, thermal_ns=0, sm=1980):
    return Reading(0.0, sm, 3201, 500.0, reasons, {"power": power_ns, "thermal": thermal_ns})


@pytest.mark.parametrize("before, after, expected", [
    (reading(), reading(), ()),
    (reading(reasons=0x1), reading(reasons=0x1 | 0x2 | 0x10 | 0x100), ()),        # idle, app clocks, sync boost, display
    (reading(reasons=0x4), reading(), ("sw_power_cap",)),
    (reading(), reading(reasons=0x40 | 0x8), ("hw_slowdown", "hw_thermal")),
    (reading(power_ns=10), reading(power_ns=11), ("power_violation",)),            # came and went between reads
    (reading(thermal_ns=5), reading(thermal_ns=5), ()),
    (reading(thermal_ns=5), reading(thermal_ns=9, reasons=0x80), ("hw_power_brake", "thermal_violation")),
])
def test_the_throttling_rule(before, after, expected):
    assert throttle_reasons(before, after) == expected


def test_kept_turns_leave_out_throttled_ones_or_keep_all_and_say_so():
    turns = [[1.0] * 3, [2.0] * 4, [1.0] * 5]
    flags = [turn_record(3, reading(), reading()), turn_record(4, reading(0x4), reading()),
             turn_record(5, reading(), reading())]
    assert kept_turns(turns, flags) == ([0, 2], 4, "4 sample(s) of 1 throttled turn(s) left out")
    every = [turn_record(n, reading(0x4), reading()) for n in (3, 4, 5)]
    kept, dropped, note = kept_turns(turns, every)
    assert kept == [0, 1, 2] and dropped == 0 and "every turn ran throttled" in note
    assert kept_turns(turns, []) == ([0, 1, 2], 0, "")


class ThrottledGpu:
    """A fake device whose power cap engages in every third turn: telemetry reads say so, and the
    sampler reads 30% slower meanwhile."""

    def __init__(self):
        self.turn = 0
        self.violation = 0
        self.reads = 0

    def read(self):
        self.reads += 1
        if self.reads % 2 == 1:                         # the reading before a turn starts it
            self.turn += 1
        elif self.turn % 3 == 0:                        # the counter advanced during the turn
            self.violation += 1000
        return Reading(float(self.reads), 1755 if self.turn % 3 == 0 else 1980, 3201, 690.0, 0,
                       {"power": self.violation, "thermal": 0})

    def sampler(self, clock, value):
        def take(n):
            clock.now += n * 0.001
            return [value * (1.3 if self.turn % 3 == 0 else 1.0)] * n
        return bench.schedule.Sampler(take, 0.001, "hot", "graph")


def test_throttled_turns_are_flagged_and_left_out_of_the_figure():
    gpu, clock = ThrottledGpu(), FakeClock()
    [a, b] = bench.schedule.interleave([gpu.sampler(clock, 1.0), gpu.sampler(clock, 2.0)], OPTS, clock=clock,
                              telemetry=gpu.read)
    for t, value in ((a, 1.0), (b, 2.0)):
        flagged = [turn for turn in t.telemetry if turn["throttled"]]
        assert len(t.telemetry) == 6 and flagged and all(turn["throttled"] == ["power_violation"] for turn in flagged)
        assert t.throttled_samples == sum(turn["samples"] for turn in flagged)
        assert t.n == sum(turn["samples"] for turn in t.telemetry) - t.throttled_samples
        assert t.median == value and max(t.samples_ms) == value            # no throttled sample in the figure
        assert f"{t.throttled_samples} sample(s)" in t.note
        assert all(turn["sm_mhz"][0] == 1755 for turn in flagged)


def test_without_telemetry_nothing_is_left_out():
    clock = FakeClock()
    [t] = bench.schedule.interleave([bench.schedule.Sampler(lambda n: [1.0] * n, 0.001, "hot", "graph")], OPTS, clock=clock)
    assert t.telemetry == () and t.throttled_samples == 0


class Neighbours:
    """Implementation 0 runs 10% faster right after implementation 1 than after itself (what a
    light neighbour's idle power headroom did to our kernel on the H200)."""

    def __init__(self, clock):
        self.clock, self.last = clock, None

    def sampler(self, i, value):
        def take(n):
            self.clock.now += n * 0.001
            speed = 0.9 if (i == 0 and self.last == 1) else 1.0
            self.last = i
            return [value * speed] * n
        return bench.schedule.Sampler(take, 0.001, "hot", "graph")


def test_back_to_back_shows_what_the_neighbour_hid_and_the_headline_is_the_slower():
    clock = FakeClock()
    world = Neighbours(clock)
    samplers = [world.sampler(0, 1.0), world.sampler(1, 5.0)]
    interleaved = bench.schedule.interleave(samplers, OPTS, clock=clock)
    alone = back_to_back(samplers, OPTS, clock=clock)
    assert interleaved[0].median == pytest.approx(0.9) and alone[0].median == pytest.approx(1.0)
    ours = replace(row("c", "cuda", 1.0, primary=True), timing=interleaved[0], alone=alone[0])
    theirs = replace(row("c", "peer", 5.0, primary=False), timing=interleaved[1], alone=alone[1])
    assert ours.headline is alone[0]
    [ours, theirs] = with_speedups([ours, theirs])
    assert ours.speedups["peer"] == pytest.approx(5.0)                 # 5.0 / 1.0, not 5.0 / 0.9
    assert with_figures(ours, CEILINGS).tflops == pytest.approx(ours.flops / 1e-3 / 1e12)
    assert "+11.1% (c, cuda)" in back_to_back_line([ours, theirs])


def test_a_row_timed_by_another_method_gets_no_ratio():
    ours = row("c", "cuda", 1.0, primary=True)
    eager = replace(row("c", "sglang_triton", 3.0, primary=False),
                    timing=replace(timing(3.0), method="eager"))
    captured = row("c", "torch", 4.0, primary=False)
    fewer = replace(row("c", "flashmla", 2.0, primary=False), timing=replace(timing(2.0), calls_per_sample=10))
    rotated = replace(row("c", "peer", 2.0, primary=False), timing=replace(timing(2.0), mode="cold-rotate"))
    [ours, *others] = with_speedups([ours, eager, captured, fewer, rotated])
    assert set(ours.speedups) == {"torch"}        # another launch, calls a sample or mode: no ratio
    line = method_line([ours, *others])
    assert "sglang_triton in c (cold-flush eager x1)" in line and "flashmla in c (cold-flush graph x10)" in line
    assert "peer in c (cold-rotate graph x1)" in line and "torch" not in line


def test_the_record_keeps_telemetry_and_the_back_to_back_timing(tmp_path):
    rec = record()
    clock = FakeClock()
    gpu = ThrottledGpu()
    [t] = bench.schedule.interleave([gpu.sampler(clock, 2.0)], OPTS, clock=clock, telemetry=gpu.read)
    rows = list(rec.rows)
    rows[0] = replace(rows[0], timing=t, alone=timing(2.1))
    rec = replace(rec, rows=tuple(rows), meta={**rec.meta, "telemetry": {"source": "nvml", "driver": "580"}})
    path = tmp_path / "r.json"
    bench.write_record(path, rec)
    back = bench.load_record(path)
    assert back.rows[0].timing.telemetry == t.telemetry and back.rows[0].timing.throttled_samples == t.throttled_samples
    assert back.rows[0].alone.samples_ms == rows[0].alone.samples_ms
    line = telemetry_line(back)
    assert "SM clock 1755-1980 MHz" in line and f"{t.throttled_samples} sample(s) left out" in line


class FakeNvml:
    NVML_CLOCK_LIMIT_ID_TDP = 0xFFFFFF01

    def __init__(self, refuse=False):
        self.refuse, self.calls = refuse, []

    def nvmlDeviceSetGpuLockedClocks(self, handle, lo, hi):
        if self.refuse:
            raise RuntimeError("Insufficient Permissions")
        self.calls.append(("lock", lo, hi))

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        self.calls.append(("reset",))


def test_locked_clocks_are_reset_also_on_ctrl_c():
    nvml = FakeNvml()
    with pytest.raises(KeyboardInterrupt):
        with locked_clocks(Nvml(nvml, "h")) as locked:
            assert locked == {"sm_mhz": "base (TDP)"}
            raise KeyboardInterrupt
    assert nvml.calls == [("lock", 0xFFFFFF01, 0xFFFFFF01), ("reset",)]
    with locked_clocks(Nvml(nvml, "h"), 1500):
        pass
    assert nvml.calls[-2:] == [("lock", 1500, 1500), ("reset",)]


def test_a_refused_lock_is_one_line_and_resets_nothing():
    nvml = FakeNvml(refuse=True)
    with pytest.raises(ClockLockRefused) as err:
        with locked_clocks(Nvml(nvml, "h")):
            pytest.fail("ran with the clocks unlocked")
    assert "\n" not in str(err.value) and "Insufficient Permissions" in str(err.value) and nvml.calls == []


def test_without_a_gpu_there_is_no_telemetry_and_no_lock():
    with watching(False, False) as watch:
        assert watch.read is None and watch.info == {"source": None, "why": "no telemetry: no GPU"}
    with pytest.raises(ClockLockRefused, match="--lock-clocks needs NVML: no GPU"):
        with watching(False, True):
            pass


def test_cli_lock_clocks_without_a_gpu_exits_2_with_one_line(suites, tmp_path):
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    done = run_kdtree("bench", suites, "--lock-clocks", "-k", "va_fp32", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "lock-clocks" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr




def test_report_shows_clocks_throttling_and_both_figures(tmp_path):
    """`kdtree report -q` names, per row, both figures and the telemetry of the rounds."""
    clock, gpu = FakeClock(), ThrottledGpu()
    [t] = bench.schedule.interleave([gpu.sampler(clock, 2.0)], OPTS, clock=clock, telemetry=gpu.read)
    rec = record()
    rows = list(rec.rows)
    rows[0] = replace(rows[0], timing=t, alone=timing(2.5, noise=0.0))
    rec = replace(rec, rows=tuple(rows), meta={**rec.meta, "telemetry": {"source": "nvml", "driver": "580"}})
    path = tmp_path / "r.json"
    bench.write_record(path, rec)
    result = invoke("report", path, "-q")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("cuda ") and " a " in x)
    assert "median=2.500 ms" in line and "interleaved=2.000 ms alone=2.500 ms" in line
    assert f"sm=1755-1980MHz power=690-690W throttled={t.throttled_samples}" in line
    assert "telemetry (NVML, driver 580)" in result.output
