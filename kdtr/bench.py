"""The timing engine behind `kdtree bench`: honest device timings, ceilings and baselines in one run.

How a figure is made (perf.md, "Measuring"):

- Our kernel (`op.run_cuda` into preallocated, poisoned outputs) is captured into a CUDA graph of k
  calls and timed with CUDA events around each replay; a sample is replay time / k, with k chosen so a
  sample lasts about `TimingOptions.sample_ms` (an eager launch costs ~5.7 us here, more than our small
  kernels; a graph node ~0.6 us). What cannot be captured is timed eagerly, k calls between events.
  A short spin kernel is queued before each sample's start event, so the host's enqueueing of the
  timed work never shows up as device idle time inside the interval.
- Each implementation of a case is checked, warmed, captured and calibrated first (`prepare`);
  then all of them, ours included (twice with --repeat), are timed in interleaved turns
  (`interleave`): a turn is a batch of samples (one round of that implementation), the turns follow
  cycles in which every implementation runs right after every other exactly once
  (`balanced_turns`), so drift of the GPU's clocks, power and temperature over the case, and
  whatever one implementation leaves behind for the next, hit every implementation alike. A figure is the median of its samples; its noise (`rel_ci`) is the larger of that
  median's 95% CI (distribution-free, order statistics) and the 95% CI of its rounds' medians
  (Student t): how much the figure moves between rounds, which one timing's samples cannot show.
- Rounds stop, after `min_rounds`, when every implementation's noise is under `target`, or the
  time budget (`budget_s` per implementation), the sample or round cap, or the run's time limit
  runs out. Each Timing says which (`stop_reason`) and keeps its raw samples and round medians.
- Modes, named in every Timing: `hot` (the same inputs again and again: L2 may hold them);
  `cold-rotate` (k calls over enough copies of the inputs and outputs to cover twice the L2);
  `cold-flush` (a buffer twice the L2 size, allocated once, is written before every sample, one
  call per sample); `host` (perf_counter, for work on the CPU or a run without a GPU).
- Ceilings are measured in the same run (HBM read and copy bandwidth; dense bf16 and fp32 matrix
  products through torch), and every row's achieved TFLOP/s and GB/s (from the op's cost model) is
  given as % of them; a figure over 100% is flagged as a measurement error, not a result.
- Baselines (`op.baselines`) run on the same inputs in the same run; before any implementation is
  timed its outputs on those inputs are checked against the reference (`compare_output`, the op's
  tolerances). Speedup = baseline median / our median, same run, same mode.

The library prints nothing: it returns frozen dataclasses (Timing, BenchRow, Ceilings, BenchRecord)
and reports progress through a callback. Without a GPU, `run_bench` times the torch backend on the
host (mode `host`), a degraded run for smoke tests, labelled as such in its record.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .errors import KdtreeError, UsageError

BENCH_FORMAT = 1
RECORD_KIND = "kdtree.bench"
Z95 = 1.96                        # two-sided 95% normal quantile, for the median's order-statistic CI
DEFAULT_L2_BYTES = 64 << 20       # when torch does not report the L2 size
EVENT_RESOLUTION_MS = 0.0005      # CUDA events resolve about half a microsecond
BLOCK_CYCLES = 50_000             # spin kernel before each sample (~25 us at 2 GHz)
MAX_ROTATE_SETS = 2048            # cold mode: more input sets than this -> flush instead
SLOW_CALL_MS = 10.0               # calls slower than this are calibrated from one run
QUICK_CASES_PER_SUITE = 2         # --quick: the first cases of each suite (suites list small ones first)
FLAG_LIMIT = 1.0                  # a figure above 100% of its ceiling is a measurement error
COMPUTE_UNITS = ("bf16_mma", "fp32_fma")
MODES = ("hot", "cold", "both")


# -- statistics -----------------------------------------------------------------------------------

def median_ci(samples: Sequence[float]) -> tuple[float, float]:
    """A distribution-free ~95% confidence interval of the median: the order statistics
    n/2 - 0.98·sqrt(n) and 1 + n/2 + 0.98·sqrt(n) (1-based), clamped to the sample range."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    half = Z95 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(1 + n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def relative_spread(samples: Sequence[float]) -> float:
    """Half-width of the median's 95% CI over the median: the sampling noise of a median."""
    if len(samples) < 2:
        return math.inf
    lo, hi = median_ci(samples)
    median = float(np.median(samples))
    if median <= 0:
        return 0.0 if hi == lo else math.inf
    return (hi - lo) / 2 / median


# two-sided 95% Student t quantiles for 1..10 degrees of freedom; beyond, the Cornish-Fisher series
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (error < 1e-3)."""
    if df < 1:
        return math.inf
    if df <= len(_T95):
        return _T95[df - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def between_rounds(round_medians: Sequence[float], center: float) -> float | None:
    """The 95% CI half-width of the mean of the rounds' medians (Student t over the rounds), over
    `center`: how far a figure moves from one round to the next (clock, power and thermal drift,
    what ran just before), which no single round's samples can show. None below two rounds."""
    r = len(round_medians)
    if r < 2:
        return None
    if center <= 0:
        return math.inf
    spread = float(np.std(np.asarray(round_medians, dtype=np.float64), ddof=1))
    return t95(r - 1) * spread / math.sqrt(r) / center


@dataclass(frozen=True)
class TimingOptions:
    budget_s: float = 0.5          # wall-clock seconds of samples per implementation (a case: this x its implementations)
    target: float = 0.01           # stop once every implementation's reported noise is below this
    min_samples: int = 10          # per implementation, before "converged" may stop the rounds
    max_samples: int = 400
    warmup_s: float = 0.1          # the GPU's clocks drop while the host works between timings
    sample_ms: float = 0.5         # aim for samples at least this long (k calls per sample)
    max_calls: int = 1000          # k at most
    rounds: int = 8                # a turn lasts budget_s / rounds (at least one sample)
    min_rounds: int = 5            # every implementation takes part in at least this many rounds
    max_rounds: int = 64
    # The least noise a median reports; 0: the measured noise alone. (Before the rounds, a floor of
    # 0.5% stood in for the drift between two timings that one timing's samples cannot see; the
    # spread between interleaved rounds now measures that drift.)
    noise_floor: float = 0.0

    def check(self) -> None:
        if not (self.budget_s > 0 and self.target > 0 and self.warmup_s >= 0 and self.sample_ms > 0
                and 0 <= self.noise_floor < 1):
            raise UsageError("timing budget, target and sample length must be > 0, the noise floor in [0, 1)")
        if not 1 <= self.min_samples <= self.max_samples or self.max_calls < 1:
            raise UsageError("need 1 <= min_samples <= max_samples and max_calls >= 1")
        if not 2 <= self.min_rounds <= self.max_rounds or self.rounds < 1:
            raise UsageError("need 2 <= min_rounds <= max_rounds and rounds >= 1 (the noise comes from "
                             "the spread between rounds)")


QUICK_TIMING = TimingOptions(budget_s=0.1, target=0.05, min_samples=5, max_samples=100, warmup_s=0.01,
                             sample_ms=0.2, max_calls=200, rounds=4, min_rounds=3)
STOP_REASONS = ("converged", "budget", "max_samples", "max_rounds", "time_limit")


@dataclass(frozen=True)
class Timing:
    """One implementation's samples and their summary; times in milliseconds per call."""

    samples_ms: tuple[float, ...]
    median: float
    p10: float
    p90: float
    rel_std: float                 # standard deviation / mean
    rel_ci: float                  # the reported noise: the larger of rel_ci_samples and rel_ci_rounds
    n: int
    stop_reason: str               # converged | budget | max_samples | max_rounds | time_limit
    mode: str                      # hot | cold-rotate | cold-flush | host
    method: str                    # graph | eager | host
    calls_per_sample: int = 1
    note: str = ""
    rounds: int = 0                # interleaved rounds the samples came from (0: a record from before rounds)
    round_medians: tuple[float, ...] = ()
    rel_ci_samples: float | None = None   # the median's order-statistic CI over all samples / median
    rel_ci_rounds: float | None = None    # Student-t CI of the rounds' medians / median (None: < 2 rounds)

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "Timing":
        values = _fields(Timing, d)
        values["samples_ms"] = tuple(_num(x) for x in d.get("samples_ms", ()))
        values["round_medians"] = tuple(_num(x) for x in d.get("round_medians", ()))
        for k in ("median", "p10", "p90", "rel_std", "rel_ci", "rel_ci_samples", "rel_ci_rounds"):
            if values.get(k) is not None:
                values[k] = _num(values[k])
        return Timing(**values)


