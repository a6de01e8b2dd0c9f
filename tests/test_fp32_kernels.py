"""The warp-specialised fp32 kernels (kernels/verify_attn_fp32_dmma.cu, verify_attn_fp32_bf16x3.cu) on
the CPU: the host's launch figures against each kernel's layout, their builds, and the fp32 launch
choice (fp32_dmma's arithmetic model and the timing-shape grids: tests/test_fp32_models.py;
fp32_bf16x3's split: tests/test_fp32_bf16x3.py). Their results are checked on the GPU by
tests/test_cuda_kernels.py (every CUDA_KERNELS entry)."""
from __future__ import annotations

import numpy as np
import pytest

import kdtr.device as device
from kdtr import nvrtc
from kdtr.errors import CompileError
from kdtr.ops import get_op

OP = get_op("verify_attn")
PREFIX = {"fp32_dmma": "FD", "fp32_bf16x3": "FX"}   # each .cu's macro prefix (FD_SMEM_BYTES, FX_THREADS, ...)
H200_OPTIN = 232448                                  # cudaDevAttrMaxSharedMemoryPerBlockOptin on an H100 / H200


@pytest.mark.parametrize("name", PREFIX)
def test_host_launch_figures_equal_the_kernels(name, cache_dir):
    """*_EXPECT_SMEM / *_EXPECT_THREADS make the .cu #error out unless they equal its layout: a host
    figure that drifted would launch with too little shared memory (the kernel traps then) or the
    wrong warps."""
    k, p = OP.CUDA_KERNELS[name], PREFIX[name]
    assert k.smem + 64 <= H200_OPTIN
    nvrtc.compile_kernel(k.source, "sm_90", defines={f"{p}_EXPECT_SMEM": k.smem, f"{p}_EXPECT_THREADS": k.threads})
    with pytest.raises(CompileError, match=f"{p}_SMEM_BYTES differs"):
        nvrtc.compile_kernel(k.source, "sm_90", defines={f"{p}_EXPECT_SMEM": k.smem - 8})
    with pytest.raises(CompileError, match=f"{p}_THREADS differs"):
        nvrtc.compile_kernel(k.source, "sm_90", defines={f"{p}_EXPECT_THREADS": k.threads - 32})


def test_host_pieces_figures_equal_the_kernels(cache_dir):
    """run_cuda launches fp32_bf16x3's pieces kernel with PIECES_SPLIT blocks a tile of PIECES_BLOCK
    threads and sizes its buffer by `pieces` bytes a tile: FX_EXPECT_PIECES makes the .cu #error out
    unless those equal its FX_PIECES_SPLIT, FX_CH and FX_TILE_BYTES (a drift would leave rows unsplit)."""
    k = OP.CUDA_KERNELS["fp32_bf16x3"]
    figures = k.pieces * 1000000 + OP.PIECES_SPLIT * 1000 + OP.PIECES_BLOCK
    nvrtc.compile_kernel(k.source, "sm_90", defines={"FX_EXPECT_PIECES": figures})
    with pytest.raises(CompileError, match="pieces kernel"):
        nvrtc.compile_kernel(k.source, "sm_90", defines={"FX_EXPECT_PIECES": figures + 1})


@pytest.mark.parametrize("arch,qreg", [("sm_90a", 1), ("sm_100a", 1), ("sm_90", 0), ("sm_120a", 0)])
def test_score_warps_hold_q_where_setmaxnreg_exists(arch, qreg, cache_dir):
    """run_cuda builds fp32_bf16x3 for the device's arch-specific target (arch_feature "a"): on sm_90a
    and sm_100a that takes the setmaxnreg path (Q in the score warps' registers, a fourth K slot);
    elsewhere the portable one."""
    k = OP.CUDA_KERNELS["fp32_bf16x3"]
    assert k.arch_feature == "a"
    nvrtc.compile_kernel(k.source, arch, defines={"FX_EXPECT_QREG": qreg})
    with pytest.raises(CompileError, match="FX_QREG"):
        nvrtc.compile_kernel(k.source, arch, defines={"FX_EXPECT_QREG": 1 - qreg})


