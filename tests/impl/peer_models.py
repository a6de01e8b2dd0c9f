"""Reference models of the peers' documented semantics, for testing our layout conversions on the CPU.

Each is written from the peer's contract (its docstring, argument list and the kernel's definition of
what it computes), not from our conversion: fed the arguments our adapter builds, it must reproduce
our numpy reference. float64 torch, small cases only.
"""

from __future__ import annotations

import numpy as np
import torch


def _attend(q, keys, values, allowed, sm_scale):
    """q [n, H, D], keys [k, D], values [k, Dv], allowed [n, k] -> out [n, H, Dv], lse [n, H] (float64)."""
    scores = torch.einsum("nhd,kd->nhk", q.double(), keys.double()) * sm_scale
    scores = scores.masked_fill(~allowed[:, None, :], -torch.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("nhk,kd->nhd", torch.exp(scores - lse[..., None]), values.double()), lse


def extend_attention(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                     kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, sm_scale=None,
                     logit_cap=0.0, skip_prefix_custom_mask=True, k_scale=1.0, v_scale=1.0, lse_extend=None):
    """SGLang's extend_attention_fwd: request b's queries q_extend[qo_indptr[b]:qo_indptr[b+1]] attend to
    its prefix (k_buffer/v_buffer rows kv_indices[kv_indptr[b]:kv_indptr[b+1]], scores scaled by k_scale,
    values by v_scale) and its own extend rows (k_extend/v_extend at the same positions as its queries).
    custom_mask (bool, request b at mask_indptr[b], row stride prefix + extend) masks the extend columns,
    and the prefix columns unless skip_prefix_custom_mask; is_causal also hides extend keys after the
    query (the kernel visits extend keys only up to its query block's end: for the lower-triangular
    masks a tree gives, that is the same). Writes o_extend (and lse_extend, natural log)."""
    assert q_extend.is_contiguous() and q_extend.shape[-1] == k_extend.shape[-1] == k_buffer.shape[-1]
    assert v_extend.shape[-1] == v_buffer.shape[-1] == o_extend.shape[-1]
    assert k_extend.shape[1] == k_buffer.shape[1] == 1, "MLA: one latent KV head"
    assert logit_cap == 0.0
    sm_scale = sm_scale or q_extend.shape[-1] ** -0.5
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        p0, p1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        n, prefix = q1 - q0, p1 - p0
        assert n <= max_len_extend
        slots = kv_indices[p0:p1].long()
        keys = torch.cat([k_buffer[slots, 0].double() * k_scale, k_extend[q0:q1, 0].double()])
        values = torch.cat([v_buffer[slots, 0].double() * v_scale, v_extend[q0:q1, 0].double()])
        allowed = torch.ones((n, prefix + n), dtype=torch.bool)
        if custom_mask is not None:
            m0 = int(mask_indptr[b])
            mask = custom_mask[m0:m0 + n * (prefix + n)].view(n, prefix + n).bool()
            allowed[:, prefix:] = mask[:, prefix:]
            if not skip_prefix_custom_mask:
                allowed[:, :prefix] = mask[:, :prefix]
        if is_causal:
            allowed[:, prefix:] &= torch.ones((n, n), dtype=torch.bool).tril()
        out, lse = _attend(q_extend[q0:q1], keys, values, allowed, sm_scale)
        o_extend[q0:q1] = out.to(o_extend.dtype)
        if lse_extend is not None:
            lse_extend[q0:q1] = lse.to(lse_extend.dtype)


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict):
    """sgl-kernel's verify_tree_greedy, one request per row: from node 0, for up to
    accept_index.shape[1] - 1 steps, walk the first-child / next-sibling lists of the current node for
    the child whose candidate equals target_predict at the last accepted node's flat row (retrive_index);
    accept it (predicts[that row] = the token, accept_index[b, k] = the child's flat row); stop when no
    child matches. accept_token_num[b] = accepted children; predicts[last row] = its target prediction."""
    batch, q = candidates.shape
    flat_target = target_predict.reshape(-1)
    for b in range(batch):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, accept_index.shape[1]):
            cur = int(retrive_next_token[b, cur])
            while cur != -1:
                if int(candidates[b, cur]) == int(flat_target[last]):
                    predicts[last] = flat_target[last]
                    accepted += 1
                    accept_index[b, accepted] = int(retrive_index[b, cur])
                    last = int(retrive_index[b, cur])
                    break
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = flat_target[last]


