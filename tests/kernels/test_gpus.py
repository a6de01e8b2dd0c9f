"""KDTREE_GPU (run as another GPU) and `kdtree build`'s per-arch placement, on the CPU: the parse, the
choice every launch reads (Gpu.here), the refusal where the present GPU lacks what the choice needs,
the record's `ran_as`, and which kernels `build` compiles for which arch (docs/gpus.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kdtr.config import config
from kdtr.errors import DeviceError
from kdtr.gpus import GPU_MODELS, SMEM_99K, RunAs, parse_run_as
from kdtr.ops import cuda_kernels, get_op
from kdtr.ops.base import Gpu
from kdtr.ops.placement import placements

from ..helpers import kdtree_env, run_kdtree

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def run_as(monkeypatch):
    """Set KDTREE_GPU for one test (config() is re-read); no GPU here, so Gpu.here() reads the table."""
    def set_value(value: str | None):
        if value is None:
            monkeypatch.delenv("KDTREE_GPU", raising=False)
        else:
            monkeypatch.setenv("KDTREE_GPU", value)
        config.cache_clear()
    yield set_value
    config.cache_clear()


@pytest.mark.parametrize("value,expect", [
    ("sm_120", RunAs(120, SMEM_99K)), ("sm_121", RunAs(121, SMEM_99K)), ("sm_89", RunAs(89, SMEM_99K)),
    ("sm_86", RunAs(86, SMEM_99K)), ("sm_80", RunAs(80, 166912)), ("sm_90", RunAs(90, 232448)),
    (" sm_120:99000 ", RunAs(120, 99000)), ("sm_75:65536", RunAs(75, 65536)),
])
def test_kdtree_gpu_values(value, expect):
    assert parse_run_as(value) == expect


@pytest.mark.parametrize("value,why", [("h200", "like sm_120"), ("sm_120:", "like sm_120"),
                                       ("sm_75", "no usual shared-memory limit"),
                                       ("sm_120:1024", "not a shared-memory limit")])
def test_bad_kdtree_gpu_values_say_why(value, why):
    with pytest.raises(ValueError, match=why):
        parse_run_as(value)


def test_a_bad_kdtree_gpu_is_one_line_naming_the_variable_and_exit_2(tmp_path):
    done = run_kdtree("build", "--arch", "sm_80", cwd=ROOT, timeout=120,
                      env=kdtree_env(KDTREE_GPU="sm_12O", KDTREE_CACHE_DIR=str(tmp_path)))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "KDTREE_GPU='sm_12O'" in done.stderr, done.stderr
    assert done.stdout == ""


def paged(batch, heads, prefix, q_len):
    return {"q": np.zeros((batch * q_len, heads, 576), np.uint16),
            "kv_indptr": np.arange(batch + 1, dtype=np.int32) * prefix,
            "kv_indices": np.zeros(batch * prefix, np.int32), "tree_slots": np.zeros(batch * q_len, np.int32)}


@pytest.mark.parametrize("value,expect", [(None, "bf16_wgmma2"), ("sm_120", "bf16_mma99"), ("sm_89", "bf16_mma99"),
                                          ("sm_86", "bf16_mma99"), ("sm_80", "bf16_mma"), ("sm_100", "bf16_mma"),
                                          ("sm_90:101376", "bf16_mma99")])
def test_every_launch_chooses_as_on_the_gpu_run_as(run_as, value, expect):
    """Gpu.here() is what every launch's choice reads (no GPU here: without KDTREE_GPU, the H200)."""
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present: Gpu.here() reads its SM count")
    run_as(value)
    gpu = Gpu.here()
    if value is not None:
        spec = parse_run_as(value)
        assert (gpu.arch, gpu.smem_optin, gpu.sms) == (spec.arch, spec.smem_optin,
                                                       (GPU_MODELS.get(spec.arch) or GPU_MODELS[90]).sms)
    inputs = paged(8, 8, 8192, 33)
    assert get_op("verify_attn").kernel_choice("bf16_paged", inputs, {}) == expect


@pytest.mark.parametrize("value", ["sm_120", "sm_89", "sm_86", "sm_80"])
def test_fp32_run_as_a_99k_gpu_or_an_a100_picks_fp32_ffma99(run_as, value):
    """Issue 28: fp32 had no kernel there ("no verify_attn/fp32 kernel runs on sm_120 with 101376 B")."""
    run_as(value)
    inputs = {"q": np.zeros((1, 17, 16, 576), np.float32), "kv": np.zeros((1, 2065, 576), np.float32)}
    assert get_op("verify_attn").kernel_choice("fp32", inputs, {}) == "fp32_ffma99"


def test_fp32_under_ffma99s_shared_memory_is_refused_by_the_choice(run_as):
    run_as("sm_120:65536")
    inputs = {"q": np.zeros((1, 17, 16, 576), np.float32), "kv": np.zeros((1, 2065, 576), np.float32)}
    with pytest.raises(DeviceError, match="no verify_attn/fp32 kernel runs on sm_120 with 65536 B"):
        get_op("verify_attn").kernel_choice("fp32", inputs, {})


def kernel(name):
    return next(k for k in cuda_kernels() if k.name == name)


