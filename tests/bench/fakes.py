"""Shared by the test_bench_* modules: synthetic records, small suites on disk and a fake CUDA.

The GPU paths (CUDA graphs, events, L2 flush, ceilings) run on the H200; their records are under
results/. Here they are exercised through synthetic records and the degraded host-timed run.
"""

from __future__ import annotations

import copy
import functools
import json
import os

import numpy as np

from kdtr import bench
from kdtr.config import REPO_ROOT
from kdtr.bench import runner as bench_runner
from kdtr.bench import BenchRecord, BenchRow, Ceilings, TimingOptions
from kdtr.bench.stats import summarize
from kdtr.impl import Implementation, Serves


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
    return bench.record.with_figures(r, CEILINGS)


def record(scale=1.0, noise=0.002, seed=0):
    rows = []
    for i, case in enumerate(("a", "b", "c")):
        rows += [row(case, "cuda", 2.0 * (i + 1) * scale, primary=True, seed=seed + i, noise=noise),
                 row(case, "torch", 20.0 * (i + 1), primary=False, seed=seed + 10 + i, noise=noise),
                 BenchRow(case=case, op="verify_attn", variant="bf16_paged", config={"B": 8, "H": 64},
                          impl="sdpa", mode="cold", primary=False, timing=None, flops=1e12, bytes=1e9,
                          skip="would need ~146 GB", params={"batch": 8})]
    rows = bench.record.with_speedups(rows)
    meta = {"device": {"gpu": "NVIDIA H200"}, "commit": "abc", "seconds": 1.0}
    settings = {"primary": "cuda", "gpu": True, "modes": ["cold"], "timer": "CUDA events",
                "timing": {"budget_s": 0.5, "target": 0.01}}
    return BenchRecord(meta, settings, CEILINGS, (), tuple(rows))


# -- small suites on disk ---------------------------------------------------------------------------

SUITES = {
    "tree_build": "op: tree_build\nseed: 1\ncases:\n  - {name: tb_small, batch: 3, depth: 5, vocab: 64, budget: 12}\n",
    "tree_accept": "op: tree_accept\nseed: 1\ncases:\n  - {name: ta_small, batch: 4, budget: 8, depth: 4}\n"
                   "  - {name: ta_other, batch: 2, budget: 4, depth: 3}\n  - {name: ta_third, batch: 2, budget: 6}\n",
    "verify_attn": "op: verify_attn\nseed: 1\ncases:\n"
                   "  - {name: va_fp32, variant: fp32, batch: 2, heads: 4, prefix: 30, budget: 6}\n"
                   "  - {name: va_bf16, variant: bf16_paged, batch: 2, heads: 4, prefix: 30, budget: 6, prefix_mode: mixed}\n",
}


# -- a fake CUDA for the device timer (the real one runs on the H200) -------------------------------

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
        monkeypatch.setattr(bench.timers.DeviceTimer, "flush", flush)
        return self


def cuda_inputs_on_the_cpu(monkeypatch) -> None:
    """Inputs uploaded "to the GPU" stay on the CPU, where the fake CUDA's kernels read them: an
    implementation on "cuda" runs against the fake device (run, check and time), not the host clock."""
    from kdtr.impl import backends

    upload = backends.upload
    monkeypatch.setattr(backends, "upload",
                        lambda inputs, device: upload(inputs, "cpu" if device == "cuda" else device))


def _peer_in_worker(ms: float, crash_at: int | None) -> Implementation:
    """The recipe `isolated_peer` sends its worker process: a fake CUDA installed there (the worker
    times on its own device clock) and a tree_accept implementation whose call takes `ms` of it; with
    `crash_at`, its `crash_at`-th prepare ends the process (os._exit: the first prepare is the checked
    call's, the later ones make the case's other input sets)."""
    import pytest

    patch = pytest.MonkeyPatch()
    fake = FakeCuda().install(patch)
    cuda_inputs_on_the_cpu(patch)
    prepared = []

    def prepare(op, variant, inputs, params):
        prepared.append(1)
        if crash_at is not None and len(prepared) >= crash_at:
            os._exit(0)
        outputs = op.run_torch(variant, inputs, params)

        def call():
            fake.kernel(ms)()
            return outputs
        return call
    return Implementation("isolated_peer", (Serves("tree_accept"),), prepare, device="cuda")


def isolated_peer(ms: float, crash_at: int | None = None) -> Implementation:
    """An implementation under test in a worker process of its own (`_peer_in_worker` there), as an
    `--impl` runs by default: this process never prepares it."""
    def here(*_):
        raise AssertionError("an isolated implementation is prepared in its worker process")
    return Implementation("isolated_peer", (Serves("tree_accept"),), here, device="cuda",
                          worker=functools.partial(_peer_in_worker, ms, crash_at))


OPTS = TimingOptions(budget_s=5, target=0.01, min_samples=10, max_samples=100, warmup_s=0, sample_ms=0.5)


def _fake_gpu_env(monkeypatch, l2_bytes=4096, modes=("cold",), fake=None):
    (fake or FakeCuda()).install(monkeypatch)
    env = object.__new__(bench_runner._Env)
    env.gpu, env.primary, env.device, env.modes = True, "cuda", "cpu", modes
    env.timer = bench.timers.DeviceTimer(l2_bytes)
    env.host_timer = bench.timers.HostTimer()
    env.ceilings = CEILINGS
    env.watch = None
    env.uncapturable = set()
    return env


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


# -- the H200's record and a copy that names another GPU (report --compare-gpus) ----------------

H200 = REPO_ROOT / "results" / "bench.json"
CEILING_NAMES = ("hbm_read_gbps", "hbm_copy_gbps", "bf16_mma_tflops", "fp32_fma_tflops")


def h200() -> dict:
    return json.loads(H200.read_text())


def other_gpu(data: dict) -> dict:
    """The B200 copy: named GPU, doubled ceilings, our timed rows twice as fast."""
    data = copy.deepcopy(data)
    data.pop("samples_file", None)
    data["meta"]["gpu"] = {"model": "NVIDIA B200", "arch": "sm_100", "sms": 148, "clock_sm_max": "1965 MHz",
                           "clock_mem": "3996 MHz",
                           "ceilings": {k: 2 * data["ceilings"][k] for k in CEILING_NAMES}}
    for row in data["rows"]:
        if row["impl"] == "cuda" and row["timing"]:
            row["timing"]["median"] /= 2
    return data
