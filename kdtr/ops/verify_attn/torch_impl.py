"""verify_attn in torch: the backend (fp32 math on either layout), what a user writes in bf16, and
the bench baselines built on them (torch.compile, SDPA)."""

from __future__ import annotations

import functools

from ...dtypes import torch_dtype
from .layouts import LATENT, LAYOUTS, ROW, dense_keys

SDPA_MEMORY_FRACTION = 0.85             # of free device memory SDPA's estimated need may take


def run_torch(variant, inputs, params):
    """What a user writes: gather keys, bmm, masked fp32 softmax, bmm (scores materialised)."""
    import torch

    layout = LAYOUTS[variant]
    q, keys_prefix, keys_tree, prefix_len, visibility = layout.gather(inputs)
    q, keys_prefix, keys_tree = q.float(), keys_prefix.float(), keys_tree.float()
    batch, q_len, heads, _ = q.shape
    keys, allowed = dense_keys(keys_prefix, keys_tree, prefix_len, visibility)
    scores = torch.bmm(q.reshape(batch, q_len * heads, ROW), keys.transpose(1, 2))
    scores = scores.view(batch, q_len, heads, -1) * float(params["sm_scale"])
    scores = scores.masked_fill(~allowed[:, :, None, :], -torch.inf)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse[..., None]).view(batch, q_len * heads, -1)
    out = torch.bmm(weights, keys[..., :LATENT]).view(batch, q_len, heads, LATENT)
    return {"out": layout.flat(out).to(torch_dtype(layout.out_dtype)), "lse": layout.flat(lse)}


def attend_torch_bf16(inputs, width: int, sm_scale: float):
    """bf16_paged as a user writes it in bf16 torch: gather the paged bf16 keys, scores = bf16 GEMM
    with fp32 accumulation and fp32 output (torch.bmm(..., out_dtype=torch.float32) on CUDA), masked
    softmax in fp32 (logsumexp, exp), P rounded to bf16, bf16 GEMM for P·V (fp32 accumulation,
    bf16 output). `width` is the longest prefix (host metadata).

    Scores are fp32, not bf16 (the HF-eager habit of a bf16 `q @ k.T`): that is how our kernel and
    FlashAttention-style kernels keep them (the MMA accumulates and stays in fp32), and the op has an
    lse output. bf16 scores carry a rounding of |s|·2^-9 each (~0.01 at this op's logit scale), which
    puts lse ~1e-2 off and every softmax weight up to ~1% off: a different, less precise op, not a
    faster way to compute this one. fp32 scores cost the GEMM nothing (same MMA, fp32 epilogue) and
    the elementwise softmax passes twice the bytes of bf16 ones.
    On the CPU (tests) the score GEMM runs on the upcast inputs: the same math (products of bf16
    values are exact in fp32, sums in fp32)."""
    import torch

    q, keys_prefix, keys_tree, prefix_len, visibility = LAYOUTS["bf16_paged"].gather(inputs, width)
    batch, q_len, heads, _ = q.shape
    keys, allowed = dense_keys(keys_prefix, keys_tree, prefix_len, visibility)        # bf16 as stored
    q = q.reshape(batch, q_len * heads, ROW)
    scores = _score_gemm()(q, keys).view(batch, q_len, heads, -1) * sm_scale
    scores = scores.masked_fill(~allowed[:, :, None, :], -torch.inf)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse[..., None]).to(torch.bfloat16).view(batch, q_len * heads, -1)
    out = torch.bmm(weights, keys[..., :LATENT])                                        # bf16
    return {"out": out.view(batch * q_len, heads, LATENT), "lse": lse.reshape(batch * q_len, heads)}


@functools.lru_cache(maxsize=None)
def _score_gemm():
    """The score GEMM of attend_torch_bf16 (bf16 in, fp32 accumulation and output), kept out of
    torch.compile: Inductor (torch 2.11) fails on bmm's out_dtype, and it would hand this GEMM to
    cuBLAS anyway; the gathers, mask and softmax around it are compiled."""
    import torch

    def gemm(q, keys):
        if q.is_cuda:
            return torch.bmm(q, keys.transpose(1, 2), out_dtype=torch.float32)
        return torch.bmm(q.float(), keys.transpose(1, 2).float())
    return torch.compiler.disable(gemm)