@pytest.mark.parametrize("value,present,name,runs", [
    ("sm_90", Gpu(80, 108, 166912), "bf16_wgmma2", False),   # wgmma is sm_90 code
    ("sm_80", Gpu(120, 188, SMEM_99K), "bf16_mma", False),   # 166,144 B on a 99 KB GPU
    ("sm_120", Gpu(90, 132, 232448), "bf16_mma99", True),    # the H200 as a 99 KB GPU
    ("sm_80", Gpu(90, 132, 232448), "bf16_mma", True),
    ("sm_120", Gpu(80, 108, 166912), "bf16_mma99", True),
])
def test_a_choice_the_present_gpu_cannot_run_is_refused_in_one_line(run_as, monkeypatch, value, present, name, runs):
    run_as(value)
    monkeypatch.setattr(Gpu, "present", staticmethod(lambda: present))
    k = kernel(name)
    if runs:
        k.require_present()
        return
    with pytest.raises(DeviceError) as err:
        k.require_present()
    message = str(err.value)
    assert "\n" not in message and f"KDTREE_GPU={parse_run_as(value).label} picks {name}" in message
    assert f"this GPU is sm_{present.arch}" in message


def test_the_record_names_the_gpu_it_ran_as(run_as):
    from kdtr.records.report import record_meta

    run_as(None)
    assert "ran_as" not in record_meta("verify")
    run_as("sm_120")
    assert record_meta("verify")["ran_as"].startswith("sm_120 (101376 B) on ")


# -- kdtree build: what is compiled for which arch -------------------------------------------------

@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "sm_120a"])
def test_build_compiles_a_kernel_only_where_its_launch_can_pick_it(arch):
    for p in placements(arch):
        k = kernel(p.kernel)
        if p.applicable:
            assert p.why_not == "" and p.compile_arch.startswith(arch.removesuffix("a"))
            assert p.compile_arch.endswith("a") == (bool(k.arch_feature) or arch.endswith("a"))
        else:
            assert p.why_not and not p.serves
        assert p.dynamic_shared_bytes == (k.smem or None)


def test_sm_80_no_longer_builds_the_sm_90_kernels():
    """The bug of issue 28: `kdtree build --arch sm_80` compiled fp32_bf16x3 (cp.async.bulk) and failed."""
    places = {p.kernel: p for p in placements("sm_80")}
    assert not places["fp32_bf16x3"].applicable and not places["bf16_wgmma2"].applicable
    assert places["bf16_mma"].serves == ("verify_attn/bf16_paged",)
    assert places["fp32_ffma99"].serves == ("verify_attn/fp32",)
    assert not places["fp32_dmma"].applicable        # mma.m16n8k4.f64 is sm_90 code (and 228,592 B)


@pytest.mark.parametrize("arch", ["sm_86", "sm_89", "sm_120", "sm_121"])
@pytest.mark.parametrize("variant,kernel", [("bf16_paged", "bf16_mma99"), ("fp32", "fp32_ffma99")])
def test_99k_archs_serve_both_variants_within_their_shared_memory(arch, variant, kernel):
    served = [p for p in placements(arch) if p.serves == (f"verify_attn/{variant}",)]
    assert [p.kernel for p in served] == [kernel]
    assert served[0].dynamic_shared_bytes + 64 <= SMEM_99K


def test_kdtree_build_sm_80_json_lists_serves_and_not_applicable(tmp_path):
    """A real subprocess: exit 0 (it was 2), JSON with the per-kernel placement (compiles sm_80 only)."""
    done = run_kdtree("build", "--arch", "sm_80", "--json", "-", cwd=ROOT, timeout=600,
                      env=kdtree_env("KDTREE_GPU", KDTREE_CACHE_DIR=str(tmp_path / "cache")))
    if done.returncode == 2 and "NVRTC cannot be loaded" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    modules = {m["kernel"]: m for m in json.loads(done.stdout)["modules"]}
    assert modules["bf16_mma"]["serves"] == ["verify_attn/bf16_paged"]
    assert modules["bf16_mma"]["dynamic_shared_bytes"] == 166144 and modules["bf16_mma"]["resources"]
    assert modules["fp32_bf16x3"]["applicable"] is False and "sm_90" in modules["fp32_bf16x3"]["not_applicable"]
    assert modules["fp32_ffma99"]["serves"] == ["verify_attn/fp32"] and modules["fp32_ffma99"]["resources"]
    assert all(r["spill_stores"] == 0 for r in modules["fp32_ffma99"]["resources"])


def test_records_run_as_another_gpu_say_so_in_bench_and_compare():
    from dataclasses import replace

    from cli.bench_view import _header
    from kdtr.bench.regression import compare_records

    from tests.bench.fakes import record

    native = record()
    proxy = replace(native, meta={**native.meta, "ran_as": "sm_120 (101376 B) on NVIDIA H200"})
    assert any("ran as sm_120 (101376 B) on NVIDIA H200" in line for line in _header(proxy))
    assert not any("ran as" in line for line in _header(native))
    notes = compare_records(native, proxy).notes
    assert "run as different GPUs: itself vs sm_120 (101376 B) on NVIDIA H200" in notes
    assert not any("run as" in n for n in compare_records(native, native).notes)


def test_doctor_names_the_gpu_run_as(run_as):
    from kdtr.records.doctor import facts

    run_as("sm_89")
    assert facts()["run_as"] == "sm_89 (101376 B)"
    run_as(None)
    assert facts()["run_as"] is None