def test_register_split_must_fill_the_launch(cache_dir):
    """setmaxnreg moves registers between warpgroups; the four budgets must add up to what the
    launch gave them (4 x 128): the .cu refuses a split that does not."""
    k = OP.CUDA_KERNELS["fp32_bf16x3"]
    nvrtc.compile_kernel(k.source, "sm_90a", defines={"FX_NREG_O": 120, "FX_NREG_S": 192, "FX_NREG_SM": 80})
    with pytest.raises(CompileError, match="add up"):
        nvrtc.compile_kernel(k.source, "sm_90a", defines={"FX_NREG_O": 120, "FX_NREG_S": 200, "FX_NREG_SM": 80})


BUILDS = ([("fp32_dmma", "sm_90", d) for d in ({"FD_DIAG": 1}, {"FD_DIAG": 2}, {"FD_PROFILE": 1})]
          + [("fp32_bf16x3", arch, d) for arch in ("sm_90a", "sm_100a", "sm_120a")   # as run_cuda builds it
             for d in ({}, {"FX_DIAG": 1}, {"FX_DIAG": 2})])


@pytest.mark.parametrize("name,arch,defines", BUILDS)
def test_builds_without_spills(name, arch, defines, cache_dir):
    k = OP.CUDA_KERNELS[name]
    r = nvrtc.compile_kernel(k.source, arch, defines=defines).resource(k.main)
    assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), r


BF16X3_SMEM, DMMA_SMEM = OP.CUDA_KERNELS["fp32_bf16x3"].smem, OP.CUDA_KERNELS["fp32_dmma"].smem


def fp32_inputs(batch, heads, prefix, q_len=17):
    """Inputs with the shapes kernel_choice reads (its fill check)."""
    return {"q": np.zeros((batch, q_len, heads, 576), np.float32),
            "kv": np.zeros((batch, prefix + q_len, 576), np.float32)}


@pytest.mark.parametrize("optin,arch,shape,expect", [(H200_OPTIN, "sm_90", (1, 16, 2048), "fp32_bf16x3"),
                                                     (H200_OPTIN, "sm_100", (1, 16, 2048), "fp32_bf16x3"),
                                                     (H200_OPTIN, "sm_90", (4, 16, 8192), "fp32_dmma"),
                                                     (H200_OPTIN, "sm_90", (1, 16, 16), "fp32_dmma"),
                                                     (H200_OPTIN, "sm_89", (1, 16, 2048), "fp32_dmma"),
                                                     (BF16X3_SMEM + 63, "sm_90", (1, 16, 2048), "fp32_dmma"),
                                                     (DMMA_SMEM + 63, "sm_90", (1, 16, 2048), "fp32_gemm"),
                                                     (101376, "sm_120", (1, 16, 2048), "fp32_ffma")])
def test_fp32_launch_picks_the_first_kernel_that_fits(monkeypatch, optin, arch, shape, expect):
    """H100/H200 (227 KB, sm_90, 132 SMs): fp32_bf16x3 where its grid fills 3/4 of the SMs (B=1 H=16
    P=2048: 17 tiles x 7 splits = 119 blocks), fp32_dmma where it does not (B=4 P=8192: 68
    blocks, 683-684 against 582-589 us on an H200, session 8; a short prefix: too few keys to split);
    a GPU with less opt-in shared memory, or without bulk copies (older than sm_90), falls back in
    CUDA_DEFAULTS order."""
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "max_shared_optin", lambda *a: optin)
    monkeypatch.setattr(device, "device_arch", lambda *a: arch)
    monkeypatch.setattr(device, "multiprocessor_count", lambda *a: 132)
    assert OP.kernel_choice("fp32", fp32_inputs(*shape), {}) == expect