def summarize(samples: Sequence[float], *, stop_reason: str, mode: str, method: str,
              calls_per_sample: int = 1, note: str = "", resolution_ms: float = 0.0,
              noise_floor: float = 0.0, round_medians: Sequence[float] = ()) -> Timing:
    """The summary of per-call samples (all rounds pooled). The reported noise is the larger of the
    pooled median's order-statistic CI and the between-rounds CI (`between_rounds`), never below the
    timer's resolution (`resolution_ms` per sample of `calls_per_sample` calls) nor `noise_floor`."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    mean = float(values.mean())
    median = float(np.median(values))
    rel_std = float(values.std(ddof=1) / mean) if values.size > 1 and mean > 0 else 0.0
    p10, p90 = (float(v) for v in np.percentile(values, [10, 90]))
    within = relative_spread(values.tolist())
    rounds = between_rounds(round_medians, median)
    noise = max(within, rounds or 0.0, noise_floor)
    if resolution_ms > 0 and median > 0:
        noise = max(noise, resolution_ms / (calls_per_sample * median))
    return Timing(tuple(float(v) for v in values), median, p10, p90, rel_std, noise, int(values.size),
                  stop_reason, mode, method, calls_per_sample, note, len(round_medians),
                  tuple(float(v) for v in round_medians), within, rounds)


def agree(a: Timing, b: Timing) -> bool:
    """Two medians agree within their reported noise: their confidence intervals overlap."""
    return abs(a.median - b.median) <= a.median * a.rel_ci + b.median * b.rel_ci


@dataclass(frozen=True)
class Sampler:
    """One implementation made ready to time (warmed, captured, calibrated): `take(n)` runs n samples
    and returns each one's milliseconds per call. What the rounds of `interleave` hold per slot."""

    take: Callable[[int], list[float]]
    per_sample_s: float                # wall seconds of one sample, to size turns
    mode: str                          # hot | cold-rotate | cold-flush | host
    method: str                        # graph | eager | host
    calls_per_sample: int = 1
    note: str = ""
    resolution_ms: float = 0.0
    # What the timed calls read and write (the calls, holding their input and output tensors). A
    # captured graph holds raw addresses: were these freed while the sampler lives, the allocator
    # would hand their memory to the next implementation and the replays would read its data.
    keepalive: tuple = ()


def balanced_turns(m: int) -> list[int]:
    """One cycle of turns in which every implementation runs right after every other exactly once,
    also across the cycle's end (an Eulerian circuit of the complete directed graph on m vertices):
    m(m - 1) turns, m - 1 per implementation ([0] for m = 1). A rotated order would keep each one's
    predecessor fixed, so whatever a heavy baseline leaves behind (clocks, power, caches) would always
    land on the same neighbour: on the H200 the repeat of our kernel, which always ran right after
    the same baseline, came out 4-6% off its first timing in the two heaviest cases."""
    if m == 1:
        return [0]
    unused = {v: [u for u in range(m) if u != v] for v in range(m)}
    stack, circuit = [0], []
    while stack:                                   # Hierholzer
        if unused[stack[-1]]:
            stack.append(unused[stack[-1]].pop())
        else:
            circuit.append(stack.pop())
    return circuit[::-1][:-1]                      # it ends where it began: drop the repeat


