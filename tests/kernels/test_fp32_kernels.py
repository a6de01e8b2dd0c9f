"""The warp-specialised fp32 kernels (kernels/verify_attn_fp32_dmma.cu, verify_attn_fp32_bf16x3.cu) on
the CPU: the host's launch figures against each kernel's layout, their builds, and the fp32 launch
choice (fp32_dmma's arithmetic model and the timing-shape grids: tests/kernels/test_fp32_models.py;
fp32_bf16x3's split: tests/kernels/test_fp32_bf16x3.py). Their results are checked on the GPU by
tests/kernels/test_cuda_kernels.py (every registered kernel)."""
from __future__ import annotations

import numpy as np
import pytest

from kdtr.runtime import nvrtc
from kdtr.errors import CompileError
from kdtr.ops import get_op
from kdtr.ops.base import H200, Gpu
from kdtr.ops.verify_attn.cuda import PIECES_BLOCK, PIECES_SPLIT

OP = get_op("verify_attn")
PREFIX = {"fp32_dmma": "FD", "fp32_bf16x3": "FX"}   # each .cu's macro prefix (FD_SMEM_BYTES, FX_THREADS, ...)


@pytest.mark.parametrize("name", PREFIX)
def test_host_launch_figures_equal_the_kernels(name, cache_dir):
    """*_EXPECT_SMEM / *_EXPECT_THREADS make the .cu #error out unless they equal its layout: a host
    figure that drifted would launch with too little shared memory (the kernel traps then) or the
    wrong warps."""
    k, p = OP.cuda_kernel(name, "fp32"), PREFIX[name]
    assert k.runs_on(H200)
    nvrtc.compile_kernel(k.source, "sm_90", defines={f"{p}_EXPECT_SMEM": k.smem, f"{p}_EXPECT_THREADS": k.threads})
    with pytest.raises(CompileError, match=f"{p}_SMEM_BYTES differs"):
        nvrtc.compile_kernel(k.source, "sm_90", defines={f"{p}_EXPECT_SMEM": k.smem - 8})
    with pytest.raises(CompileError, match=f"{p}_THREADS differs"):
        nvrtc.compile_kernel(k.source, "sm_90", defines={f"{p}_EXPECT_THREADS": k.threads - 32})


def test_host_pieces_figures_equal_the_kernels(cache_dir):
    """run_cuda launches fp32_bf16x3's pieces kernel with PIECES_SPLIT blocks a tile of PIECES_BLOCK
    threads and sizes its buffer by `pieces` bytes a tile: FX_EXPECT_PIECES makes the .cu #error out
    unless those equal its FX_PIECES_SPLIT, FX_CH and FX_TILE_BYTES (a drift would leave rows unsplit)."""
    k = OP.cuda_kernel("fp32_bf16x3", "fp32")
    figures = k.pieces * 1000000 + PIECES_SPLIT * 1000 + PIECES_BLOCK
    nvrtc.compile_kernel(k.source, "sm_90", defines={"FX_EXPECT_PIECES": figures})
    with pytest.raises(CompileError, match="pieces kernel"):
        nvrtc.compile_kernel(k.source, "sm_90", defines={"FX_EXPECT_PIECES": figures + 1})


@pytest.mark.parametrize("arch,qreg", [("sm_90a", 1), ("sm_100a", 1), ("sm_90", 0), ("sm_120a", 0)])
def test_score_warps_hold_q_where_setmaxnreg_exists(arch, qreg, cache_dir):
    """run_cuda builds fp32_bf16x3 for the device's arch-specific target (arch_feature "a"): on sm_90a
    and sm_100a that takes the setmaxnreg path (Q in the score warps' registers, a fourth K slot);
    elsewhere the portable one."""
    k = OP.cuda_kernel("fp32_bf16x3", "fp32")
    assert k.arch_feature == "a"
    nvrtc.compile_kernel(k.source, arch, defines={"FX_EXPECT_QREG": qreg})
    with pytest.raises(CompileError, match="FX_QREG"):
        nvrtc.compile_kernel(k.source, arch, defines={"FX_EXPECT_QREG": 1 - qreg})


def test_register_split_must_fill_the_launch(cache_dir):
    """setmaxnreg moves registers between warpgroups; the four budgets must add up to what the
    launch gave them (4 x 128): the .cu refuses a split that does not."""
    k = OP.cuda_kernel("fp32_bf16x3", "fp32")
    nvrtc.compile_kernel(k.source, "sm_90a", defines={"FX_NREG_O": 120, "FX_NREG_S": 192, "FX_NREG_SM": 80})
    with pytest.raises(CompileError, match="add up"):
        nvrtc.compile_kernel(k.source, "sm_90a", defines={"FX_NREG_O": 120, "FX_NREG_S": 200, "FX_NREG_SM": 80})


BUILDS = ([("fp32_dmma", "sm_90", d) for d in ({"FD_DIAG": 1}, {"FD_DIAG": 2}, {"FD_PROFILE": 1})]
          + [("fp32_bf16x3", arch, d) for arch in ("sm_90a", "sm_100a", "sm_120a")   # as run_cuda builds it
             for d in ({}, {"FX_DIAG": 1}, {"FX_DIAG": 2})])


@pytest.mark.parametrize("name,arch,defines", BUILDS)
def test_builds_without_spills(name, arch, defines, cache_dir):
    k = OP.cuda_kernel(name, "fp32")
    r = nvrtc.compile_kernel(k.source, arch, defines=defines).resource(k.entry)
    assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), r


