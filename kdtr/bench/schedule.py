"""Interleaved, balanced turns of every implementation until the noise target or the budget."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .settings import TimingOptions
from .stats import Timing, summarize
from .telemetry import Reading, kept_turns, turn_record


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
               progress: Callable[[int], None] | None = None,
               telemetry: Callable[[], Reading] | None = None) -> list[Timing | Exception]:
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

    A sampler that raises drops out of the rounds; its slot returns the exception. `telemetry`
    (telemetry.Nvml.read) brackets every turn with two readings; the samples of a throttled turn
    are left out of its figure and counted (telemetry.kept_turns)."""
    m = len(samplers)
    results: list[Timing | Exception | None] = [None] * m
    if m == 0:
        return []
    turn_s = options.budget_s / options.rounds
    cap = max(1, options.max_samples // options.rounds)
    batch = [max(1, min(cap, int(turn_s / s.per_sample_s + 1e-9) if s.per_sample_s > 0 else cap)) for s in samplers]
    rounds: list[list[list[float]]] = [[] for _ in samplers]
    turns: list[list[dict]] = [[] for _ in samplers]
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
        kept, dropped, why = kept_turns(rounds[i], turns[i])
        pooled = [v for k in kept for v in rounds[i][k]]
        return summarize(pooled, stop_reason=reason, mode=s.mode, method=s.method,
                         calls_per_sample=s.calls_per_sample, note="; ".join(n for n in (s.note, why) if n),
                         resolution_ms=s.resolution_ms, noise_floor=options.noise_floor,
                         round_medians=[float(np.median(rounds[i][k])) for k in kept],
                         throttled_samples=dropped, telemetry=turns[i])

    start = clock()
    r = 0
    collecting = gc.isenabled()
    gc.disable()                    # as timeit does: no collector pause inside a sample
    try:
        while live:
            for i in cycle:
                if i not in live:
                    continue
                before = telemetry() if telemetry is not None else None
                got = take(i, batch[i])
                if got is not None:
                    rounds[i].append(got)
                    if before is not None:
                        turns[i].append(turn_record(len(got), before, telemetry()))
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


def back_to_back(samplers: Sequence[Sampler], options: TimingOptions, *,
                 clock: Callable[[], float] = time.perf_counter, deadline: float | None = None,
                 telemetry: Callable[[], Reading] | None = None) -> list[Timing | Exception]:
    """Each implementation again, alone: its own rounds with nothing between its samples but itself
    (call after call, as a server runs it), one after another. Beside the interleaved figure it
    shows what a neighbour did to a figure: on the H200 our kernel ran 7-11% faster interleaved
    with SGLang's than alone (results/seeds-*.json, docs/timing.md)."""
    out: list[Timing | Exception] = []
    for sampler in samplers:
        [result] = interleave([sampler], options, clock=clock, deadline=deadline, telemetry=telemetry)
        out.append(result)
    return out
