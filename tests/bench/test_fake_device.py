"""The device timer's logic and the case runner against a fake CUDA (the real one runs on the H200)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kdtr import bench
from kdtr.bench import runner as bench_runner
from kdtr.bench import BenchSettings
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.bench.fakes import OPTS, FakeCuda, _fake_gpu_env


# -- the device timer's logic against a fake CUDA (the real one runs on the H200) --------------------

def test_device_timer_hot_graph_divides_by_calls_per_sample(monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    t = bench.timers.DeviceTimer(60 << 20).measure([fake.kernel(0.002)], options=OPTS, mode="hot")
    assert (t.mode, t.method) == ("hot", "graph")
    assert t.calls_per_sample == 250                      # 0.5 ms samples of 2 us calls
    assert t.median == pytest.approx(0.002) and t.stop_reason == "converged"
    assert t.rel_ci == pytest.approx(0.0005 / (t.calls_per_sample * 0.002))     # the event resolution
    assert t.rounds == OPTS.min_rounds and t.rel_ci_rounds == pytest.approx(0, abs=1e-9)
    t = bench.timers.DeviceTimer(60 << 20).measure([fake.kernel(0.002)], options=replace(OPTS, noise_floor=0.005), mode="hot")
    assert t.rel_ci == pytest.approx(0.005)                      # a noise floor, when asked for one
    assert fake.flushes == 0


def test_device_timer_cold_flush_and_rotate(monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    timer = bench.timers.DeviceTimer(60 << 20)
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
    t = bench.timers.DeviceTimer(60 << 20).measure([fake.kernel(0.004)], options=OPTS, mode="hot")
    assert t.method == "eager" and "graph capture failed (RuntimeError" in t.note
    assert t.median == pytest.approx(0.004) and t.calls_per_sample == 125
    t = bench.timers.DeviceTimer(60 << 20).measure([fake.kernel(1.0)], options=OPTS, mode="hot", graph=False)
    assert t.method == "eager" and t.calls_per_sample == 1 and t.note == ""


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
    item = bench.cases.BenchItem("c", op_name, variant, case.params, "test", case=case)
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
    assert ours.compute_unit == op.compute_unit(variant, ours.extra.get("kernel"))
    assert ours.extra.get("kernel") == op.kernel_choice(variant, *item.load())   # None: one kernel
    assert [r.impl for r in rows] == ["cuda", *baselines]
    for r in rows[1:]:       # baselines are captured like ours (one method for all: docs/timing.md)
        assert r.check_passed and r.timing.method == "graph" and r.timing.rounds == ours.timing.rounds, r.check
    for r in rows:           # and each timed again alone, after the rounds
        assert r.alone is not None and r.alone.rounds >= OPTS.min_rounds and r.alone.method == r.timing.method
    assert any(s.endswith("back to back (cold)") for s in seen), seen
    assert any("inputs" in s for s in seen)
    assert any(s.endswith(f"rounds (cold): cuda, {', '.join(baselines)}, cuda again") for s in seen), seen


def test_a_baseline_whose_probe_refuses_the_case_is_a_skipped_row(monkeypatch):
    """SDPA is an Implementation whose probe refuses a case that would not fit in device memory:
    bench shows its reason, as it is, as the row's skip, and times nothing for it."""
    from kdtr.ops.verify_attn import torch_impl

    op = get_op("verify_attn")
    monkeypatch.setattr(op, "run_cuda", _fake_run_cuda(op))
    monkeypatch.setattr(torch_impl, "_device_free_bytes", lambda: 1000)
    env = _fake_gpu_env(monkeypatch, 1 << 20, modes=("hot",))
    case = Case("c", "verify_attn", "fp32", 9, dict(op._defaults, batch=2, heads=4, prefix=30, budget=6))
    item = bench.cases.BenchItem("c", "verify_attn", "fp32", case.params, "test", case=case)
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), baselines=("sdpa",))
    rows = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    sdpa = next(r for r in rows if r.impl == "sdpa")
    assert sdpa.timing is None and sdpa.skip.startswith("would need ~") and sdpa.skip.endswith("0 GB free"), sdpa
    assert [r.impl for r in rows] == ["cuda", "sdpa"] and rows[0].check_passed


def test_case_runner_reports_a_wrong_kernel_and_a_missing_one(monkeypatch):
    op = get_op("tree_accept")
    env = _fake_gpu_env(monkeypatch, modes=("hot",))
    case = Case("c", "tree_accept", "default", 9, dict(op._defaults, batch=4, budget=8, depth=4))
    item = bench.cases.BenchItem("c", "tree_accept", "default", case.params, "test", case=case)
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), baselines=())
    monkeypatch.setattr(op, "run_cuda", _fake_run_cuda(op, wrong=True))
    [row_] = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    assert row_.check_passed is False and row_.timing is None and "accept_len" in row_.check
    monkeypatch.setattr(op, "run_cuda", lambda *a: (_ for _ in ()).throw(NotImplementedError()))
    [row_] = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    assert row_.skip == "tree_accept/default has no run_cuda yet" and row_.check_passed is None