@functools.lru_cache(maxsize=None)
def _compiled_bf16():
    """torch.compile of attend_torch_bf16, made once per process (dynamic shapes)."""
    import torch

    return torch.compile(attend_torch_bf16, dynamic=True)


@functools.lru_cache(maxsize=None)
def _compiled_run_torch(variant: str):
    """torch.compile of run_torch for one variant, made once per process (dynamic shapes)."""
    import logging

    import torch

    torch._logging.set_logs(dynamo=logging.ERROR)    # the graph break at int(prefix_len.max()) is expected
    return torch.compile(functools.partial(run_torch, variant), dynamic=True)


def compiled_prepare(op, variant, inputs, params):
    """torch.compile of run_torch (one compile per variant serves every shape), as a baseline's prepare."""
    return functools.partial(_compiled_run_torch(variant), inputs, params)


def bf16_prepare(op, variant, inputs, params, compiled=False):
    """The bf16 baseline on the case's inputs (a baseline's prepare). The longest prefix is host-side metadata a serving
    engine has (SGLang's max_seq_len), taken once here, untimed; all gathers, the mask, both GEMMs
    and the softmax are in every timed call."""
    import torch

    width = LAYOUTS[variant].longest_prefix(inputs)
    run = _compiled_bf16() if compiled else attend_torch_bf16
    scale = float(params["sm_scale"])
    matmul = torch.backends.cuda.matmul

    def call():
        # fp32 accumulation everywhere: no split-K partial sums rounded to bf16 (torch's default
        # allows them for bf16 GEMMs); restored after the call.
        previous = matmul.allow_bf16_reduced_precision_reduction
        matmul.allow_bf16_reduced_precision_reduction = False
        try:
            return run(inputs, width, scale)
        finally:
            matmul.allow_bf16_reduced_precision_reduction = previous
    return call


def sdpa_prepare(op, variant, inputs, params):
    """SDPA with the tree mask over contiguous KV, the layout built here, untimed (a baseline's prepare)."""
    import torch.nn.functional as F

    layout = LAYOUTS[variant]
    q, keys_prefix, keys_tree, prefix_len, visibility = layout.gather(inputs)
    keys, allowed = dense_keys(keys_prefix, keys_tree, prefix_len, visibility)
    q = q.transpose(1, 2)                                                           # [B, H, Q, 576]
    keys, mask, scale = keys[:, None], allowed[:, None], float(params["sm_scale"])   # one KV head

    def run():
        out = F.scaled_dot_product_attention(q, keys, keys[..., :LATENT], attn_mask=mask, scale=scale,
                                             enable_gqa=True).transpose(1, 2)     # [B, Q, H, 512]
        return {"out": layout.flat(out)}
    return run


def sdpa_skip(variant, inputs):
    """Why SDPA would not fit in device memory here (None: it fits). A bool mask and head dim 576
    send SDPA down its math path, which expands the one latent KV head to H heads in fp32 and
    materialises fp32 scores and weights."""
    free = _device_free_bytes()
    if free is None:
        return None
    batch, q_len, heads, _ = LAYOUTS[variant].dims(inputs)
    keys = LAYOUTS[variant].longest_prefix(inputs) + q_len
    need = (batch * heads * keys * (ROW + LATENT) * 4 + 3 * batch * heads * q_len * keys * 4
            + batch * keys * ROW * inputs["q"].dtype.itemsize)
    if need > SDPA_MEMORY_FRACTION * free:
        return (f"would need ~{need / 1e9:.0f} GB (KV expanded to {heads} heads in fp32, fp32 "
                f"scores); {free / 1e9:.0f} GB free")
    return None


def _device_free_bytes() -> int | None:
    """Bytes a new allocation can have on the GPU: the driver's free memory plus what PyTorch's
    caching allocator holds reserved but unallocated (it hands that out first, and empties it before
    an out-of-memory error). The driver's figure alone counted the cache left by earlier
    implementations as taken: on an H100 76 GiB of it made every later guard refuse."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.mem_get_info()[0]) + int(torch.cuda.memory_reserved()) - int(torch.cuda.memory_allocated())
    except Exception:   # noqa: BLE001 - no usable GPU: no memory estimate
        return None
