"""verify_attn's same-precision control: the op computed as an honest kernel computes it, in float32,
in another summation order (docs/numerics.md).

The keys are visited in a random order (the softmax sum and P·V), the 576 terms of every q·k in a
random order, split over 1, 4 or 16 ranges of keys merged as a split-K kernel merges them (the merge
rounds too), in base e or, as kernels work, in base 2, all in float32; bf16_paged rounds the unnormalised softmax weights to bf16 before P·V
(what a tensor-core kernel does, and what the variant's tolerance allows) and its output to bf16.
How far this lands from the float64 golden is what an honest implementation's reordering costs on
this very case; kdtr.ops.numerics turns it into the gate.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import NUMPY_DTYPES
from .layouts import LATENT, LAYOUTS, ROW
from .reference import REFERENCE_CHUNK

F32 = np.float32
LN2 = F32(np.log(2.0))


def request_control(q: np.ndarray, keys: np.ndarray, prefix_len: int, visibility: np.ndarray,
                    sm_scale: float, round_weights: bool, splits: int, base2: bool,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One request (attend_reference's shapes) in float32, keys and feature dimensions in the orders
    `rng` draws, the keys in `splits` ranges each with its own softmax, merged with the rescale (as
    a split-K kernel merges); `base2`: in base 2 as our kernels and FlashAttention's work (scores
    scaled by sm_scale·log2 e, exp2, lse = ln 2·(m + log2 l)). out [Q, H, 512] (float32, before the
    output's own rounding), lse [Q, H]."""
    nq, heads, _ = q.shape
    order = rng.permutation(keys.shape[0])
    dims = rng.permutation(ROW)
    keys = keys[order].astype(F32)
    scored, values = np.ascontiguousarray(keys[:, dims]), keys[:, :LATENT]
    hidden = np.zeros((nq, keys.shape[0]), bool)
    hidden[:, prefix_len:] = ~visibility.astype(bool)
    hidden = hidden[:, order]
    scale = F32(sm_scale * np.log2(np.e) if base2 else sm_scale)
    exp, log = (np.exp2, np.log2) if base2 else (np.exp, np.log)
    out = np.empty((nq, heads, LATENT), F32)
    lse = np.empty((nq, heads), F32)
    rows_per_chunk = max(1, REFERENCE_CHUNK // max(1, keys.shape[0] * heads))
    bounds = np.linspace(0, keys.shape[0], min(splits, keys.shape[0]) + 1).astype(int)
    for lo in range(0, nq, rows_per_chunk):
        hi = min(nq, lo + rows_per_chunk)
        rows = q[lo:hi].astype(F32).reshape((hi - lo) * heads, ROW)[:, dims]
        scores = (rows @ scored.T).reshape(hi - lo, heads, -1)
        scores *= scale
        np.copyto(scores, -np.inf, where=hidden[lo:hi, None, :])
        peak, total = _split_softmax(scores, bounds, round_weights, exp)     # scores become weights
        product = (scores.reshape((hi - lo) * heads, -1) @ values).reshape(hi - lo, heads, LATENT)
        out[lo:hi] = product / total
        lse[lo:hi] = ((peak + log(total)) * (LN2 if base2 else F32(1)))[..., 0]
    return out, lse


def _split_softmax(scores: np.ndarray, bounds: np.ndarray, round_weights: bool, exp) -> tuple[np.ndarray, np.ndarray]:
    """Each split's softmax of `scores` [r, H, n] (its own max and sum, its weights rounded to bf16
    where asked), rescaled to the common max in place: the merged max [r, H, 1] and sum. One P·V
    over the rescaled weights then gives what the split-K merge of the splits' P·V would."""
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        part = scores[..., a:b]
        part_peak = part.max(axis=-1, keepdims=True)
        exp(np.subtract(part, np.where(np.isfinite(part_peak), part_peak, F32(0)), out=part), out=part)
        parts.append((part, part_peak, part.sum(axis=-1, keepdims=True, dtype=F32)))
    peak = np.max([part_peak for _, part_peak, _ in parts], axis=0)
    total = np.zeros(peak.shape, F32)
    for part, part_peak, part_total in parts:
        rescale = exp(np.where(np.isfinite(part_peak), part_peak - peak, -np.inf)).astype(F32)
        total += part_total * rescale
        if round_weights:
            part[...] = part.astype(NUMPY_DTYPES["bf16"]).astype(F32)
        part *= rescale
    return peak, total


def control(variant, inputs, params, order: int) -> dict[str, np.ndarray]:
    """The control in order `order` (a seed), in the outputs' stored shapes and dtypes: orders 1, 2,
    3 (and so on, cyclically) merge 1, 4 and 16 splits of the keys, the first in base e, the others
    in base 2."""
    layout = LAYOUTS[variant]
    paged = layout.out_dtype == "bf16"
    rng = np.random.default_rng([0x6b647472, int(order)])
    splits = 4 ** ((int(order) - 1) % 3)
    base2 = splits > 1
    outs, lses = [], []
    for q, keys, prefix_len, visibility in layout.requests(inputs):
        out, lse = request_control(q, keys, prefix_len, visibility, float(params["sm_scale"]), paged, splits,
                                   base2, rng)
        outs.append(out)
        lses.append(lse)
    out = layout.flat(np.stack(outs))
    return {"out": out.astype(NUMPY_DTYPES[layout.out_dtype]), "lse": layout.flat(np.stack(lses))}
