"""The timers: CUDA events over graph replays with an L2 flush or input rotation; perf_counter on the host."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import reason
from .schedule import Sampler, _one, _warm
from .settings import SLOW_CALL_MS, TimingOptions
from .stats import Timing

DEFAULT_L2_BYTES = 64 << 20       # when torch does not report the L2 size
EVENT_RESOLUTION_MS = 0.0005      # CUDA events resolve about half a microsecond
BLOCK_CYCLES = 50_000             # spin kernel before each sample (~25 us at 2 GHz)
MAX_ROTATE_SETS = 2048            # cold mode: more input sets than this -> flush instead


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
                graph: bool = True, calls_per_sample: int | None = None) -> Sampler:
        """Make `calls` ready to time (one callable, or several over distinct input sets to rotate
        through in cold mode): warm-up, capture, k calls per sample. `mode` is "hot" or "cold";
        `graph` tries CUDA-graph capture, else eager. k is sized to `options.sample_ms` from this
        implementation's own call time unless `calls_per_sample` fixes it (bench gives every
        implementation of a case the same k: kdtr/bench/plan.py); rotated sets need a multiple of
        their count, a flushed sample one call."""
        import torch

        if calls_per_sample is not None:
            if calls_per_sample < 1 or calls_per_sample % len(calls):
                raise ValueError(f"{calls_per_sample} calls a sample do not rotate {len(calls)} input sets evenly")
            if mode == "cold" and len(calls) == 1 and calls_per_sample != 1:
                raise ValueError("a sample after an L2 flush is one call")

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
                notes.append(f"graph capture failed ({reason(err)}); timed eagerly")
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
            k = calls_per_sample or k
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


def rotation_sets(set_bytes: int, flush_bytes: int) -> int:
    """Input sets to rotate through so k calls touch twice the L2 (1: flush the L2 instead)."""
    if set_bytes <= 0:
        return 1
    count = math.ceil(flush_bytes / set_bytes)
    return count if 2 <= count <= MAX_ROTATE_SETS else 1
