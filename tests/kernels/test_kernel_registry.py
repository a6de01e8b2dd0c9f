"""The kernel registry (every op's `kernels`) against kernels/README.md and the sources, and the
launch's choice per kernel on faked GPUs: every kernel that is not experimental is picked somewhere."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kdtr.errors import DeviceError
from kdtr.gpus import GPU_MODELS
from kdtr.ops import cuda_kernels, get_op
from kdtr.ops.base import H200, Gpu
from kdtr.ops.tree_build.cuda import sorted_shared_bytes
from kdtr.ops.placement import gpu_for

from .emulator import EMULATED_KERNELS

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
B200 = Gpu(arch=100, sms=148, smem_optin=232448)
A100 = Gpu(arch=80, sms=108, smem_optin=166912)
RTX_5090 = Gpu(arch=120, sms=170, smem_optin=101376)
RTX_PRO_6000 = gpu_for("sm_120")
DGX_SPARK = gpu_for("sm_121")
L40S = gpu_for("sm_89")
A10 = gpu_for("sm_86")


def readme_rows() -> dict[str, dict[str, str]]:
    """kernels/README.md's kernel table, name -> column -> cell."""
    lines = (KERNELS_DIR / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| kernel |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells["kernel"]] = cells
    return rows


def test_the_readme_table_is_the_registry():
    rows = readme_rows()
    registered = {k.name: k for k in cuda_kernels()}
    assert set(rows) == set(registered)
    for name, k in registered.items():
        row = rows[name]
        assert (row["op/variant"], row["role"], row["serves"], row["file"], row["entry"]) == \
            (f"{k.op}/{k.variant}", k.role, k.serves, k.source, k.entry), name


def test_every_kernel_is_its_file_and_entry():
    """file = kernels/<op>_<name>.cu, holding the entry symbol <op>_<name> (and nothing else is a .cu)."""
    for k in cuda_kernels():
        assert k.source == f"{k.op}_{k.name}.cu" and k.entry == f"{k.op}_{k.name}"
        text = (KERNELS_DIR / k.source).read_text()
        assert re.search(rf"^{k.entry}\(", text, re.MULTILINE), f"{k.source} has no entry {k.entry}"
    assert {p.name for p in KERNELS_DIR.glob("*.cu")} == {k.source for k in cuda_kernels()}


def test_kernel_names_are_unique_across_ops():
    names = [k.name for k in cuda_kernels()]
    assert len(names) == len(set(names))


def fp32(batch, heads, prefix, q_len=17):
    return {"q": np.zeros((batch, q_len, heads, 576), np.float32),
            "kv": np.zeros((batch, prefix + q_len, 576), np.float32)}


def paged(batch, heads, prefix, q_len=17):
    return {"q": np.zeros((batch * q_len, heads, 576), np.uint16),
            "kv_indptr": np.arange(batch + 1, dtype=np.int32) * prefix,
            "kv_indices": np.zeros(batch * prefix, np.int32), "tree_slots": np.zeros(batch * q_len, np.int32)}


def tree(batch, depth, k):
    return {"topk_logp": np.zeros((batch, depth, k), np.float32)}


# (op, variant, inputs, params, gpu, kernel the launch picks); why each is picked: kernels/README.md
CHOICES = [
    ("verify_attn", "fp32", fp32(1, 16, 2048), {}, H200, "fp32_bf16x3"),     # 17 tiles x 7 splits = 119 blocks
    ("verify_attn", "fp32", fp32(1, 16, 2048), {}, B200, "fp32_bf16x3"),     # 17 x 8 = 136 of 148
    ("verify_attn", "fp32", fp32(4, 16, 8192), {}, H200, "fp32_bf16x3"),     # 68 tiles x 7 splits (wave model)
    ("verify_attn", "fp32", fp32(1, 16, 16), {}, H200, "fp32_dmma"),         # too few keys to split
    # A100 and 99 KB GPUs: neither fp32 tensor-core kernel runs there (sm_90 code, 228 KB)
    ("verify_attn", "fp32", fp32(1, 16, 2048), {}, A100, "fp32_ffma99"),
    ("verify_attn", "fp32", fp32(1, 16, 16), {}, RTX_PRO_6000, "fp32_ffma99"),
    ("verify_attn", "fp32", fp32(4, 16, 8192), {}, L40S, "fp32_ffma99"),
    ("verify_attn", "bf16_paged", paged(8, 64, 8192, 33), {}, H200, "bf16_wgmma2"),
    ("verify_attn", "bf16_paged", paged(8, 64, 8192, 33), {}, B200, "bf16_mma"),   # no wgmma there
    ("verify_attn", "bf16_paged", paged(1, 16, 100), {}, A100, "bf16_mma"),
    # 99 KB GPUs: bf16_mma (166,144 B) does not fit; TP8 serving shapes (8 heads a GPU)
    ("verify_attn", "bf16_paged", paged(8, 8, 8192, 33), {}, RTX_PRO_6000, "bf16_mma99"),
    ("verify_attn", "bf16_paged", paged(1, 8, 21, 9), {}, RTX_5090, "bf16_mma99"),
    ("verify_attn", "bf16_paged", paged(32, 8, 4096, 65), {}, DGX_SPARK, "bf16_mma99"),
    ("verify_attn", "bf16_paged", paged(4, 16, 2048, 17), {}, L40S, "bf16_mma99"),
    ("verify_attn", "bf16_paged", paged(4, 16, 2048, 17), {}, A10, "bf16_mma99"),
    ("tree_build", "default", tree(64, 15, 64), {"budget": 64}, H200, "sorted"),
    ("tree_build", "default", tree(1, 64, 512), {"budget": 512}, H200, "warp"),   # table > 227 KB
    ("tree_build", "default", tree(1, 24, 1024), {"budget": 1024}, H200, "smem"),
    ("tree_build", "default", tree(64, 15, 64), {"budget": 64}, RTX_PRO_6000, "sorted"),   # fits 99 KB
    ("tree_build", "default", tree(1, 32, 512), {"budget": 512}, L40S, "warp"),   # table > 99 KB
    ("tree_accept", "default", {"tokens": np.zeros((4, 300), np.int32)}, {}, H200, "walk"),
]