def interleave(samplers: Sequence[Sampler], options: TimingOptions, *,
               clock: Callable[[], float] = time.perf_counter, deadline: float | None = None,
               progress: Callable[[int], None] | None = None) -> list[Timing | Exception]:
    """Time several implementations in interleaved turns: the turns follow cycles of
    `balanced_turns`, so clock, power and thermal drift hits all of them alike and every one runs
    right after every other equally often; a turn is a batch of samples (about budget_s / rounds, at
    least one sample) and one round of its implementation. Each figure's noise is the larger of its
    pooled median's CI and the spread between its rounds' medians (`summarize`).

    After each cycle, once every implementation has min_rounds rounds, they stop when: every
    implementation has min_samples and a noise under `target` ("converged"); or the budget (budget_s
    x implementations, wall time of the turns) is spent ("budget"); or one has max_samples
    ("max_samples"); or max_rounds ("max_rounds"); or `deadline` (on `clock`) has passed
    ("time_limit"). The stop reason is every timing's.

    A sampler that raises drops out of the rounds; its slot returns the exception."""
    m = len(samplers)
    results: list[Timing | Exception | None] = [None] * m
    if m == 0:
        return []
    turn_s = options.budget_s / options.rounds
    cap = max(1, options.max_samples // options.rounds)
    batch = [max(1, min(cap, int(turn_s / s.per_sample_s + 1e-9) if s.per_sample_s > 0 else cap)) for s in samplers]
    rounds: list[list[list[float]]] = [[] for _ in samplers]
    live = list(range(m))
    cycle = balanced_turns(m)

    def take(i: int, n: int) -> list[float] | None:
        try:
            return samplers[i].take(n)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 - this implementation drops out, the others go on
            results[i] = err
            live.remove(i)
            return None

    def timing(i: int, reason: str) -> Timing:
        s = samplers[i]
        pooled = [v for turn in rounds[i] for v in turn]
        return summarize(pooled, stop_reason=reason, mode=s.mode, method=s.method,
                         calls_per_sample=s.calls_per_sample, note=s.note, resolution_ms=s.resolution_ms,
                         noise_floor=options.noise_floor, round_medians=[float(np.median(t)) for t in rounds[i]])

    start = clock()
    r = 0
    collecting = gc.isenabled()
    gc.disable()                    # as timeit does: no collector pause inside a sample
    try:
        while live:
            for i in cycle:
                if i not in live:
                    continue
                got = take(i, batch[i])
                if got is not None:
                    rounds[i].append(got)
            r += 1
            if progress is not None:
                progress(r)
            if not live or min(len(rounds[i]) for i in live) < options.min_rounds:
                continue
            reason = None
            if all(sum(map(len, rounds[i])) >= options.min_samples and timing(i, "").rel_ci <= options.target
                   for i in live):
                reason = "converged"
            elif any(sum(map(len, rounds[i])) >= options.max_samples for i in live):
                reason = "max_samples"
            elif max(len(rounds[i]) for i in live) >= options.max_rounds:
                reason = "max_rounds"
            elif clock() - start >= options.budget_s * m:
                reason = "budget"
            elif deadline is not None and clock() > deadline:
                reason = "time_limit"
            if reason is not None:
                for i in live:
                    results[i] = timing(i, reason)
                break
    finally:
        if collecting:
            gc.enable()
    return [res if res is not None else RuntimeError("no samples") for res in results]


def _one(samplers: Sequence[Sampler], options: TimingOptions, **kw: Any) -> Timing:
    [result] = interleave(samplers, options, **kw)
    if isinstance(result, Exception):
        raise result
    return result


# -- timers ---------------------------------------------------------------------------------------

def _warm(calls: Sequence[Callable[[], Any]], seconds: float, sync: Callable[[], None]) -> None:
    """Every call at least once, then again until `seconds` have passed (module loads, compiles,
    allocator growth and clock ramp-up stay out of the samples)."""
    start = time.perf_counter()
    rounds = 0
    while rounds < 1 or time.perf_counter() - start < seconds:
        for call in calls:
            call()
        sync()
        rounds += 1


class HostTimer:
    """perf_counter around each call, then a device synchronise where a GPU is in use."""

    def __init__(self, sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter):
        self.sync = sync
        self.clock = clock

    def prepare(self, calls: Sequence[Callable[[], Any]], *, options: TimingOptions, **_: Any) -> Sampler:
        call = calls[0]
        _warm([call], options.warmup_s, self.sync)

        def once() -> float:
            t0 = self.clock()
            call()
            self.sync()
            return (self.clock() - t0) * 1e3

        estimate_ms = once()
        if estimate_ms < SLOW_CALL_MS * 10:         # one slow first call (a hiccup) must not size the turns
            estimate_ms = float(np.median([estimate_ms, once(), once()]))
        return Sampler(lambda n: [once() for _ in range(n)], estimate_ms / 1e3, "host", "host")

    def measure(self, calls: Sequence[Callable[[], Any]], *, options: TimingOptions, **kw: Any) -> Timing:
        """One implementation alone, in rounds of its own (`interleave` with one slot)."""
        return _one([self.prepare(calls, options=options, **kw)], options, clock=self.clock)


class DeviceTimer:
    """CUDA events on torch's current stream; owns the L2 flush buffer (twice the L2, allocated once)."""

    def __init__(self, l2_bytes: int):
        self.l2_bytes = int(l2_bytes)
        self._flush = None

    @property
    def flush_bytes(self) -> int:
        return 2 * self.l2_bytes

    def flush(self) -> None:
        import torch

        if self._flush is None:
            self._flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device="cuda")
        self._flush.zero_()

    def release(self) -> None:
        self._flush = None

    @staticmethod
    def sync() -> None:
        import torch

        torch.cuda.synchronize()

    @staticmethod
    def _block() -> None:
        import torch

        torch.cuda._sleep(BLOCK_CYCLES)

    def _time_once(self, run: Callable[[], Any], flush: bool) -> float:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush() if flush else self._block()
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def _capture(self, calls: Sequence[Callable[[], Any]], k: int):
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                   # warm-up off the capture, as torch advises
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(k):
                calls[i % len(calls)]()
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        return graph

    def prepare(self, calls: Sequence[Callable[[], Any]], *, options: TimingOptions, mode: str = "hot",
                graph: bool = True) -> Sampler:
        """Make `calls` ready to time (one callable, or several over distinct input sets to rotate
        through in cold mode): warm-up, capture, k calls per sample. `mode` is "hot" or "cold";
        `graph` tries CUDA-graph capture, else eager."""
        import torch

        rotate = len(calls) > 1
        flush = mode == "cold" and not rotate
        label = "hot" if mode == "hot" else ("cold-rotate" if rotate else "cold-flush")
        _warm(calls, options.warmup_s, self.sync)
        notes = [f"{len(calls)} input sets rotated"] if rotate else []

        def eager(k: int) -> Callable[[], None]:
            def run() -> None:
                for i in range(k):
                    calls[i % len(calls)]()
            return run

        one, method = eager(1), "eager"
        single = None
        if graph:
            try:
                single = self._capture(calls[:1], 1)
                one, method = single.replay, "graph"
            except Exception as err:  # noqa: BLE001 - not capturable: time it eagerly, say so
                notes.append(f"graph capture failed ({type(err).__name__}: {_first_line(err)}); timed eagerly")
                torch.cuda.synchronize()
        per_call = self._time_once(one, False)
        if per_call < SLOW_CALL_MS:
            per_call = float(np.median([per_call] + [self._time_once(one, False) for _ in range(2)]))
        if flush:
            k, run = 1, one
        else:
            k = max(1, min(options.max_calls, math.ceil(options.sample_ms / max(per_call, 1e-4))))
            if rotate:
                k = len(calls) * max(1, math.ceil(k / len(calls)))
            run = one
            if k > 1 or rotate:
                run = eager(k)
                if method == "graph":
                    try:
                        run = self._capture(calls, k).replay
                    except Exception as err:  # noqa: BLE001
                        notes.append(f"capture of {k} calls failed ({type(err).__name__}); timed eagerly")
                        method = "eager"
                        torch.cuda.synchronize()

        def sampler(n: int) -> list[float]:
            pairs = []
            for _ in range(n):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.flush() if flush else self._block()
                start.record()
                run()
                end.record()
                pairs.append((start, end))
            pairs[-1][1].synchronize()
            return [s.elapsed_time(e) / k for s, e in pairs]
        return Sampler(sampler, (per_call * k + 0.03) / 1e3, label, method, k, "; ".join(notes),
                       EVENT_RESOLUTION_MS, keepalive=tuple(calls))

    def measure(self, calls: Sequence[Callable[[], Any]], *, options: TimingOptions, mode: str = "hot",
                graph: bool = True, clock: Callable[[], float] = time.perf_counter) -> Timing:
        """One implementation alone, in rounds of its own (`interleave` with one slot)."""
        return _one([self.prepare(calls, options=options, mode=mode, graph=graph)], options, clock=clock)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else ""


# -- ceilings -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ceilings:
    """The 100% lines, measured in this run (throughput at each timing's p10, the best decile)."""

    hbm_read_gbps: float
    hbm_copy_gbps: float           # read + write bytes counted
    bf16_mma_tflops: float
    fp32_fma_tflops: float
    l2_bytes: int
    timings: dict[str, Timing] = field(default_factory=dict)

    @property
    def bandwidth_gbps(self) -> float:
        return max(self.hbm_read_gbps, self.hbm_copy_gbps)

    def compute_tflops(self, unit: str) -> float:
        if unit not in COMPUTE_UNITS:
            raise KdtreeError(f"unknown compute unit {unit!r}; expected one of {', '.join(COMPUTE_UNITS)}")
        return self.bf16_mma_tflops if unit == "bf16_mma" else self.fp32_fma_tflops

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "Ceilings":
        return Ceilings(**{**_fields(Ceilings, d),
                           "timings": {k: Timing.from_plain(v) for k, v in d.get("timings", {}).items()}})


CEILING_OPTIONS = TimingOptions(budget_s=0.5, target=0.005, min_samples=10, max_samples=200, warmup_s=0.2)


