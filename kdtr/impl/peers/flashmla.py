"""`flashmla`: DeepSeek's FlashMLA dense decode (`flash_mla_with_kvcache`, the SM90 kernel SGLang's
`flashmla` attention backend serves MTP / EAGLE verification with), for verify_attn/bf16_paged
cases whose tree is a chain (docs/flashmla.md).

FlashMLA takes no tree mask: with causal=True query i of a request sees its keys below
cache_seqlens − s_q + i + 1, which is our op exactly when the tree is a chain (node i's parent is
i − 1) and the request's keys are its prefix then its tree nodes in order; any other tree is not run,
with that reason. Its cache is paged, 64 tokens a page: where each request's keys already sit in
whole 64-token pages (`slots: pages64`) the pool is viewed as the cache and only the block table is
built; otherwise (a page-size-1 pool) the keys are copied into a fresh paged cache. Both, and the
scheduling metadata, happen in prepare, untimed; the call is one flash_mla_with_kvcache.

FlashMLA returns out [B, s_q, H, 512] in q's dtype and lse [B, H, s_q] in float32, natural log
(FlashMLA's tests/ref.py computes it with torch.logsumexp; its SM90 kernel scales by log2 e
for exp2 and converts back), as ours: only the layout changes, to [B·Q, H, ...].
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from . import missing_module, package_version
from ..base import Implementation, ImplUnavailable, Serves
from ...ops.verify_attn.layouts import LATENT, ROW

PAGE = 64                      # FlashMLA's page_block_size
MODULE = "flash_mla"
DISTRIBUTIONS = ("sgl-flash-mla", "flash-mla", "flash_mla")
SM90 = (9, 0)


# -- (a) conversions ---------------------------------------------------------------------------------

def request_geometry(inputs: Mapping[str, Any]):
    """(B, Q, prefix lengths [B] int64, each request's slots in key order as one [B, W] int64 tensor
    padded with -1, W = the longest P_b + Q)."""
    import torch

    indptr = inputs["kv_indptr"].long()
    batch = indptr.numel() - 1
    q_len = inputs["tree_slots"].numel() // batch
    prefix_len = indptr[1:] - indptr[:-1]
    width = int(prefix_len.max()) + q_len
    cols = torch.arange(width, device=indptr.device)[None]
    from_prefix = indptr[:-1, None] + cols
    from_tree = torch.arange(batch, device=indptr.device)[:, None] * q_len + cols - prefix_len[:, None]
    prefix_slots = inputs["kv_indices"].long()
    tree_slots = inputs["tree_slots"].long()
    in_prefix = cols < prefix_len[:, None]
    in_tree = ~in_prefix & (cols < prefix_len[:, None] + q_len)
    slots = torch.full((batch, width), -1, dtype=torch.long, device=indptr.device)
    if prefix_slots.numel():
        slots = torch.where(in_prefix, prefix_slots[from_prefix.clamp(0, prefix_slots.numel() - 1)], slots)
    slots = torch.where(in_tree, tree_slots[from_tree.clamp(0, tree_slots.numel() - 1)], slots)
    return batch, q_len, prefix_len, slots


def tree_masks(inputs: Mapping[str, Any], batch: int, q_len: int, prefix_len):
    """The tree part of every request's mask, [B, Q, Q] bool."""
    import torch

    rows = torch.arange(q_len, device=prefix_len.device)
    pos = (inputs["mask_indptr"].long()[:batch, None, None] + rows[None, :, None] * (prefix_len + q_len)[:, None, None]
           + prefix_len[:, None, None] + rows[None, None, :])
    return inputs["custom_mask"][pos] != 0


def require_chain(inputs: Mapping[str, Any], batch: int, q_len: int, prefix_len) -> None:
    """ImplUnavailable unless every request's tree is a chain (its mask the causal one)."""
    import torch

    causal = torch.ones((q_len, q_len), dtype=torch.bool, device=prefix_len.device).tril()
    if not bool((tree_masks(inputs, batch, q_len, prefix_len) == causal).all()):
        raise ImplUnavailable("the tree is not a chain: FlashMLA applies only a causal mask "
                              "(query i sees the prefix and tree nodes 0..i)")


