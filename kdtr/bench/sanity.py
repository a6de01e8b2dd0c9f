"""Known answers for the engine: empty kernels and device copies, each timed twice."""

from __future__ import annotations

import functools
from typing import Any

from .ceilings import _empty_kernel
from .record import BenchRow, with_figures
from .schedule import interleave
from .settings import BenchSettings
from .stats import agree
from .timers import rotation_sets


def sanity_rows(env: Any, settings: BenchSettings) -> list[BenchRow]:
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
