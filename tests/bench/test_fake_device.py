"""The device timer's logic and the case runner against a fake CUDA (the real one runs on the H200)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kdtr import bench
from kdtr.bench import runner as bench_runner
from kdtr.bench import BenchSettings
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.bench.fakes import OPTS, FakeCuda, _fake_gpu_env, cuda_inputs_on_the_cpu, isolated_peer


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
    runner = bench_runner._CaseRunner(env, settings, item, seen.append, None)
    rows = runner.run()
    ours = next(r for r in rows if r.primary)
    plan = runner.plans["cold"]
    assert (plan.mode, plan.sized_by) == ("cold-rotate", "cuda") and plan.sets > 1
    assert (ours.timing.mode, ours.timing.calls_per_sample) == (plan.mode, plan.calls_per_sample)
    for r in rows[1:]:       # every baseline timed by the case's one plan: same mode, sets and calls a sample
        assert r.check_passed and r.timing.method == "graph" and r.timing.rounds == ours.timing.rounds, r.check
        assert (r.timing.mode, r.timing.calls_per_sample) == (plan.mode, plan.calls_per_sample), r.timing
        assert f"{plan.sets} input sets rotated" in r.timing.note
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


def test_every_implementation_of_a_case_is_timed_by_one_plan_on_a_fake_clock(monkeypatch):
    """The fake clock makes our kernel 2 us a call and the baseline 40 us: the baseline still gets our
    calls a sample and input sets (the plan's), its figure is its own per-call time, and the ratio
    between them is the kernels' (20x), not a method's. A baseline whose extra input sets cannot be
    made is timed on one set, says so, and gets no ratio."""
    from kdtr.ops.base import Baseline

    fake = FakeCuda()
    op = get_op("tree_accept")
    env = _fake_gpu_env(monkeypatch, 1 << 16, fake=fake)
    monkeypatch.setattr(op, "run_cuda", lambda variant, inputs, params, outputs: (
        _fake_run_cuda(op)(variant, inputs, params, outputs), fake.kernel(0.002)()))
    case = Case("c", "tree_accept", "default", 9, dict(op._defaults, batch=4, budget=8, depth=4))
    item = bench.cases.BenchItem("c", "tree_accept", "default", case.params, "test", case=case)
    made = []

    def slow_prepare(op_, variant, inputs, params):
        made.append(1)
        if fail_extra and len(made) > 1:
            raise RuntimeError("no second set")
        outputs = op_.run_torch(variant, inputs, params)

        def call():
            fake.kernel(0.040)()
            return outputs
        return call
    peer = Baseline("peer", "a slow peer", prepare=slow_prepare)
    monkeypatch.setattr(op, "baselines", lambda *a: [peer])
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), back_to_back=False)
    for fail_extra in (False, True):
        made.clear()
        runner = bench_runner._CaseRunner(env, settings, item, lambda s: None, None)
        rows = runner.run()
        ours, other = rows
        plan = runner.plans["cold"]
        assert plan.sets > 1 and plan.calls_per_sample % plan.sets == 0
        if not fail_extra:
            assert len(made) == plan.sets
            assert (other.timing.mode, other.timing.calls_per_sample) == ("cold-rotate", plan.calls_per_sample)
            assert other.timing.median == pytest.approx(0.040) and ours.timing.median == pytest.approx(0.002)
            assert ours.speedups["peer"] == pytest.approx(20, rel=1e-3)
        else:
            assert other.timing.mode == "cold-flush" and other.timing.calls_per_sample == 1
            assert "not timed by the case's method" in other.check and "peer" not in ours.speedups


def test_an_isolated_impl_is_timed_by_the_case_s_plan_in_its_worker(monkeypatch):
    """An --impl in a worker process of its own makes the case's input sets there with its own
    prepare and is timed by the case's plan (mode, sets, calls a sample), on its worker's fake clock:
    its row gets its ratio (20x) as an in-process baseline's does. Before, it was timed on one input
    set (cold-flush, one call a sample) and got none. A crash in its worker while it makes its sets
    still fails its row only."""
    from types import SimpleNamespace

    from kdtr.impl import isolation

    fake = FakeCuda()
    op = get_op("tree_accept")
    env = _fake_gpu_env(monkeypatch, 1 << 16, fake=fake)
    env.device = "cuda"                # the peer's device is the run's (else a host-clocked row)
    cuda_inputs_on_the_cpu(monkeypatch)
    monkeypatch.setattr(op, "run_cuda", lambda variant, inputs, params, outputs: (
        _fake_run_cuda(op)(variant, inputs, params, outputs), fake.kernel(0.002)()))
    case = Case("c", "tree_accept", "default", 9, dict(op._defaults, batch=4, budget=8, depth=4))
    item = bench.cases.BenchItem("c", "tree_accept", "default", case.params, "test", case=case)
    try:
        for crash_at in (None, 2):
            peer = isolated_peer(0.040, crash_at)
            settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), baselines=(),
                                     back_to_back=False, impls=(SimpleNamespace(load=lambda peer=peer: peer),))
            runner = bench_runner._CaseRunner(env, settings, item, lambda s: None, None)
            ours, mine = runner.run()
            plan = runner.plans["cold"]
            assert (plan.mode, plan.sized_by) == ("cold-rotate", "cuda") and plan.sets > 1
            assert ours.timing is not None and ours.timing.median == pytest.approx(0.002)
            if crash_at is None:
                assert mine.check_passed and "the case's method" not in mine.check, mine.check
                assert (mine.timing.mode, mine.timing.method, mine.timing.calls_per_sample) == \
                    (plan.mode, plan.method, plan.calls_per_sample), mine.timing
                assert f"{plan.sets} input sets rotated" in mine.timing.note
                assert mine.timing.median == pytest.approx(0.040)
                assert ours.speedups["isolated_peer"] == pytest.approx(20, rel=1e-3)
            else:
                assert mine.check_passed is False and mine.timing is None
                assert "crashed while timed: its worker process died" in mine.check, mine.check
                assert "isolated_peer" not in ours.speedups
    finally:
        isolation.stop_workers()


def test_the_sdpa_guard_counts_what_pytorch_holds_cached_as_free(monkeypatch):
    """76 GiB reserved by PyTorch's allocator but unallocated is memory the next allocation gets
    (the allocator hands it out, or empties it before an out-of-memory error): the guard counts it."""
    import torch

    from kdtr.ops.verify_attn import torch_impl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (2 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 77 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 1 << 30)
    assert torch_impl._device_free_bytes() == 78 << 30


def test_an_implementation_whose_capture_failed_is_not_captured_again_in_the_run(monkeypatch):
    """A failed capture kept its private memory pool on torch 2.11 (the H100's chain run reserved
    76 GiB after twelve cases, 1 GiB of it allocated): once an implementation's capture fails, later
    cases time it eagerly without trying, and say why."""
    fake = FakeCuda()
    op = get_op("tree_accept")
    env = _fake_gpu_env(monkeypatch, 1 << 16, fake=fake)
    monkeypatch.setattr(op, "run_cuda", lambda variant, inputs, params, outputs: (
        _fake_run_cuda(op)(variant, inputs, params, outputs), fake.kernel(0.002)()))
    captures = []
    real_capture = bench.timers.DeviceTimer._capture

    def capture(timer, calls, k):
        captures.append(k)
        fake.fail_capture = True              # every capture fails
        try:
            return real_capture(timer, calls, k)
        finally:
            fake.fail_capture = False
    monkeypatch.setattr(bench.timers.DeviceTimer, "_capture", capture)
    case = Case("c", "tree_accept", "default", 9, dict(op._defaults, batch=4, budget=8, depth=4))
    item = bench.cases.BenchItem("c", "tree_accept", "default", case.params, "test", case=case)
    settings = BenchSettings(timing=replace(OPTS, budget_s=0.05, min_samples=3), baselines=(), back_to_back=False)
    [first] = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    assert first.timing.method == "eager" and "graph capture failed" in first.timing.note
    assert captures and env.uncapturable == {"cuda"}
    captures.clear()
    [second] = bench_runner._CaseRunner(env, settings, item, lambda s: None, None).run()
    assert captures == [] and second.timing.method == "eager"
    assert bench_runner.UNCAPTURABLE in second.timing.note
