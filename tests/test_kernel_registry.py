"""The kernel registry (every op's `kernels`) against kernels/README.md and the sources, and the
launch's choice per kernel on faked GPUs: every kernel that is not experimental is picked somewhere."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kdtr.errors import DeviceError
from kdtr.ops import cuda_kernels, get_op
from kdtr.ops.base import H200, Gpu
from kdtr.ops.tree_build import sorted_shared_bytes

KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
B200 = Gpu(arch=100, sms=148, smem_optin=232448)
A100 = Gpu(arch=80, sms=108, smem_optin=166912)
RTX_5090 = Gpu(arch=120, sms=170, smem_optin=101376)


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
    ("verify_attn", "bf16_paged", paged(8, 64, 8192, 33), {}, H200, "bf16_wgmma2"),
    ("verify_attn", "bf16_paged", paged(8, 64, 8192, 33), {}, B200, "bf16_mma"),   # no wgmma there
    ("verify_attn", "bf16_paged", paged(1, 16, 100), {}, A100, "bf16_mma"),
    ("tree_build", "default", tree(64, 15, 64), {"budget": 64}, H200, "sorted"),
    ("tree_build", "default", tree(1, 64, 512), {"budget": 512}, H200, "warp"),   # table > 227 KB
    ("tree_build", "default", tree(1, 24, 1024), {"budget": 1024}, H200, "smem"),
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


@pytest.mark.parametrize("variant,inputs,gpu", [("fp32", fp32(1, 16, 2048), A100),
                                               ("fp32", fp32(1, 16, 2048), RTX_5090),
                                               ("bf16_paged", paged(1, 16, 100), RTX_5090)])
def test_no_kernel_for_the_gpu_is_a_device_error(variant, inputs, gpu):
    with pytest.raises(DeviceError, match=f"no verify_attn/{variant} kernel runs on sm_{gpu.arch}"):
        get_op("verify_attn").kernel_choice(variant, inputs, {}, gpu)


def test_without_a_gpu_the_choice_is_the_h200s():
    from kdtr.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    assert Gpu.here() == H200