def measure_ceilings(timer: DeviceTimer, options: TimingOptions = CEILING_OPTIONS) -> Ceilings:
    """HBM read (a sum over 2 GiB) and copy (2 GiB -> 2 GiB) bandwidth, dense bf16 (8192^3) and
    fp32 without TF32 (4096^3) matrix products, all on random data, CUDA graphs, hot mode (the
    footprints dwarf the L2)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1)
    timings: dict[str, Timing] = {}
    n = 8192
    a = torch.randn((n, n), device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn((n, n), device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    timings["bf16_mma"] = timer.measure([lambda: torch.mm(a, b, out=c)], options=options)
    bf16 = 2 * n ** 3 / (timings["bf16_mma"].p10 * 1e-3) / 1e12
    del a, b, c
    n = 4096
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn((n, n), device="cuda", generator=gen)
        b = torch.randn((n, n), device="cuda", generator=gen)
        c = torch.empty((n, n), device="cuda")
        timings["fp32_fma"] = timer.measure([lambda: torch.mm(a, b, out=c)], options=options)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    fp32 = 2 * n ** 3 / (timings["fp32_fma"].p10 * 1e-3) / 1e12
    del a, b, c
    count = 512 << 20                                    # 2 GiB of fp32
    src = torch.randn(count, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    total = torch.empty((), device="cuda")
    timings["hbm_read"] = timer.measure([lambda: torch.sum(src, dim=0, out=total)], options=options)
    # a copy captured in a graph is a memcpy node (on the H200: 2.8 TB/s, the copy engines?); an
    # eager copy_ went 4.3 TB/s on such machines (KINDS.md): time both, the faster is the ceiling
    timings["hbm_copy"] = timer.measure([lambda: dst.copy_(src)], options=options)
    timings["hbm_copy_eager"] = timer.measure([lambda: dst.copy_(src)], options=options, graph=False)
    read = src.nbytes / (timings["hbm_read"].p10 * 1e-3) / 1e9
    copy = 2 * src.nbytes / (min(timings["hbm_copy"].p10, timings["hbm_copy_eager"].p10) * 1e-3) / 1e9
    del src, dst, total
    torch.cuda.empty_cache()
    return Ceilings(read, copy, bf16, fp32, timer.l2_bytes, timings)


# -- records --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchRow:
    """One implementation of one case in one mode."""

    case: str
    op: str
    variant: str
    config: dict[str, Any]
    impl: str                      # "cuda" (our kernel), "torch" (the torch backend) or a baseline name
    mode: str                      # requested: hot | cold | host
    primary: bool                  # the implementation under test; speedups are quoted for it
    timing: Timing | None          # None: not timed (skipped, failed or its check failed)
    flops: float
    bytes: float
    tflops: float | None = None
    gbps: float | None = None
    pct_compute: float | None = None     # of the measured ceiling of `compute_unit`
    pct_bandwidth: float | None = None   # of the measured HBM bandwidth
    flagged: bool = False                # a figure above 100% of its ceiling: a measurement error
    check_passed: bool | None = None     # outputs on the timed inputs vs the reference
    check: str | None = None             # what was compared, or why it failed
    skip: str | None = None              # why it was not timed
    speedups: dict[str, float] = field(default_factory=dict)    # baseline -> its median / ours
    compute_unit: str = "bf16_mma"
    repeat: Timing | None = None         # a second timing of the same calls, interleaved with the first
    repeat_agrees: bool | None = None
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    setup_s: float | None = None         # wall seconds of its check, compile, capture and calibration

    @property
    def key(self) -> tuple:
        """What matches a row between two records: case, op, variant, impl, mode and every parameter."""
        return (self.op, self.variant, self.case, self.impl, self.mode,
                json.dumps(self.config, sort_keys=True, default=str), json.dumps(self.params, sort_keys=True, default=str))

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "BenchRow":
        values = _fields(BenchRow, d)
        for name in ("timing", "repeat"):
            values[name] = Timing.from_plain(d[name]) if d.get(name) else None
        for name in ("flops", "bytes", "tflops", "gbps", "pct_compute", "pct_bandwidth", "setup_s"):
            if values.get(name) is not None:
                values[name] = _num(values[name])
        values["speedups"] = {k: _num(v) for k, v in (d.get("speedups") or {}).items()}
        return BenchRow(**values)


@dataclass(frozen=True)
class BenchRecord:
    meta: dict[str, Any]
    settings: dict[str, Any]
    ceilings: Ceilings | None
    sanity: tuple[BenchRow, ...]
    rows: tuple[BenchRow, ...]
    errors: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()        # cases left out by the run's time limit
    complete: bool = True
    case_seconds: dict[str, float] = field(default_factory=dict)   # "op/variant case" -> wall seconds
    kind: str = RECORD_KIND
    bench_format: int = BENCH_FORMAT

    @property
    def primary(self) -> str:
        return str(self.settings.get("primary", "cuda"))

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "BenchRecord":
        if not isinstance(d, Mapping) or d.get("kind") != RECORD_KIND:
            raise UsageError(f"not a kdtree bench record (kind {d.get('kind') if isinstance(d, Mapping) else None!r})")
        if d.get("bench_format") != BENCH_FORMAT:
            raise UsageError(f"bench record format {d.get('bench_format')!r}; this kdtree reads {BENCH_FORMAT}")
        return BenchRecord(
            meta=dict(d.get("meta") or {}), settings=dict(d.get("settings") or {}),
            ceilings=Ceilings.from_plain(d["ceilings"]) if d.get("ceilings") else None,
            sanity=tuple(BenchRow.from_plain(r) for r in d.get("sanity") or ()),
            rows=tuple(BenchRow.from_plain(r) for r in d.get("rows") or ()),
            errors=tuple(d.get("errors") or ()), not_run=tuple(d.get("not_run") or ()),
            complete=bool(d.get("complete", True)),
            case_seconds={str(k): _num(v) for k, v in (d.get("case_seconds") or {}).items()})


def _num(value: Any) -> Any:
    """A float from a record value ("nan"/"inf" strings are how JSON holds non-finite floats)."""
    if isinstance(value, str):
        return float(value)
    return value


def _fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return {k: v for k, v in d.items() if k in names}
    except AttributeError:
        raise UsageError(f"malformed bench record: expected an object for {cls.__name__}") from None


def load_record(path: str | Path) -> BenchRecord:
    """A bench record from JSON; UsageError (exit 2) naming the file when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise UsageError(f"cannot read bench record: {err.strerror or err}", file=path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"not JSON: {err}", file=path) from None
    try:
        return BenchRecord.from_plain(data)
    except UsageError as err:
        raise UsageError(err.message, file=path) from None
    except (TypeError, ValueError, KeyError) as err:
        raise UsageError(f"malformed bench record: {type(err).__name__}: {err}", file=path) from None


def with_figures(row: BenchRow, ceilings: Ceilings | None) -> BenchRow:
    """Achieved TFLOP/s and GB/s from the cost model, as fractions of the ceilings; flagged > 100%."""
    if row.timing is None or row.timing.median <= 0:
        return row
    seconds = row.timing.median * 1e-3
    tflops = row.flops / seconds / 1e12 if row.flops > 0 else None
    gbps = row.bytes / seconds / 1e9 if row.bytes > 0 else None
    pct_compute = pct_bandwidth = None
    if ceilings is not None:
        if tflops is not None:
            pct_compute = tflops / ceilings.compute_tflops(row.compute_unit)
        if gbps is not None:
            pct_bandwidth = gbps / ceilings.bandwidth_gbps
    flagged = any(p is not None and p > FLAG_LIMIT for p in (pct_compute, pct_bandwidth))
    return replace(row, tflops=tflops, gbps=gbps, pct_compute=pct_compute, pct_bandwidth=pct_bandwidth,
                   flagged=flagged)


def with_speedups(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """Speedups of each primary row over the baselines of the same case and mode (both timed, both
    checked): baseline median / primary median."""
    out = []
    for row in rows:
        if row.primary and row.timing is not None and row.check_passed:
            speedups = {other.impl: other.timing.median / row.timing.median for other in rows
                        if not other.primary and other.timing is not None and other.check_passed
                        and other.case == row.case and other.mode == row.mode and row.timing.median > 0}
            row = replace(row, speedups=speedups)
        out.append(row)
    return out


# -- cases ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchItem:
    """One case to bench: where its inputs come from (a suite's generator or a bundle)."""

    name: str
    op: str
    variant: str
    params: dict[str, Any]
    source: str
    load: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]] = field(compare=False, repr=False)


def collect_items(paths: Sequence[str | Path], pattern: str | None = None, quick: bool = False) -> list[BenchItem]:
    """Bench cases from .kdtr bundles and YAML suites (or folders of them), matching -k."""
    from .spec import load_suites

    paths = [Path(p) for p in paths]
    bundles = [p for p in paths if p.suffix == ".kdtr"]
    suites = [p for p in paths if p.suffix != ".kdtr"]
    items = items_from_bundles(bundles, pattern) if bundles else []
    if suites:
        items += items_from_suites(load_suites(suites), pattern, quick)
    return items


def estimated_cost(item: BenchItem) -> float:
    """A size proxy for spreading cases over workers: the product of the case's integer parameters."""
    return float(math.prod(v for v in item.params.values()
                           if isinstance(v, int) and not isinstance(v, bool) and v > 0))


@dataclass(frozen=True)
class WorkerJob:
    """What a bench worker process needs to rebuild its share of the cases (closures don't pickle)."""

    paths: tuple[str, ...]
    pattern: str | None
    quick: bool
    names: tuple[str, ...]            # "op/case" keys of this worker's share
    settings: "BenchSettings"


def run_worker(job: WorkerJob) -> BenchRecord:
    """One worker: its share of the cases on the GPU it was pinned to, with its own ceilings."""
    wanted = set(job.names)
    items = [i for i in collect_items(job.paths, job.pattern, job.quick) if f"{i.op}/{i.name}" in wanted]
    return run_bench(items, job.settings)


