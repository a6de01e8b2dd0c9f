"""fp32_dmma (kernels/verify_attn_fp32_dmma.cu) on the CPU: the host's shared-memory figure against the
kernel's layout, its diagnostic builds and the fp32 launch choice (its arithmetic model and timing-shape
grid: tests/test_fp32_models.py). Its results are checked on the GPU by tests/test_cuda_kernels.py
(every CUDA_KERNELS entry)."""
from __future__ import annotations

import pytest

import kdtr.device as device
from kdtr import nvrtc
from kdtr.errors import CompileError
from kdtr.ops import get_op

OP = get_op("verify_attn")
KERNEL = OP.CUDA_KERNELS["fp32_dmma"]
H200_OPTIN = 232448                  # cudaDevAttrMaxSharedMemoryPerBlockOptin on an H100 / H200


def test_host_shared_memory_equals_the_kernels_layout(cache_dir):
    """FD_EXPECT_SMEM makes the .cu #error out unless it equals FD_SMEM_BYTES: a host figure that
    drifted from the layout would launch with too little shared memory (the kernel traps then)."""
    assert KERNEL.smem + 64 <= H200_OPTIN
    nvrtc.compile_kernel("verify_attn_fp32_dmma.cu", "sm_90", defines={"FD_EXPECT_SMEM": KERNEL.smem})
    with pytest.raises(CompileError, match="FD_SMEM_BYTES differs"):
        nvrtc.compile_kernel("verify_attn_fp32_dmma.cu", "sm_90", defines={"FD_EXPECT_SMEM": KERNEL.smem - 8})


@pytest.mark.parametrize("defines", [{"FD_DIAG": 1}, {"FD_DIAG": 2}, {"FD_PROFILE": 1}])
def test_timing_diagnostics_build_without_spills(defines, cache_dir):
    module = nvrtc.compile_kernel("verify_attn_fp32_dmma.cu", "sm_90", defines=defines)
    r = module.resource("verify_attn_fp32_dmma")
    assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), r


@pytest.mark.parametrize("optin,expect", [(H200_OPTIN, "fp32_dmma"), (KERNEL.smem + 63, "fp32_gemm"),
                                          (101376, "fp32_ffma")])
def test_fp32_launch_picks_the_first_kernel_that_fits(monkeypatch, optin, expect):
    """H100/H200 (227 KB): fp32_dmma; a GPU with less opt-in shared memory falls back in order."""
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "max_shared_optin", lambda *a: optin)
    assert OP.kernel_choice("fp32", {}, {}) == expect

