"""A numpy model of a verify_attn kernel, in the kernel's own precision: the base of the mutation
suite's honest variants and of its mutants (tests/mutation/attn.py).

It computes what an fp32 (or bf16-input) kernel computes, in an order it is told: keys in a given
order, the 576 feature dimensions of each dot product in a given order, an online softmax over
blocks of keys (a running max, rescaled sums and accumulators), split over contiguous ranges of
keys and merged with the usual rescale, and for bf16_paged the softmax weights rounded to bf16
before P·V and the output rounded to bf16. `Knobs` say how; a mutant is the same model with one
knob set wrong (or its outputs edited after)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdtr.dtypes import NUMPY_DTYPES
from kdtr.ops.verify_attn.layouts import LATENT, LAYOUTS, ROW

F32 = np.float32


def bf16(x: np.ndarray) -> np.ndarray:
    """Rounded to bf16 (nearest even), back in float32."""
    return x.astype(NUMPY_DTYPES["bf16"]).astype(F32)


def fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(F32)


@dataclass(frozen=True)
class Knobs:
    """How the model computes. Honest settings: any key order, dims order, block and split count.
    The rest are the bugs the mutants switch on (None/False: the right thing)."""

    key_seed: int | None = None         # keys visited in a random order (None: as stored)
    dim_seed: int | None = None         # the dot products' 576 terms summed in a random order
    block: int | None = None            # keys per online-softmax block (None: one block, two-pass)
    splits: int = 1                     # contiguous key ranges, each its own softmax, then merged
    round_p: str | None = None          # "bf16" / "fp16": softmax weights rounded before P·V
    pv_bf16: bool = False               # P·V accumulated in bf16 (each block's sum rounded)
    scale_bf16: bool = False            # sm_scale rounded to bf16
    scores_bf16: bool = False           # scores rounded to bf16 before the softmax
    score_dims: int = ROW               # dims of q·k used (512: the rope dims left out)
    drop_key: int | None = None         # this prefix key (index) left out of every row
    see_sibling: bool = False           # each tree node also sees the next node (mask off by one)
    no_merge_rescale: bool = False      # splits merged without exp(m_s - m)
    no_block_rescale: bool = False      # the accumulator not rescaled when the running max grows
    stale_page: bool = False            # the prefix's second page read from its first page's slots


def _rounded_p(p: np.ndarray, knobs: Knobs, bf16_variant: bool) -> np.ndarray:
    how = knobs.round_p or ("bf16" if bf16_variant else None)
    return bf16(p) if how == "bf16" else fp16(p) if how == "fp16" else p


def attend(q: np.ndarray, keys: np.ndarray, prefix_len: int, visibility: np.ndarray, sm_scale: float,
           knobs: Knobs, bf16_variant: bool) -> tuple[np.ndarray, np.ndarray]:
    """One request: q [Q, H, 576], keys [P + Q, 576] (stored dtype) -> out [Q, H, 512], lse [Q, H]
    (float32; out not yet rounded to the output dtype)."""
    nq, heads, _ = q.shape
    keys = keys.astype(F32)
    n = keys.shape[0]
    seen = np.ones((nq, n), bool)
    seen[:, prefix_len:] = visibility.astype(bool)
    if knobs.see_sibling:
        nxt = np.arange(1, nq + 1).clip(max=nq - 1)
        seen[np.arange(nq), prefix_len + nxt] = True
    if knobs.drop_key is not None and knobs.drop_key < prefix_len:
        seen[:, knobs.drop_key] = False
    page = min(64, prefix_len // 2)
    if knobs.stale_page and page:
        keys = keys.copy()
        keys[page:2 * page] = keys[:page]
    order = np.arange(n) if knobs.key_seed is None else np.random.default_rng(knobs.key_seed).permutation(n)
    dims = np.arange(ROW) if knobs.dim_seed is None else np.random.default_rng(knobs.dim_seed).permutation(ROW)
    if knobs.score_dims < ROW:
        dims = np.arange(knobs.score_dims)
    scale = F32(bf16(np.array([sm_scale], F32))[0] if knobs.scale_bf16 else sm_scale)
    rows = q.reshape(nq * heads, ROW).astype(F32)[:, dims]
    seen_rows = np.repeat(seen, heads, axis=0)                       # [Q*H, n]
    parts = np.array_split(order, knobs.splits)
    pieces = [_softmax_part(rows, keys[part][:, dims], keys[part][:, :LATENT], seen_rows[:, part], scale,
                            knobs, bf16_variant) for part in parts if part.size]
    acc, peak, total = _merge(pieces, knobs.no_merge_rescale)
    out = acc / total[:, None]
    lse = peak + np.log(total)
    return out.reshape(nq, heads, LATENT), lse.reshape(nq, heads)


def _softmax_part(rows, keys, values, seen, scale, knobs: Knobs, bf16_variant: bool):
    """Online softmax over `keys` in blocks: (accumulator [R, 512], running max [R], sum [R])."""
    count = rows.shape[0]
    peak = np.full(count, -np.inf, F32)
    total = np.zeros(count, F32)
    acc = np.zeros((count, LATENT), F32)
    step = knobs.block or max(1, keys.shape[0])
    for lo in range(0, keys.shape[0], step):
        hi = lo + step
        scores = (rows @ keys[lo:hi].T) * scale
        if knobs.scores_bf16:
            scores = bf16(scores)
        scores[~seen[:, lo:hi]] = -np.inf
        new_peak = np.maximum(peak, scores.max(axis=1))
        safe = np.where(np.isfinite(new_peak), new_peak, F32(0))
        alpha = np.exp(np.where(np.isfinite(peak), peak - safe, -np.inf)).astype(F32)
        p = np.exp(scores - safe[:, None]).astype(F32)
        total = total * alpha + p.sum(axis=1, dtype=F32)
        block = _rounded_p(p, knobs, bf16_variant) @ values[lo:hi]
        if knobs.pv_bf16:
            block = bf16(block)
        acc = (acc if knobs.no_block_rescale else acc * alpha[:, None]) + block
        if knobs.pv_bf16:
            acc = bf16(acc)
        peak = new_peak
    return acc, peak, total


def _merge(pieces, no_rescale: bool):
    """Split results merged: m = max m_s, weights exp(m_s - m) (1 where the rescale is forgotten)."""
    peak = np.max([p for _, p, _ in pieces], axis=0)
    acc = np.zeros_like(pieces[0][0])
    total = np.zeros_like(pieces[0][2])
    for part_acc, part_peak, part_total in pieces:
        weight = np.where(np.isfinite(part_peak), np.exp(part_peak - peak), 0).astype(F32)
        if no_rescale:
            weight = np.where(np.isfinite(part_peak), F32(1), F32(0))
        acc = acc + part_acc * weight[:, None]
        total = total + part_total * weight
    return acc, peak, total


def run(variant: str, inputs, params, knobs: Knobs) -> dict[str, np.ndarray]:
    """The model on a case: outputs as the variant stores them (bf16_paged's out rounded to bf16)."""
    layout = LAYOUTS[variant]
    paged = layout.out_dtype == "bf16"
    outs, lses = [], []
    for q, keys, prefix_len, visibility in layout.requests(inputs):
        out, lse = attend(q, keys, prefix_len, visibility, float(params["sm_scale"]), knobs, paged)
        outs.append(out)
        lses.append(lse)
    out = layout.flat(np.stack(outs)).astype(F32)
    return {"out": out.astype(NUMPY_DTYPES["bf16"]) if paged else out,
            "lse": layout.flat(np.stack(lses)).astype(F32)}