def items_from_suites(suites, pattern: str | None = None, quick: bool = False) -> list[BenchItem]:
    """Cases of the suites matching -k; with `quick`, the first QUICK_CASES_PER_SUITE of each suite."""
    from .ops import get_op
    from .spec import select

    items = []
    for suite in suites:
        cases = select(suite.cases, pattern)
        if quick:
            cases = cases[:QUICK_CASES_PER_SUITE]
        for case in cases:
            op = get_op(case.op)

            def load(op=op, case=case):
                generated = op.generate(case)
                return generated.inputs, generated.params
            items.append(BenchItem(case.name, case.op, case.variant, dict(case.params),
                                   case.source or str(suite.path), load))
    return items


def items_from_bundles(paths: Iterable[str | Path], pattern: str | None = None) -> list[BenchItem]:
    """Cases from golden bundles (their stored inputs), checked as `kdtree verify` checks them."""
    from .spec import name_matches
    from .verify import load_case

    items = []
    for path in map(Path, paths):
        loaded = load_case(path)
        bundle, op, variant, params, case, inputs = (loaded.bundle, loaded.op, loaded.variant, loaded.params,
                                                     loaded.case, loaded.inputs)
        if not name_matches(case, pattern):
            continue
        case_params = bundle.meta.get("case_params") if isinstance(bundle.meta.get("case_params"), dict) else params
        items.append(BenchItem(case, op.name, variant, dict(case_params), str(path),
                               lambda inputs=inputs, params=params: (dict(inputs), dict(params))))
    return items


# -- the run --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchSettings:
    backend: str = "auto"                 # auto | cuda | torch
    mode: str = "cold"                    # hot | cold | both (a run without GPU is always host)
    timing: TimingOptions = TimingOptions()
    baselines: tuple[str, ...] | None = None    # None: the op's default baselines (Baseline.default)
    quick: bool = False
    repeat: bool = False                  # time our kernel a second time, interleaved with the first
    sanity: bool = True                   # empty-kernel and copy sanity cases
    # For the whole run, checked before each case and each baseline's setup: cases past it are
    # listed as not run, baselines as skipped; a case already in its rounds stops once it has
    # min_rounds (so one case may run over by its minimum rounds).
    time_limit_s: float | None = None


Progress = Callable[[str, int, int], None]        # (what is running, cases done, cases in all)