@pytest.mark.parametrize("op,variant,inputs,params,gpu,expect", CHOICES,
                         ids=[f"{c[5]}-{c[4].arch}" for c in CHOICES])
def test_the_launch_picks(op, variant, inputs, params, gpu, expect):
    assert get_op(op).kernel_choice(variant, inputs, params, gpu) == expect


def test_the_warp_case_is_past_the_sorted_table():
    """The warp row above: sorted's table would not fit the H200, so the choice is about the table."""
    assert sorted_shared_bytes(512, 64, 512) + 64 > H200.smem_optin >= sorted_shared_bytes(64, 15, 64) + 64


def test_every_kernel_that_is_not_experimental_is_picked_somewhere():
    picked = {c[5] for c in CHOICES}
    assert {k.name for k in cuda_kernels() if k.role != "experimental"} == picked


@pytest.mark.parametrize("variant,inputs,gpu", [("fp32", fp32(1, 16, 2048), Gpu(75, 40, 65536)),
                                               ("fp32", fp32(1, 16, 2048), Gpu(80, 108, 65536)),
                                               ("bf16_paged", paged(1, 16, 100), Gpu(80, 108, 65536))])
def test_no_kernel_for_the_gpu_is_a_device_error(variant, inputs, gpu):
    with pytest.raises(DeviceError, match=f"no verify_attn/{variant} kernel runs on sm_{gpu.arch}"):
        get_op("verify_attn").kernel_choice(variant, inputs, {}, gpu)


def test_without_a_gpu_the_choice_is_the_h200s(monkeypatch):
    from kdtr.config import config
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    monkeypatch.delenv("KDTREE_GPU", raising=False)
    config.cache_clear()
    assert Gpu.here() == H200


def test_the_warp_case_on_99k_is_past_the_sorted_table():
    assert sorted_shared_bytes(512, 32, 512) + 64 > L40S.smem_optin >= sorted_shared_bytes(64, 15, 64) + 64


# -- kernels/README.md's GPU table ------------------------------------------------------------------

GPU_COLUMNS = {"tree_build": ("tree_build", "default"), "verify_attn fp32": ("verify_attn", "fp32"),
               "verify_attn bf16_paged": ("verify_attn", "bf16_paged"), "tree_accept": ("tree_accept", "default")}
VERIFIED_ARCHS = {90}        # the only GPU our tests and benches ran on (results/): the H200
NOT_VERIFIED_BUT_COMPILED = "compile-checked"
# run through the CPU emulator by tests/kernels/test_emulated_kernels.py (compiled for every arch by CI)
EMULATED = "emulated"


def gpu_table() -> list[dict[str, str]]:
    lines = (KERNELS_DIR / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| GPU |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def table_archs(cell: str) -> list[int]:
    return [int(a) for a in re.findall(r"sm_(\d+)", cell)]


def test_the_gpu_table_names_every_architecture_of_the_gpu_models():
    assert sorted(a for row in gpu_table() for a in table_archs(row["arch, shared memory a block"])) == \
        sorted(GPU_MODELS)


@pytest.mark.parametrize("row", gpu_table(), ids=lambda r: r["GPU"])
def test_each_gpu_table_cell_is_what_the_launch_picks(row):
    """Cell = `k1, k2: verified` / `...: emulated` / `...: compile-checked` (the kernels kernels_serving
    gives for that arch at its usual limit; emulated where every one of them runs on the CPU emulator),
    or `none: why` where no kernel serves the variant there."""
    for arch in table_archs(row["arch, shared memory a block"]):
        gpu = gpu_for(f"sm_{arch}")
        assert f"{gpu.smem_optin:,} B" in row["arch, shared memory a block"]
        for column, (op, variant) in GPU_COLUMNS.items():
            names, _, status = row[column].partition(": ")
            serving = get_op(op).kernels_serving(variant, gpu)
            if not serving:
                assert names == "none", (row["GPU"], column)
                continue
            assert names.split(", ") == list(serving), (row["GPU"], column)
            expect = ("verified" if arch in VERIFIED_ARCHS else EMULATED if set(serving) <= set(EMULATED_KERNELS)
                      else NOT_VERIFIED_BUT_COMPILED)
            assert status == expect, (row["GPU"], column)


@pytest.mark.parametrize("arch", sorted(GPU_MODELS))
def test_the_serving_sets_are_the_choices_above(arch):
    """kernels_serving (what the table and `kdtree build` show) agrees with the concrete choices of
    CHOICES for that arch: every kernel chosen there is in the set."""
    gpu = gpu_for(f"sm_{arch}")
    for op, variant, inputs, params, choice_gpu, expect in CHOICES:
        if (choice_gpu.arch, choice_gpu.smem_optin) == (gpu.arch, gpu.smem_optin):
            assert expect in get_op(op).kernels_serving(variant, gpu), (arch, expect)
