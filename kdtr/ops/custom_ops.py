"""Our kernels as torch custom ops, for an engine: one per op/variant, torch tensors in and out.

    import kdtr.ops.custom_ops as kk
    out, lse = kk.verify_attn_bf16_paged(q, kv_buffer, kv_indptr, kv_indices, tree_slots,
                                         custom_mask, mask_indptr, sm_scale)

Each function is `torch.ops.kdtree.<name>` (registered when this module is imported; importing it
queries no device and compiles nothing), with a fake implementation so `torch.compile` traces
through it. A call allocates its outputs (and split-KV workspace) from torch's allocator and
launches on torch's current stream with no host synchronisation, so it can be captured in a CUDA
graph. Warm up once outside the capture: the first call per shape class compiles the kernel
(NVRTC, cubin cache) and loads its module, which a capturing stream does not allow.
Inputs and outputs are docs/ops/'s (names, dtypes, shapes); inputs must be contiguous CUDA tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from ..dtypes import torch_dtype
from . import get_op

Tensor = torch.Tensor


def _empty(op_name: str, variant: str, inputs: dict[str, Any], params: dict[str, Any]) -> list[Tensor]:
    """The op's outputs, allocated like its inputs (shapes from the op's output_specs: they are
    read off the input shapes, so fake tensors and symbolic sizes work)."""
    op = get_op(op_name)
    device = next(iter(inputs.values())).device
    return [torch.empty(shape, dtype=torch_dtype(kind), device=device)
            for kind, shape in op.output_specs(variant, inputs, params).values()]


def _launch(op_name: str, variant: str, inputs: dict[str, Any], params: dict[str, Any]) -> tuple[Tensor, ...]:
    op = get_op(op_name)
    outputs = dict(zip(op.outputs, _empty(op_name, variant, inputs, params)))
    op.run_cuda(variant, inputs, params, outputs)
    return tuple(outputs[name] for name in op.outputs)


def _fake(op_name: str, variant: str, inputs: dict[str, Any], params: dict[str, Any]) -> tuple[Tensor, ...]:
    return tuple(_empty(op_name, variant, inputs, params))


# -- verify_attn -------------------------------------------------------------------------------------

def _bf16_paged(q, kv_buffer, kv_indptr, kv_indices, tree_slots, custom_mask, mask_indptr):
    return {"q": q, "kv_buffer": kv_buffer, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
            "tree_slots": tree_slots, "custom_mask": custom_mask, "mask_indptr": mask_indptr}


@torch.library.custom_op("kdtree::verify_attn_bf16_paged", mutates_args=(), device_types="cuda")
def verify_attn_bf16_paged(q: Tensor, kv_buffer: Tensor, kv_indptr: Tensor, kv_indices: Tensor,
                           tree_slots: Tensor, custom_mask: Tensor, mask_indptr: Tensor,
                           sm_scale: float) -> tuple[Tensor, Tensor]:
    """(out bf16 [B·Q, H, 512], lse f32 [B·Q, H]) of docs/ops/verify_attn.md's bf16_paged."""
    inputs = _bf16_paged(q, kv_buffer, kv_indptr, kv_indices, tree_slots, custom_mask, mask_indptr)
    return _launch("verify_attn", "bf16_paged", inputs, {"sm_scale": sm_scale})


@verify_attn_bf16_paged.register_fake
def _(q, kv_buffer, kv_indptr, kv_indices, tree_slots, custom_mask, mask_indptr, sm_scale):
    inputs = _bf16_paged(q, kv_buffer, kv_indptr, kv_indices, tree_slots, custom_mask, mask_indptr)
    return _fake("verify_attn", "bf16_paged", inputs, {"sm_scale": sm_scale})


@torch.library.custom_op("kdtree::verify_attn_fp32", mutates_args=(), device_types="cuda")
def verify_attn_fp32(q: Tensor, kv: Tensor, prefix_len: Tensor, visibility: Tensor,
                     sm_scale: float) -> tuple[Tensor, Tensor]:
    """(out f32 [B, Q, H, 512], lse f32 [B, Q, H]) of docs/ops/verify_attn.md's fp32."""
    inputs = {"q": q, "kv": kv, "prefix_len": prefix_len, "visibility": visibility}
    return _launch("verify_attn", "fp32", inputs, {"sm_scale": sm_scale})


@verify_attn_fp32.register_fake
def _(q, kv, prefix_len, visibility, sm_scale):
    inputs = {"q": q, "kv": kv, "prefix_len": prefix_len, "visibility": visibility}
    return _fake("verify_attn", "fp32", inputs, {"sm_scale": sm_scale})


# -- tree_build / tree_accept ------------------------------------------------------------------------

@torch.library.custom_op("kdtree::tree_build", mutates_args=(), device_types="cuda")
def tree_build(topk_logp: Tensor, topk_ids: Tensor, root_token: Tensor, start: Tensor,
               budget: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(tokens, parents, depths, positions, ranks, scores, visibility, num_nodes) of docs/ops/tree_build.md's
    tree_build with Q = budget + 1."""
    inputs = {"topk_logp": topk_logp, "topk_ids": topk_ids, "root_token": root_token, "start": start}
    return _launch("tree_build", "default", inputs, {"budget": budget})


@tree_build.register_fake
def _(topk_logp, topk_ids, root_token, start, budget):
    inputs = {"topk_logp": topk_logp, "topk_ids": topk_ids, "root_token": root_token, "start": start}
    return _fake("tree_build", "default", inputs, {"budget": budget})


@torch.library.custom_op("kdtree::tree_accept", mutates_args=(), device_types="cuda")
def tree_accept(tokens: Tensor, parents: Tensor, target_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(accept_len [B], accept_nodes [B, Q], accept_tokens [B, Q], bonus [B]) of docs/ops/tree_accept.md."""
    inputs = {"tokens": tokens, "parents": parents, "target_ids": target_ids}
    return _launch("tree_accept", "default", inputs, {})


@tree_accept.register_fake
def _(tokens, parents, target_ids):
    return _fake("tree_accept", "default", {"tokens": tokens, "parents": parents, "target_ids": target_ids}, {})


OPS = {"verify_attn_bf16_paged": verify_attn_bf16_paged, "verify_attn_fp32": verify_attn_fp32,
       "tree_build": tree_build, "tree_accept": tree_accept}
