"""verify_attn's float64 references: numpy per request (the goldens), torch on a device (bench)."""

from __future__ import annotations

import numpy as np

from .layouts import LATENT, LAYOUTS, ROW, dense_keys

REFERENCE_CHUNK = 1 << 23                    # float64 score elements per reference block (64 MB)
REFERENCE_DEVICE_BYTES = 2 << 30             # float64 scores per chunk of the device reference


def attend_reference(q: np.ndarray, keys: np.ndarray, prefix_len: int, visibility: np.ndarray,
                     sm_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One request in float64: q [Q, H, 576], keys [P + Q, 576] -> out [Q, H, 512], lse [Q, H].

    Both products are float64 matrix products (BLAS, on every core: an einsum over these shapes
    ran on one core at ~5 GFLOP/s); the softmax works in place on one block of scores at a time,
    and only the tree's columns are masked (every row sees the whole prefix)."""
    nq, heads, _ = q.shape
    keys = keys.astype(np.float64)
    values = keys[:, :LATENT]
    hidden = ~visibility.astype(bool)                      # [Q, Q]: tree columns a row may not see
    out = np.empty((nq, heads, LATENT))
    lse = np.empty((nq, heads))
    rows_per_chunk = max(1, REFERENCE_CHUNK // max(1, keys.shape[0] * heads))
    for lo in range(0, nq, rows_per_chunk):
        hi = min(nq, lo + rows_per_chunk)
        rows = q[lo:hi].astype(np.float64).reshape((hi - lo) * heads, ROW)
        scores = np.matmul(rows, keys.T).reshape(hi - lo, heads, keys.shape[0])
        scores *= sm_scale
        np.copyto(scores[:, :, prefix_len:], -np.inf, where=hidden[lo:hi, None, :])
        peak = scores.max(axis=-1, keepdims=True)
        weights = np.exp(np.subtract(scores, peak, out=scores), out=scores)
        total = weights.sum(axis=-1, keepdims=True)
        product = np.matmul(weights.reshape((hi - lo) * heads, -1), values).reshape(hi - lo, heads, LATENT)
        out[lo:hi] = product / total
        lse[lo:hi] = (peak + np.log(total))[..., 0]
    return out, lse


def reference(variant, inputs, params) -> dict[str, np.ndarray]:
    layout = LAYOUTS[variant]
    outs, lses = [], []
    for q, keys, prefix_len, visibility in layout.requests(inputs):
        out, lse = attend_reference(q, keys, prefix_len, visibility, float(params["sm_scale"]))
        outs.append(out)
        lses.append(lse)
    # expected outputs at reference precision, stored as f32 for both variants (docs/ops/verify_attn.md)
    return {"out": layout.flat(np.stack(outs)).astype(np.float32),
            "lse": layout.flat(np.stack(lses)).astype(np.float32)}


def dense_reference(variant, inputs, params, chunk_bytes=None):
    """float64 in torch with the reference's math (masked softmax over dense keys), on the inputs'
    device, in chunks of requests and heads whose float64 scores and keys stay under `chunk_bytes`
    (REFERENCE_DEVICE_BYTES): B=128 P=16384 in one chunk gathered 9 GiB of float64 keys."""
    import torch

    layout = LAYOUTS[variant]
    chunk_bytes = chunk_bytes or REFERENCE_DEVICE_BYTES
    batch, q_len, heads, _ = layout.dims(inputs)
    width = layout.longest_prefix(inputs)
    per_head = q_len * (width + q_len) * 8                    # float64 score bytes, one request
    # one request's gathered keys: float64 (and the dense copy) beside the source dtype's gather
    per_request_keys = (width + q_len) * ROW * (2 * 8 + inputs["q"].element_size())
    head_step = max(1, min(heads, chunk_bytes // per_head))
    batch_step = (max(1, chunk_bytes // (per_head * heads + per_request_keys)) if head_step == heads else 1)
    scale = float(params["sm_scale"])
    device = inputs["q"].device
    out = torch.empty((batch, q_len, heads, LATENT), dtype=torch.float32, device=device)
    lse = torch.empty((batch, q_len, heads), dtype=torch.float32, device=device)
    for lo in range(0, batch, batch_step):
        hi = min(batch, lo + batch_step)
        q, keys_prefix, keys_tree, prefix_len, visibility = layout.gather(inputs, lo=lo, hi=hi)
        keys, allowed = dense_keys(keys_prefix.double(), keys_tree.double(), prefix_len, visibility)
        q = q.double().transpose(1, 2)                                             # [n, H, Q, 576]
        n, total = hi - lo, keys.shape[1]
        for h0 in range(0, heads, head_step):
            h1 = min(heads, h0 + head_step)
            rows = q[:, h0:h1].reshape(n, (h1 - h0) * q_len, ROW)
            scores = torch.bmm(rows, keys.transpose(1, 2)).view(n, h1 - h0, q_len, total) * scale
            scores.masked_fill_(~allowed[:, None], -torch.inf)
            part_lse = torch.logsumexp(scores, dim=-1)                        # [n, h, Q]
            weights = scores.sub_(part_lse[..., None]).exp_().view(n, (h1 - h0) * q_len, total)
            part = torch.bmm(weights, keys[..., :LATENT]).view(n, h1 - h0, q_len, LATENT)
            out[lo:hi, :, h0:h1] = part.transpose(1, 2).float()
            lse[lo:hi, :, h0:h1] = part_lse.transpose(1, 2).float()
            del scores, weights, part
    return {"out": layout.flat(out), "lse": layout.flat(lse)}