def paged_prefill(plan, q, paged_kv_cache):
    """FlashInfer's BatchPrefillWithPagedKVCacheWrapper.plan + run(return_lse=True), NHD layout: request b's
    queries q[qo_indptr[b]:qo_indptr[b+1]] attend to its KV pages paged_kv_indices[paged_kv_indptr[b]:
    paged_kv_indptr[b+1]] (every page full but the last, which holds paged_kv_last_page_len[b] tokens),
    masked by custom_mask (request b's qo_len x kv_len block follows the previous ones, row-major) or
    causally. Returns (out [n, H, Dv] in q's dtype, lse [n, H] in base 2, f32)."""
    k_cache, v_cache = paged_kv_cache
    page_size = plan["page_size"]
    assert k_cache.shape[1] == v_cache.shape[1] == page_size and k_cache.shape[2] == plan["num_kv_heads"] == 1
    assert k_cache.shape[-1] == plan["head_dim_qk"] and v_cache.shape[-1] == plan["head_dim_vo"]
    assert q.shape[1] == plan["num_qo_heads"] and q.shape[2] == plan["head_dim_qk"]
    qo, indptr, pages = plan["qo_indptr"], plan["paged_kv_indptr"], plan["paged_kv_indices"].long()
    out = torch.empty((q.shape[0], q.shape[1], v_cache.shape[-1]), dtype=q.dtype)
    lse = torch.empty(q.shape[:2], dtype=torch.float32)
    mask_at = 0
    for b in range(qo.numel() - 1):
        q0, q1 = int(qo[b]), int(qo[b + 1])
        own = pages[int(indptr[b]):int(indptr[b + 1])]
        last = int(plan["paged_kv_last_page_len"][b])
        keys = k_cache[own].reshape(-1, k_cache.shape[-1])[: (own.numel() - 1) * page_size + last]
        values = v_cache[own].reshape(-1, v_cache.shape[-1])[: keys.shape[0]]
        n, kv_len = q1 - q0, keys.shape[0]
        if plan.get("custom_mask") is not None:
            allowed = plan["custom_mask"][mask_at:mask_at + n * kv_len].view(n, kv_len).bool()
            mask_at += n * kv_len
        else:
            allowed = torch.ones((n, kv_len), dtype=torch.bool)
            if plan.get("causal"):
                allowed &= torch.ones((n, kv_len), dtype=torch.bool).tril(kv_len - n)
        o, l_nat = _attend(q[q0:q1], keys, values, allowed, plan["sm_scale"])
        out[q0:q1] = o.to(q.dtype)
        lse[q0:q1] = (l_nat / torch.log(torch.tensor(2.0, dtype=torch.float64))).float()
    return out, lse


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):
    """FlashMLA's get_mla_metadata (its pre-2025 interface): (tile_scheduler_metadata, num_splits),
    opaque to the caller and handed back to flash_mla_with_kvcache unchanged."""
    assert cache_seqlens.dtype == torch.int32 and num_heads_k == 1
    return ("tile_scheduler_metadata", num_q_tokens_per_head_k), ("num_splits", cache_seqlens.numel())


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale=None, causal=False, use_legacy=False):
    """FlashMLA's dense decode (flash_mla_interface.py's docstring, tests/ref.py): q [b, s_q, h_q, d],
    k_cache [num_blocks, page_block_size, 1, d], block_table [b, max_blocks] int32, cache_seqlens [b]
    int32. Request i's keys are its first cache_seqlens[i] tokens, token t at row t % page_block_size
    of block block_table[i, t // page_block_size]; values are their first head_dim_v columns. With
    causal, query j sees keys below cache_seqlens[i] − s_q + j + 1 (tril(diagonal = s_k − s_q)).
    Returns out [b, s_q, h_q, head_dim_v] in q's dtype and lse [b, h_q, s_q] float32, natural log."""
    b, s_q, h_q, d = q.shape
    page = k_cache.shape[1]
    assert q.is_contiguous() and k_cache.shape[2] == 1 and k_cache.shape[3] == d and head_dim_v == 512
    assert block_table.dtype == torch.int32 and cache_seqlens.dtype == torch.int32 and block_table.shape[0] == b
    assert tile_scheduler_metadata[1] == s_q * h_q and num_splits[1] == b, "metadata made for another shape"
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    out = torch.empty((b, s_q, h_q, head_dim_v), dtype=q.dtype)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32)
    for i in range(b):
        s_k = int(cache_seqlens[i])
        pages = block_table[i, :-(-s_k // page)].long()
        keys = k_cache[pages, :, 0].reshape(-1, d)[:s_k]
        allowed = torch.ones((s_q, s_k), dtype=torch.bool)
        if causal:
            allowed = allowed.tril(diagonal=s_k - s_q)
        o, l_nat = _attend(q[i], keys, keys[:, :head_dim_v], allowed, scale)
        out[i] = o.to(q.dtype)
        lse[i] = l_nat.T.float()
    return out, lse


def assert_within(op, variant, got, expected, names):
    """Every output within the op's own tolerance (the model rounds once to the output dtype, as the
    contract allows; the tolerances' reasons are in the op)."""
    tolerances = op.tolerances(variant)
    for name in names:
        g = np.asarray(got[name]).astype(np.float64)
        r = np.asarray(expected[name]).astype(np.float64)
        tol = tolerances[name]
        assert np.all(np.abs(g - r) <= tol.atol + tol.rtol * np.abs(r)), name
