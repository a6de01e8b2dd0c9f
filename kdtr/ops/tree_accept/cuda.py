"""tree_accept's CUDA binding: the kernel registry (kernels/README.md is its table) and the launch,
one warp per request: the tree in registers (TA_CHUNKS nodes per lane) up to Q = 32 *
REGISTER_CHUNKS_MAX (3 registers per chunk), in shared memory beyond."""

from __future__ import annotations

from ctypes import c_int

from ...runtime.device import get_kernel
from ..base import CudaKernel

REGISTER_CHUNKS_MAX = 8

KERNELS = (CudaKernel(op="tree_accept", variant="default", name="walk", role="default", threads=128,
                      serves=f"every shape: the tree in registers up to Q = {32 * REGISTER_CHUNKS_MAX}, "
                             "in shared memory beyond"),)


def run_cuda(op, variant, inputs, params, outputs, kernel=None, defines=None) -> None:
    """One warp per request, up to 4 per block; node c in lane c % 32, register c / 32 (or in
    shared memory for large trees). `defines` may not override TA_CHUNKS (the launch's sizing)."""
    entry = op.cuda_kernel(kernel or op.kernel_choice(variant, inputs, params), variant)
    batch, q = inputs["tokens"].shape
    chunks = -(-q // 32)                                # one cubin per chunk count
    if chunks > REGISTER_CHUNKS_MAX:
        chunks = 0
    per_warp = q * (8 if chunks else 16)                # tokens, path (+ parents, targets)
    warps = max(1, min(entry.threads // 32, (48 << 10) // per_warp))
    args = [inputs["tokens"], inputs["parents"], inputs["target_ids"], c_int(batch), c_int(q),
            outputs["accept_len"], outputs["accept_nodes"], outputs["accept_tokens"], outputs["bonus"]]
    get_kernel(entry.source, entry.entry, defines={**(defines or {}), "TA_CHUNKS": chunks}).launch(
        -(-batch // warps), (32, warps), args, shared_mem=warps * per_warp)