def paged_cache(pool, slots, keys):
    """(k_cache [pages, 64, 1, 576], block_table [B, max_pages] int32, copied): the pool itself
    viewed as pages where every request's keys already fill whole 64-token pages in order (the
    block table lists them), else a fresh cache holding request b's keys in pages
    b·max_pages, b·max_pages + 1, ... (the rest zero)."""
    import torch

    batch, width = slots.shape
    max_pages = -(-width // PAGE)
    cols = torch.arange(max_pages * PAGE, device=slots.device)
    padded = torch.full((batch, max_pages * PAGE), -1, dtype=torch.long, device=slots.device)
    padded[:, :width] = slots
    live = cols[None] < keys[:, None]
    first = padded[:, ::PAGE]                                                     # [B, max_pages]
    aligned = (first % PAGE == 0) & (first >= 0)
    expected = first.repeat_interleave(PAGE, dim=1) + (cols % PAGE)[None]
    page_live = live[:, ::PAGE]
    whole = bool(((expected == padded) | ~live).all()) and bool((aligned | ~page_live).all()) \
        and pool.shape[0] % PAGE == 0
    if whole:
        table = torch.where(page_live, first // PAGE, 0).to(torch.int32)
        return pool.view(pool.shape[0] // PAGE, PAGE, 1, ROW), table, False
    cache = pool.new_zeros((batch * max_pages * PAGE, ROW))
    rows = (torch.arange(batch, device=slots.device)[:, None] * (max_pages * PAGE) + cols[None])[live]
    cache[rows] = pool[padded[live]]
    table = (torch.arange(batch * max_pages, device=slots.device, dtype=torch.int32).view(batch, max_pages))
    return cache.view(batch * max_pages, PAGE, 1, ROW), table, True


def to_flashmla(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """flash_mla_with_kvcache's keyword arguments (but the scheduling metadata) for the
    bf16_paged inputs of docs/ops/verify_attn.md (torch tensors) of a chain case; ImplUnavailable for any other tree."""
    import torch

    batch, q_len, prefix_len, slots = request_geometry(inputs)
    require_chain(inputs, batch, q_len, prefix_len)
    keys = prefix_len + q_len
    k_cache, block_table, copied = paged_cache(inputs["kv_buffer"], slots, keys)
    q = inputs["q"]
    return {
        "q": q.reshape(batch, q_len, q.shape[1], ROW).contiguous(),
        "k_cache": k_cache,
        "block_table": block_table,
        "cache_seqlens": keys.to(torch.int32),
        "head_dim_v": LATENT,
        "softmax_scale": float(params["sm_scale"]),
        "causal": True,
        "use_legacy": True,                    # optional: only where the installed signature has it
        "copied": copied,                      # ours, not FlashMLA's: whether prepare copied the keys
    }


def from_flashmla(out, lse) -> dict[str, Any]:
    """out [B, Q, H, 512] -> [B·Q, H, 512]; lse [B, H, Q] (natural log, as ours) -> [B·Q, H]."""
    batch, q_len, heads, _ = out.shape
    return {"out": out.reshape(batch * q_len, heads, LATENT),
            "lse": lse.transpose(1, 2).reshape(batch * q_len, heads)}


def bind(parameters: tuple[str, ...], arguments: Mapping[str, Any], metadata) -> dict[str, Any]:
    """The keyword arguments the installed flash_mla_with_kvcache takes: `use_legacy` only where it
    has it; `metadata` is what get_mla_metadata returned (old API: (tile_scheduler_metadata,
    num_splits); since FlashMLA's 2025 interface: (FlashMLASchedMeta, None))."""
    bound = {n: v for n, v in arguments.items() if n != "copied" and (n != "use_legacy" or n in parameters)}
    bound["tile_scheduler_metadata"], bound["num_splits"] = metadata[0], metadata[1]
    return bound


# -- (b) the call ----------------------------------------------------------------------------------

def _prepare(op, variant, inputs, params):
    flash_mla = importlib.import_module(MODULE)
    arguments = to_flashmla(inputs, params)
    q = arguments["q"]
    metadata = flash_mla.get_mla_metadata(arguments["cache_seqlens"], q.shape[1] * q.shape[2], 1)
    bound = bind(tuple(inspect.signature(flash_mla.flash_mla_with_kvcache).parameters), arguments, metadata)

    def call():
        return Converted(*flash_mla.flash_mla_with_kvcache(**bound))
    return call


class Converted(Mapping):
    """FlashMLA's (out, lse) as our outputs, converted when read (`from_flashmla`), so the timed
    call is FlashMLA's kernel alone: lse's move to [B·Q, H] is a copy, a kernel of its own (~2 µs)
    that a server does not run (SGLang's flashmla backend reads only `out`, whose move is a view)."""

    def __init__(self, out, lse):
        self._raw = (out, lse)
        self._converted = None

    def _outputs(self) -> dict:
        if self._converted is None:
            self._converted = from_flashmla(*self._raw)
        return self._converted

    def __getitem__(self, name):
        return self._outputs()[name]

    def __iter__(self):
        return iter(("out", "lse"))

    def __len__(self):
        return 2


def _probe() -> str | None:
    from ..builtin import _cuda_probe

    fault = missing_module(MODULE) or _cuda_probe()
    if fault:
        return fault
    import torch

    capability = torch.cuda.get_device_capability()
    if tuple(capability) != SM90:
        return f"FlashMLA's dense decode is its SM90 kernel; this GPU is sm_{capability[0]}{capability[1]}"
    return None


def _versions() -> dict:
    found = {d: package_version(d) for d in DISTRIBUTIONS}
    dist = next((d for d, v in found.items() if v), None)
    return {"flash_mla": found[dist] if dist else None, "distribution": dist}


IMPL = Implementation("flashmla", (Serves("verify_attn", "bf16_paged"),), _prepare, probe=_probe,
                      version_info=_versions, device="cuda",
                      doc="FlashMLA's flash_mla_with_kvcache (SM90 dense decode, causal) on chain drafts, "
                          "64-token paged cache")
