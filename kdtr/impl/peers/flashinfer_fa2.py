"""`flashinfer_fa2`: FlashInfer's BatchPrefillWithPagedKVCacheWrapper (backend "fa2") with a custom
mask at head_dim_qk 576 / head_dim_vo 512, for verify_attn/bf16_paged (FlashInfer's MLA wrappers
take no tree mask, so the generic paged prefill is the one that can run a tree).

Page size 1 over our token pool: request b's pages are its prefix slots then its Q tree slots
(paged_kv_indptr[b] = kv_indptr[b] + b·Q, last_page_len 1); qo_indptr = arange(0, (B+1)·Q, Q); one
KV head; the custom mask is ours as bool (FlashInfer's layout is the same: per request Q rows of
P_b + Q columns, requests in order, prefix columns all 1); k_cache the pool viewed [N, 1, 1, 576]
(NHD), v_cache a contiguous copy of its first 512 columns [N, 1, 1, 512] (made once per case, in
prepare). FlashInfer returns the lse in base 2; ours is the natural log: lse · ln 2.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from . import missing_module, package_version
from ...errors import reason
from ..base import Implementation, Serves
from ...ops.verify_attn.layouts import LATENT, ROW

WORKSPACE_BYTES = 128 << 20            # FlashInfer's float workspace, as its examples size it
BACKEND = "fa2"


# -- (a) conversions ---------------------------------------------------------------------------------

def to_flashinfer(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> tuple[dict, dict]:
    """(plan keyword arguments, run arguments) for docs/ops/verify_attn.md's bf16_paged inputs (torch tensors)."""
    import torch

    q, pool = inputs["q"], inputs["kv_buffer"]
    device = q.device
    kv_indptr = inputs["kv_indptr"].long()
    batch = kv_indptr.numel() - 1
    q_len = inputs["tree_slots"].numel() // batch
    prefix_len = kv_indptr[1:] - kv_indptr[:-1]
    requests = torch.arange(batch + 1, device=device)
    paged_indptr = kv_indptr + requests * q_len
    # page t of request b: its prefix slot t, else its tree slot t - P_b
    total = int(paged_indptr[-1])
    owner = torch.repeat_interleave(torch.arange(batch, device=device), prefix_len + q_len, output_size=total)
    local = torch.arange(total, device=device) - paged_indptr[owner]
    slots = torch.cat([inputs["kv_indices"].long(), inputs["tree_slots"].long()])
    source = torch.where(local < prefix_len[owner], kv_indptr[owner] + local,
                         inputs["kv_indices"].numel() + owner * q_len + local - prefix_len[owner])
    plan = {
        "qo_indptr": (requests * q_len).to(torch.int32),
        "paged_kv_indptr": paged_indptr.to(torch.int32),
        "paged_kv_indices": slots[source].to(torch.int32),
        "paged_kv_last_page_len": torch.ones(batch, dtype=torch.int32, device=device),
        "num_qo_heads": q.shape[1],
        "num_kv_heads": 1,
        "head_dim_qk": ROW,
        "head_dim_vo": LATENT,
        "page_size": 1,
        "custom_mask": inputs["custom_mask"] != 0,
        "causal": False,
        "sm_scale": float(params["sm_scale"]),
        "q_data_type": q.dtype,
        "kv_data_type": pool.dtype,
    }
    k_cache = pool.view(pool.shape[0], 1, 1, ROW)
    run = {"q": q.contiguous(), "paged_kv_cache": (k_cache, pool[:, :LATENT].contiguous().view(pool.shape[0], 1, 1, LATENT))}
    return plan, run


def from_flashinfer(out, lse_base2) -> dict[str, Any]:
    return {"out": out, "lse": lse_base2 * math.log(2.0)}


# -- (b) the call ----------------------------------------------------------------------------------

def _wrapper(device):
    import flashinfer
    import torch

    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=BACKEND)


def _prepare(op, variant, inputs, params):
    plan, run = to_flashinfer(inputs, params)
    wrapper = _wrapper(inputs["q"].device)
    wrapper.plan(**plan)

    def call():
        out, lse = wrapper.run(run["q"], run["paged_kv_cache"], return_lse=True)
        return from_flashinfer(out, lse)
    return call


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """Importable, a GPU, and the configuration compiles and runs: one request, one head, a
    one-token prefix and a two-node tree (FlashInfer JIT-compiles per head-dim pair: a failure here
    names what failed)."""
    from ..builtin import _cuda_probe

    fault = missing_module("flashinfer") or _cuda_probe()
    if fault:
        return fault
    import torch

    try:
        pool = torch.randn(4, ROW, device="cuda").to(torch.bfloat16)
        tiny = {"q": torch.randn(2, 1, ROW, device="cuda").to(torch.bfloat16), "kv_buffer": pool,
                "kv_indptr": torch.tensor([0, 1], dtype=torch.int32, device="cuda"),
                "kv_indices": torch.tensor([3], dtype=torch.int32, device="cuda"),
                "tree_slots": torch.tensor([0, 1], dtype=torch.int32, device="cuda"),
                "custom_mask": torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.uint8, device="cuda"),
                "mask_indptr": torch.tensor([0, 6], dtype=torch.int32, device="cuda")}
        _prepare(None, "bf16_paged", tiny, {"sm_scale": 0.1})()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - what failed is the reason
        return (f"flashinfer {package_version('flashinfer-python')} {BACKEND} paged prefill with a custom "
                f"mask at head_dim_qk {ROW} / head_dim_vo {LATENT} failed: {reason(err)}")
    return None


IMPL = Implementation("flashinfer_fa2", (Serves("verify_attn", "bf16_paged"),), _prepare, probe=_probe,
                      version_info=lambda: {"flashinfer": package_version("flashinfer-python")}, device="cuda",
                      doc="FlashInfer's paged prefill (fa2) with the tree as a custom mask, 576/512 head dims")