class _Env:
    """What one run holds: the device, the timers, the ceilings."""

    def __init__(self, settings: BenchSettings):
        from .backends import resolve_backend
        from .device import gpu_available

        backend = resolve_backend(settings.backend)
        if backend not in ("cuda", "torch"):
            raise UsageError(f"bench runs the cuda or torch backend, not {backend!r}")
        self.gpu = gpu_available()
        if backend == "cuda" and not self.gpu:
            from .device import require_gpu

            require_gpu()
        self.primary = backend
        self.device = "cuda" if self.gpu else "cpu"
        self.ceilings: Ceilings | None = None
        if self.gpu:
            import torch

            props = torch.cuda.get_device_properties(0)
            self.timer: Any = DeviceTimer(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
            self.host_timer = HostTimer(DeviceTimer.sync)
            self.modes = ("hot", "cold") if settings.mode == "both" else (settings.mode,)
        else:
            self.timer = self.host_timer = HostTimer()
            self.modes = ("host",)

    def sync(self) -> None:
        if self.gpu:
            DeviceTimer.sync()

    def cleanup(self) -> None:
        gc.collect()
        if self.gpu:
            import torch

            torch.cuda.empty_cache()


def _is_oom(err: BaseException) -> bool:
    try:
        import torch

        if isinstance(err, getattr(torch, "OutOfMemoryError", ())):
            return True
    except ImportError:
        pass
    return "out of memory" in str(err).lower()


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    from .dtypes import to_numpy

    return to_numpy(value)


def check_outputs(op, got: Mapping[str, Any], expected: Mapping[str, np.ndarray], tolerances, *,
                  require_all: bool) -> tuple[bool, str]:
    """Compare an implementation's outputs with the reference; (passed, what was compared or why not).
    Baselines may produce a subset of the outputs (`require_all=False`); our kernel produces all."""
    from .compare import compare_output

    names = [n for n in op.outputs if n in got]
    missing = [n for n in op.outputs if n not in got]
    if require_all and missing:
        return False, f"produced no {', '.join(missing)}"
    if not names:
        return False, "produced none of the op's outputs"
    failures, checked = [], []
    for name in names:
        result = compare_output(name, _to_numpy(got[name]), expected[name], tolerances[name])
        if not result.passed:
            failures.append(f"{name}: {result.reason}")
        checked.append(name if tolerances[name].exact else f"{name} (rel. L2 {result.rel_l2:.2g})")
    if failures:
        return False, "; ".join(failures)
    return True, f"checked {', '.join(checked)}" + (f"; it gives no {', '.join(missing)}" if missing else "")


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


class _CaseRunner:
    """Runs every implementation of one case, in each mode, and builds its rows."""

    def __init__(self, env: _Env, settings: BenchSettings, item: BenchItem, progress: Callable[[str], None],
                 deadline: float | None):
        from .ops import get_op

        self.env, self.settings, self.item, self.deadline = env, settings, item, deadline
        self.progress = lambda what: progress(f"{item.op} {what}")
        self.op = get_op(item.op)

    def late(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def run(self) -> list[BenchRow]:
        from . import backends

        op, item, env = self.op, self.item, self.env
        self.progress(f"{item.name}: inputs")
        inputs, params = item.load()
        self.inputs, self.params = inputs, params
        cost = op.cost(item.variant, inputs, params)
        extra = dict(op.bench_extra(item.variant, inputs, params))
        # which of our kernels the launch picks for this shape (a GPU run only: without one nothing
        # of ours runs, and the choice would name a kernel by this host's defaults)
        kernel = op.kernel_choice(item.variant, inputs, params) if env.gpu else None
        if kernel is not None:
            extra["kernel"] = kernel
        self.base = dict(case=item.name, op=op.name, variant=item.variant,
                         config=op.describe(item.variant, inputs, params), flops=float(cost.flops),
                         bytes=float(cost.bytes), compute_unit=op.compute_unit(item.variant),
                         params=_jsonable(item.params), extra=_jsonable(extra))
        self.device_inputs = backends.upload(inputs, env.device)
        self.progress(f"{item.name}: reference")
        expected = op.bench_reference(item.variant, self.device_inputs, params) if env.gpu else None
        self.expected = ({n: _to_numpy(t) for n, t in expected.items()} if expected is not None
                         else op.reference(item.variant, inputs, params))
        del expected
        self.tolerances = op.tolerances(item.variant)
        self.baseline_tolerances = op.baseline_tolerances(item.variant)
        self.baselines = op.baselines(item.variant, inputs, params)
        rows: list[BenchRow] = []
        for mode in env.modes:
            rows.extend(with_speedups(self._mode(mode)))
        return [with_figures(r, env.ceilings) for r in rows]

    def _row(self, impl: str, mode: str, primary: bool, **kw: Any) -> BenchRow:
        return BenchRow(impl=impl, mode=mode, primary=primary, **self.base, **kw)

    def _wanted(self, name: str, baseline) -> bool:
        if name == self.env.primary or (baseline.backend is not None and baseline.backend == self.env.primary):
            return False                # the implementation under test is not its own baseline
        if self.settings.baselines is None:
            return baseline.default
        return name in self.settings.baselines

    def _mode(self, mode: str) -> list[BenchRow]:
        """Check and prepare every implementation, then time them all in interleaved rounds (ours a
        second time among them with --repeat) and build the rows."""
        ours, ours_sampler, after = self._primary(mode)
        entries: list[tuple[BenchRow, Sampler | None]] = [(ours, ours_sampler)]
        for name, baseline in self.baselines.items():
            if self._wanted(name, baseline):
                entries.append(self._baseline(name, baseline, mode))
        slots = [i for i, (_, sampler) in enumerate(entries) if sampler is not None]
        samplers = [entries[i][1] for i in slots]
        repeat = ours_sampler is not None and self.settings.repeat
        if repeat:
            samplers.append(ours_sampler)
        names = ", ".join([entries[i][0].impl for i in slots] + ([f"{ours.impl} again"] if repeat else []))
        self.progress(f"{self.item.name}: rounds ({mode}): {names}")
        results = interleave(samplers, self.settings.timing, deadline=self.deadline,
                             progress=lambda r: self.progress(f"{self.item.name}: round {r} ({mode})"))
        rows = [row for row, _ in entries]
        for slot, result in zip(slots, results):
            rows[slot] = self._timed(rows[slot], result)
        if ours_sampler is not None and rows[0].timing is not None:
            rows[0] = after(rows[0])
            if repeat and rows[0].timing is not None:      # None: the timed calls' outputs failed
                second = results[-1]
                if isinstance(second, Exception):
                    rows[0] = replace(rows[0], check=f"{rows[0].check}; repeat failed: {type(second).__name__}: "
                                                     f"{_first_line(second)}")
                else:
                    rows[0] = replace(rows[0], repeat=second, repeat_agrees=agree(rows[0].timing, second))
        del entries, samplers, ours_sampler, after
        self.env.cleanup()
        return rows

    def _timed(self, row: BenchRow, result: Timing | Exception) -> BenchRow:
        if not isinstance(result, Exception):
            return replace(row, timing=result)
        why = f"{type(result).__name__}: {_first_line(result)}"
        if _is_oom(result):
            return replace(row, skip=f"out of memory while timing: {_first_line(result)}")
        return replace(row, check=f"{row.check}; timing failed: {why}")

    def _prepare(self, calls, mode: str, graph: bool, timer=None) -> Sampler:
        timer = timer or self.env.timer
        return timer.prepare(calls, options=self.settings.timing, mode="cold" if mode == "cold" else "hot",
                             graph=graph)

    def _primary(self, mode: str) -> tuple[BenchRow, Sampler | None, Callable[[BenchRow], BenchRow]]:
        """Our implementation (run_cuda, or run_torch for the torch backend): check, then prepare its
        timing. Returns its row (not yet timed), its sampler (None: it is not timed) and what checks
        the timed calls' outputs once the rounds are done."""
        op, item, env = self.op, self.item, self.env
        impl = env.primary
        self.progress(f"{item.name}: {impl} ({mode})")
        started = time.perf_counter()
        unchanged = lambda row: row  # noqa: E731

        def make_call(inputs):
            from . import backends

            return backends.prepare(impl, op, item.variant, self.inputs, inputs, self.params, env.device)

        call, outputs = make_call(self.device_inputs)
        try:
            result = call()
            env.sync()
        except NotImplementedError:
            method = "run_cuda" if impl == "cuda" else "run_torch"
            return (self._row(impl, mode, True, timing=None, skip=f"{op.name}/{item.variant} has no {method} yet"),
                    None, unchanged)
        except Exception as err:  # noqa: BLE001 - the case fails with the reason; others go on
            env.cleanup()
            return (self._row(impl, mode, True, timing=None, check_passed=False,
                              check=f"failed: {type(err).__name__}: {_first_line(err)}"), None, unchanged)
        got = {n: _to_numpy(t) for n, t in (outputs if outputs is not None else result).items()}
        del result
        passed, note = check_outputs(op, got, self.expected, self.tolerances, require_all=True)
        if not passed:
            return self._row(impl, mode, True, timing=None, check_passed=False, check=note), None, unchanged
        calls, sets = [call], [outputs]
        if impl == "cuda" and mode == "cold":
            set_bytes = sum(t.nbytes for t in self.device_inputs.values()) + sum(t.nbytes for t in outputs.values())
            count = rotation_sets(set_bytes, env.timer.flush_bytes)
            for _ in range(count - 1):
                extra_call, extra_outputs = make_call({n: t.clone() for n, t in self.device_inputs.items()})
                calls.append(extra_call)
                sets.append(extra_outputs)
        try:
            sampler = self._prepare(calls, mode, graph=impl == "cuda", timer=env.timer if env.gpu else env.host_timer)
        except Exception as err:  # noqa: BLE001
            env.cleanup()
            return (self._row(impl, mode, True, timing=None, check_passed=True,
                              check=f"{note}; timing failed: {type(err).__name__}: {_first_line(err)}"),
                    None, unchanged)
        row = self._row(impl, mode, True, timing=None, check_passed=True, check=note,
                        setup_s=round(time.perf_counter() - started, 3))

        def after(row: BenchRow) -> BenchRow:
            """The timed calls wrote every set: still the checked bytes?"""
            if outputs is None:
                return row
            for written in sets:
                now = {n: _to_numpy(t) for n, t in written.items()}
                if not all(_bitwise_equal(now[n], got[n]) for n in got):
                    ok, why = check_outputs(op, now, self.expected, self.tolerances, require_all=True)
                    row = replace(row, check=row.check + "; outputs of the timed calls differ bitwise from the "
                                  "checked call" + ("" if ok else f" and fail: {why}"))
                    if not ok:
                        row = replace(row, timing=None, repeat=None, repeat_agrees=None, check_passed=False)
                    break
            return row
        return row, sampler, after

    def _baseline(self, name: str, baseline, mode: str) -> tuple[BenchRow, Sampler | None]:
        """A baseline's row (not yet timed) and its sampler (None: skipped, failed or wrong): its
        outputs on the case's inputs are checked against the reference before it may be timed."""
        env, item = self.env, self.item
        skip = baseline.skip
        if skip is None and self.settings.quick and baseline.slow_setup:
            skip = "--quick leaves out baselines with a slow setup (compilers)"
        if skip is None and baseline.clock == "device" and not env.gpu:
            skip = "needs a GPU (this run has none)"
        if skip is None and self.late():
            skip = TIME_LIMIT_SKIP
        row_mode = mode            # the group speedups are quoted in; timing.mode says "host" for host clocks
        if skip is not None:
            return self._row(name, row_mode, False, timing=None, skip=skip), None
        self.progress(f"{item.name}: {name} ({mode})")
        started = time.perf_counter()
        try:
            call = baseline.prepare(item.variant, self.device_inputs, self.params)
            got = call()
            env.sync()
            got = {n: _to_numpy(t) for n, t in got.items()}
        except Exception as err:  # noqa: BLE001
            env.cleanup()
            if _is_oom(err):
                return self._row(name, row_mode, False, timing=None, skip=f"out of memory: {_first_line(err)}"), None
            return self._row(name, row_mode, False, timing=None, check_passed=False,
                             check=f"failed: {type(err).__name__}: {_first_line(err)}"), None
        passed, note = check_outputs(self.op, got, self.expected, self.baseline_tolerances, require_all=False)
        del got
        if not passed:
            return self._row(name, row_mode, False, timing=None, check_passed=False, check=note), None
        try:
            timer = env.host_timer if baseline.clock == "host" else env.timer
            sampler = self._prepare([call], mode, graph=False, timer=timer)
        except Exception as err:  # noqa: BLE001
            env.cleanup()
            if _is_oom(err):
                return self._row(name, row_mode, False, timing=None, check_passed=True, check=note,
                                 skip=f"out of memory while timing: {_first_line(err)}"), None
            return self._row(name, row_mode, False, timing=None, check_passed=True,
                             check=f"{note}; timing failed: {type(err).__name__}: {_first_line(err)}"), None
        return (self._row(name, row_mode, False, timing=None, check_passed=True, check=note,
                          setup_s=round(time.perf_counter() - started, 3)), sampler)


TIME_LIMIT_SKIP = "the run's time limit was reached"


def rotation_sets(set_bytes: int, flush_bytes: int) -> int:
    """Input sets to rotate through so k calls touch twice the L2 (1: flush the L2 instead)."""
    if set_bytes <= 0:
        return 1
    count = math.ceil(flush_bytes / set_bytes)
    return count if 2 <= count <= MAX_ROTATE_SETS else 1


def _jsonable(value: Any) -> Any:
    from .report import plain

    return json.loads(json.dumps(plain(value), allow_nan=False, default=str))


# -- sanity cases ---------------------------------------------------------------------------------

EMPTY_KERNEL_SOURCE = 'extern "C" __global__ void kdtr_empty() {}\n'


def _empty_kernel():
    """A zero-argument launcher of an empty kernel: ours through NVRTC + the driver (the launch path
    our kernels take) where that works, else torch's spin kernel with zero cycles."""
    try:
        from .config import config
        from .device import get_kernel

        folder = config().cache_dir / "bench"
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "empty.cu"
        if not source.exists() or source.read_text() != EMPTY_KERNEL_SOURCE:
            source.write_text(EMPTY_KERNEL_SOURCE)
        kernel = get_kernel(source, "kdtr_empty")
        kernel.launch(1, 32, [])
        return (lambda: kernel.launch(1, 32, [])), "nvrtc", None
    except Exception as err:  # noqa: BLE001 - fall back, and say why
        import torch

        return (lambda: torch.cuda._sleep(0)), "torch", f"NVRTC empty kernel unavailable ({type(err).__name__}: {_first_line(err)})"


def sanity_rows(env: _Env, settings: BenchSettings) -> list[BenchRow]:
    """Known answers for the engine: an empty kernel per graph node (~0.6 us) and per eager launch
    (~5.7 us), and device copies (<= 100% of the measured bandwidth in cold mode; an 8 MiB copy in
    hot mode is served by the L2 and must come out flagged). Each is timed twice, the two timings
    interleaved in rounds; `repeat_agrees` says whether the two medians agree within their noise."""
    import torch

    rows = []
    options = settings.timing
    empty, impl, why = _empty_kernel()

    def row(case, impl, mode, calls, graph, nbytes=0.0, note=None, cold=False):
        sampler = env.timer.prepare(calls, options=options, mode="cold" if cold else "hot", graph=graph)
        first, second = interleave([sampler, sampler], options)
        for timing in (first, second):
            if isinstance(timing, Exception):
                raise timing
        r = BenchRow(case=case, op="sanity", variant="", config={"bytes": int(nbytes)} if nbytes else {},
                     impl=impl, mode=mode, primary=True, timing=first, flops=0.0, bytes=float(nbytes),
                     check=note, compute_unit="bf16_mma", repeat=second, repeat_agrees=agree(first, second))
        rows.append(with_figures(r, env.ceilings))

    row("empty_kernel_graph", impl, "hot", [empty], True, note=why)
    row("empty_kernel_eager", impl, "hot", [empty], False, note=why or "our launch path: Python + ctypes + cuLaunchKernel")
    if impl != "torch":
        row("empty_kernel_eager", "torch", "hot", [lambda: torch.cuda._sleep(0)], False,
            note="torch's own launch path (a 0-cycle spin kernel)")
    big = torch.empty(256 << 20, dtype=torch.float32, device="cuda").normal_()   # 1 GiB
    big_dst = torch.empty_like(big)
    row("copy_1GiB", "torch", "cold", [lambda: big_dst.copy_(big)], True, 2 * big.nbytes, cold=True,
        note="captured: a graph memcpy node")
    row("copy_1GiB", "torch", "cold", [lambda: big_dst.copy_(big)], False, 2 * big.nbytes, cold=True,
        note="eager copy_")
    del big, big_dst
    small = torch.empty(2 << 20, dtype=torch.float32, device="cuda").normal_()   # 8 MiB
    small_dst = torch.empty_like(small)
    count = rotation_sets(2 * small.nbytes, env.timer.flush_bytes)
    pairs = [(small, small_dst)] + [(small.clone(), torch.empty_like(small)) for _ in range(count - 1)]
    calls = [functools.partial(torch.Tensor.copy_, dst, src) for src, dst in pairs]
    row("copy_8MiB", "torch", "cold", calls, True, 2 * small.nbytes, cold=True)
    row("copy_8MiB", "torch", "hot", calls[:1], True, 2 * small.nbytes,
        note="hot: the L2 serves it; expected to be flagged above 100% of HBM bandwidth")
    del small, small_dst, pairs, calls
    env.cleanup()
    return rows


# -- provenance -----------------------------------------------------------------------------------

def gpu_clocks() -> dict[str, str] | None:
    """SM / memory clocks, temperature and power now (nvidia-smi), or None."""
    query = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    values = [v.strip() for v in out.stdout.splitlines()[0].split(",")]
    return dict(zip(("sm", "mem", "temperature", "power"), values))


def bench_meta(command: str = "bench") -> dict[str, Any]:
    from .report import record_meta

    meta = record_meta(command)
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    meta["command_line"] = shlex.join(argv)
    meta["cwd"] = os.getcwd()
    meta["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return meta


def settings_dict(settings: BenchSettings, env_primary: str, modes: Sequence[str], gpu: bool) -> dict[str, Any]:
    values = dataclasses.asdict(settings)
    values.update(primary=env_primary, modes=list(modes), gpu=gpu,
                  timer="CUDA events" if gpu else "host perf_counter (no GPU: degraded run)")
    return values


def run_bench(items: Sequence[BenchItem], settings: BenchSettings = BenchSettings(), *,
              progress: Progress | None = None,
              on_partial: Callable[[BenchRecord], None] | None = None) -> BenchRecord:
    """Ceilings, sanity cases, then every case's implementations; one record. A case that fails
    becomes rows with the reason (or an entry in `errors`); the others go on."""
    settings.timing.check()
    if settings.mode not in MODES:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, got {settings.mode!r}")
    started = time.perf_counter()
    deadline = started + settings.time_limit_s if settings.time_limit_s else None
    env = _Env(settings)
    meta = bench_meta()
    done, total = 0, len(items) + (1 if env.gpu else 0)
    report = progress or (lambda what, done, total: None)
    rows: list[BenchRow] = []
    errors: list[str] = []
    not_run: list[str] = []
    sanity: list[BenchRow] = []
    case_seconds: dict[str, float] = {}

    def record(complete: bool) -> BenchRecord:
        meta_now = dict(meta, seconds=round(time.perf_counter() - started, 3))
        if complete and env.gpu:
            meta_now["clocks_after"] = gpu_clocks()
        cut = any(r.skip == TIME_LIMIT_SKIP for r in rows)
        return BenchRecord(meta_now, settings_dict(settings, env.primary, env.modes, env.gpu), env.ceilings,
                           tuple(sanity), tuple(rows), tuple(errors), tuple(not_run),
                           complete=complete and not not_run and not cut, case_seconds=dict(case_seconds))

    import torch

    with torch.no_grad():
        if env.gpu:
            report("ceilings", done, total)
            try:
                env.ceilings = measure_ceilings(env.timer)
            except Exception as err:  # noqa: BLE001 - the cases still run; no % figures then
                errors.append(f"ceilings: {type(err).__name__}: {_first_line(err)}")
                env.cleanup()
            if settings.sanity:
                report("sanity cases", done, total)
                try:
                    sanity.extend(sanity_rows(env, settings))
                except Exception as err:  # noqa: BLE001
                    errors.append(f"sanity cases: {type(err).__name__}: {_first_line(err)}")
                    env.cleanup()
            done += 1
        lost = None
        for index, item in enumerate(items):
            if deadline is not None and time.perf_counter() > deadline:
                not_run.append(f"{item.op}/{item.variant} {item.name}")
                done += 1
                continue
            runner = _CaseRunner(env, settings, item, lambda what: report(what, done, total), deadline)
            case_started = time.perf_counter()
            try:
                rows.extend(runner.run())
            except KeyboardInterrupt:
                raise
            except Exception as err:  # noqa: BLE001 - one failing case does not stop the others
                errors.append(f"{item.op}/{item.variant} {item.name} ({item.source}): "
                              f"{type(err).__name__}: {_first_line(err)}")
            finally:
                del runner
                case_seconds[f"{item.op}/{item.variant} {item.name}"] = round(time.perf_counter() - case_started, 3)
                try:
                    env.cleanup()
                except Exception as err:  # noqa: BLE001 - e.g. a kernel's illegal address, reported late
                    lost = f"{type(err).__name__}: {_first_line(err)}"
            if lost:                      # a sticky device error: nothing after it can be trusted
                errors.append(f"the device failed after {item.op}/{item.variant} {item.name} ({item.source}): "
                              f"{lost}; the remaining cases were not run")
                not_run.extend(f"{i.op}/{i.variant} {i.name}" for i in items[index + 1:])
                break
            done += 1
            report(f"{item.op} {item.name}", done, total)
            if on_partial is not None:
                on_partial(record(complete=False))
        if env.gpu and not lost:
            env.timer.release()
    return record(complete=True)


def exit_status(record: BenchRecord) -> int:
    """1 when our implementation failed its check (or could not run) in any case, or a case errored; else 0."""
    if record.errors:
        return 1
    return 1 if any(r.primary and r.check_passed is False for r in record.rows) else 0


# -- comparison -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompareRow:
    case: str
    op: str
    variant: str
    impl: str
    mode: str
    primary: bool
    old_ms: float | None
    new_ms: float | None
    ratio: float | None            # new / old
    noise: float | None            # relative: the two medians' CI half-widths, added
    verdict: str                   # faster | slower | same | ambiguous | failed | untimed | missing | new
    regression: bool


@dataclass(frozen=True)
class Comparison:
    rows: tuple[CompareRow, ...]
    threshold: float
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> tuple[CompareRow, ...]:
        return tuple(r for r in self.rows if r.regression)

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)


def judge(old: Timing, new: Timing, threshold: float) -> tuple[str, float, float, bool]:
    """(verdict, new/old, noise, slower beyond the threshold). "same" within the noise (the two CIs
    overlap); "ambiguous" when a within-noise difference could still hide more than the threshold."""
    ratio = new.median / old.median if old.median > 0 else math.inf
    noise = old.rel_ci + new.rel_ci
    change = ratio - 1
    if abs(change) <= noise:
        return ("ambiguous" if noise > threshold else "same"), ratio, noise, False
    verdict = "slower" if change > 0 else "faster"
    return verdict, ratio, noise, verdict == "slower" and change > threshold


def compare_records(old: BenchRecord, new: BenchRecord, threshold: float = 0.10) -> Comparison:
    """Match rows on case, op, variant, implementation, mode and every parameter; judge each pair
    against the measured noise. Regressions (which fail `kdtree bench --compare`) are primary rows
    slower by more than `threshold` beyond the noise, or whose check passed before and fails now."""
    if not threshold > 0:
        raise UsageError(f"the regression threshold must be > 0, got {threshold}")
    notes = []
    old_gpu = (old.meta.get("device") or {}).get("gpu")
    new_gpu = (new.meta.get("device") or {}).get("gpu")
    if old_gpu != new_gpu:
        notes.append(f"different GPUs: {old_gpu} vs {new_gpu}")
    if old.ceilings and new.ceilings:
        for name in ("hbm_read_gbps", "hbm_copy_gbps", "bf16_mma_tflops", "fp32_fma_tflops"):
            a, b = getattr(old.ceilings, name), getattr(new.ceilings, name)
            if a > 0 and abs(b / a - 1) > threshold:
                notes.append(f"ceiling {name} moved {100 * (b / a - 1):+.1f}% ({a:.4g} -> {b:.4g}): "
                             "the machine differs, not only the code")
    olds = {r.key: r for r in old.rows}
    news = {r.key: r for r in new.rows}
    out = []
    for key, n in news.items():
        o = olds.get(key)
        base = dict(case=n.case, op=n.op, variant=n.variant, impl=n.impl, mode=n.mode, primary=n.primary)
        if o is None:
            out.append(CompareRow(**base, old_ms=None, new_ms=n.timing.median if n.timing else None,
                                  ratio=None, noise=None, verdict="new", regression=False))
            continue
        if n.check_passed is False and o.check_passed is not False:
            out.append(CompareRow(**base, old_ms=o.timing.median if o.timing else None, new_ms=None,
                                  ratio=None, noise=None, verdict="failed", regression=n.primary))
            continue
        if o.timing is None or n.timing is None:
            out.append(CompareRow(**base, old_ms=o.timing.median if o.timing else None,
                                  new_ms=n.timing.median if n.timing else None, ratio=None, noise=None,
                                  verdict="untimed", regression=False))
            continue
        verdict, ratio, noise, slower = judge(o.timing, n.timing, threshold)
        out.append(CompareRow(**base, old_ms=o.timing.median, new_ms=n.timing.median, ratio=ratio,
                              noise=noise, verdict=verdict, regression=slower and n.primary))
    for key, o in olds.items():
        if key not in news:
            out.append(CompareRow(case=o.case, op=o.op, variant=o.variant, impl=o.impl, mode=o.mode,
                                  primary=o.primary, old_ms=o.timing.median if o.timing else None,
                                  new_ms=None, ratio=None, noise=None, verdict="missing", regression=False))
    return Comparison(tuple(out), threshold, tuple(notes))


# -- CSV ------------------------------------------------------------------------------------------

CSV_HEADER = ["case", "op", "variant", "config", "impl", "primary", "mode", "timing_mode", "method",
              "calls_per_sample", "median_us", "p10_us", "p90_us", "rel_std", "rel_ci", "n", "stop_reason",
              "flops", "bytes", "tflops", "gbps", "pct_compute", "pct_bandwidth", "compute_unit", "flagged",
              "check_passed", "skip", "repeat_median_us", "repeat_agrees", "rounds", "rel_ci_samples",
              "rel_ci_rounds", "repeat_rel_ci", "setup_s"]


def csv_table(record: BenchRecord) -> tuple[list[str], list[list[Any]]]:
    """One line per row (sanity rows first); a speedup_vs_<baseline> column per baseline present."""
    rows = [*record.sanity, *record.rows]
    baselines = sorted({name for r in rows for name in r.speedups})
    header = CSV_HEADER + [f"speedup_vs_{b}" for b in baselines]

    def us(ms):
        return None if ms is None else round(ms * 1e3, 6)

    lines = []
    for r in rows:
        t = r.timing
        lines.append([r.case, r.op, r.variant, " ".join(f"{k}={v}" for k, v in r.config.items()), r.impl,
                      r.primary, r.mode, t.mode if t else "", t.method if t else "",
                      t.calls_per_sample if t else "", us(t.median) if t else "", us(t.p10) if t else "",
                      us(t.p90) if t else "", t.rel_std if t else "", t.rel_ci if t else "", t.n if t else "",
                      t.stop_reason if t else "", r.flops, r.bytes, _blank(r.tflops), _blank(r.gbps),
                      _blank(r.pct_compute), _blank(r.pct_bandwidth), r.compute_unit, r.flagged,
                      _blank(r.check_passed), r.skip or "", us(r.repeat.median) if r.repeat else "",
                      _blank(r.repeat_agrees), t.rounds if t else "", _blank(t.rel_ci_samples) if t else "",
                      _blank(t.rel_ci_rounds) if t else "", r.repeat.rel_ci if r.repeat else "",
                      _blank(r.setup_s)]
                     + [_blank(r.speedups.get(b)) for b in baselines])
    return header, lines


def _blank(value: Any) -> Any:
    return "" if value is None else value


def bench_csv(record: BenchRecord) -> str:
    from .report import csv_text

    header, lines = csv_table(record)
    return csv_text(header, lines)


def default_record_path(folder: str | Path = "results") -> Path:
    """results/bench-<UTC time>.json"""
    return Path(folder) / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"


def merge_records(records: Sequence[BenchRecord]) -> BenchRecord:
    """One bench record from shards' records: rows joined; the first record's ceilings and sanity
    rows stand for the run (each shard measured its own; they are kept under meta.merged_from)."""
    first = records[0]
    meta = dict(first.meta) | {"merged_from": [dict(r.meta) | {"ceilings": r.ceilings} for r in records]}
    return replace(first, meta=meta, rows=tuple(row for r in records for row in r.rows),
                   errors=tuple(e for r in records for e in r.errors),
                   not_run=tuple(n for r in records for n in r.not_run),
                   complete=all(r.complete for r in records),
                   case_seconds={k: v for r in records for k, v in r.case_seconds.items()})


def write_record(path: str | Path, record: BenchRecord) -> None:
    from .report import write_json

    write_json(path, record)
