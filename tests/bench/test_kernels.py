"""Kernel experiments against a fake device: --kernel and --define builds timed and checked against each other."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace

import pytest

from kdtr import bench
from kdtr.bench import runner as bench_runner
from kdtr.bench import BenchRecord, BenchSettings
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.bench.fakes import OPTS, FakeCuda, _fake_gpu_env, record, row
from tests.helpers import invoke


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
    return op, bench.cases.BenchItem("c", "verify_attn", "fp32", case.params, "test", case=case)


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
    assert [r.compute_unit for r in rows] == ["fp32_fma", "bf16_mma_x6"]     # each its own kernel's ceiling


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


def test_a_switch_launch_knob_takes_0_or_1():
    """bf16_wgmma2's WG2_LPT and WG2_PDL are switches (their source default is 0 or 1): 0 turns one
    off for an A/B whatever the default (the device round's split was refused for WG2_LPT=0);
    anything but 0 or 1 exits 2, but for the balance knob's 2 (WG2_LPT's segment schedule, refused
    until session 19's device call met it); a count knob beside them (SPLITS) still takes only
    positives."""
    from kdtr.errors import UsageError

    off, on, seg = bench.kernel_builds([], ["bf16_wgmma2:WG2_LPT=0,WG2_PDL=0", "bf16_wgmma2:WG2_LPT=1",
                                            "bf16_wgmma2:WG2_LPT=2"])
    assert off.launch == ("WG2_LPT", "WG2_PDL") and on.launch == seg.launch == ("WG2_LPT",)
    for bad in ("WG2_LPT=3", "WG2_PDL=2", "WG2_PDL=-1", "WG2_LPT=yes", "SPLITS=0"):
        with pytest.raises(UsageError, match=f"{bad}: a launch knob takes"):
            bench.kernel_builds([], [f"bf16_wgmma2:{bad}"])


def test_items_for_kernels_keeps_the_cases_of_their_op_and_variant(suites):
    from kdtr.errors import UsageError

    items = bench.cases.collect_items([suites])
    assert [i.name for i in bench.cases.items_for_kernels(items, bench.kernel_builds(["fp32_dmma"]))] == ["va_fp32"]
    both = bench.cases.items_for_kernels(items, bench.kernel_builds(["sorted", "bf16_mma"]))
    assert [i.name for i in both] == ["tb_small", "va_bf16"]
    assert bench.cases.items_for_kernels(items, ()) == items
    with pytest.raises(UsageError, match="no case to bench has kernel fp32_dmma"):
        bench.cases.items_for_kernels([i for i in items if i.op != "verify_attn"], bench.kernel_builds(["fp32_dmma"]))


def test_cli_bench_kernel_errors_exit_2(suites):
    unknown = invoke("bench", suites, "--kernel", "nope")
    assert unknown.exit_code == 2 and "unknown kernel 'nope'; known: " in unknown.output
    assert len(unknown.output.strip().splitlines()) == 1
    bad = invoke("bench", suites, "--define", "fp32_dmma")
    assert bad.exit_code == 2 and "expected KERNEL:KNOB=VALUE" in bad.output
    from kdtr.runtime.device import gpu_available

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
        rows += bench.record.with_speedups(group)
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
