"""tree_build's numpy reference: the DDTree paper's Algorithm 1 with a lazy heap, fp64 path scores in
a fixed operation order, exact ties broken by the lexicographically smaller rank tuple; and the
drafter's log-softmax and top-K the generator (and kdtree e2e) draw the inputs with."""

from __future__ import annotations

import heapq

import numpy as np


def log_softmax_f32(logits: np.ndarray) -> np.ndarray:
    """fp32 log-probs, computed in float64 and rounded once (same bytes on any CPU's SIMD path)."""
    x = logits.astype(np.float64)
    peak = x.max(axis=-1, keepdims=True)
    lse = peak + np.log(np.exp(x - peak).sum(axis=-1, keepdims=True))
    return (x - lse).astype(np.float32)


def top_k(logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k along the last axis, descending; equal log-probs: lower token id first."""
    order = np.argsort(-logp, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(logp, order, axis=-1), order.astype(np.int32)


def build_one(topk_logp: np.ndarray, budget: int) -> list[tuple[tuple[int, ...], int, float]]:
    """Pop order of one request's tree: (rank tuple, parent node, score) per non-root node."""
    depth_count, k = topk_logp.shape
    lp = [[float(v) for v in row] for row in topk_logp]          # exact f32 -> f64
    heap = [(-lp[0][0], (0,), 0)]                                 # (-score, ranks, parent)
    nodes = []
    while heap and len(nodes) < budget:
        neg_score, ranks, parent = heapq.heappop(heap)
        score = -neg_score
        nodes.append((ranks, parent, score))
        node = len(nodes)
        depth, rank = len(ranks), ranks[-1]
        if rank + 1 < k:
            sibling = (score - lp[depth - 1][rank]) + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling, ranks[:-1] + (rank + 1,), parent))
        if depth < depth_count:
            heapq.heappush(heap, (-(score + lp[depth][0]), ranks + (0,), node))
    return nodes


def reference(variant, inputs, params) -> dict[str, np.ndarray]:
    """Every request's tree by `build_one`, padded to Q = budget + 1 (docs/ops/tree_build.md)."""
    topk_logp, topk_ids = inputs["topk_logp"], inputs["topk_ids"]
    batch = topk_logp.shape[0]
    q = int(params["budget"]) + 1
    out = {name: np.full((batch, q), -1, np.int32) for name in
           ("tokens", "parents", "depths", "positions", "ranks")}
    out["scores"] = np.full((batch, q), -np.inf, np.float64)
    out["visibility"] = np.zeros((batch, q, q), np.uint8)
    out["num_nodes"] = np.zeros(batch, np.int32)
    for b in range(batch):
        nodes = build_one(topk_logp[b], q - 1)
        out["tokens"][b, 0] = inputs["root_token"][b]
        out["depths"][b, 0] = 0
        out["positions"][b, 0] = inputs["start"][b]
        out["scores"][b, 0] = 0.0
        out["visibility"][b, 0, 0] = 1
        out["num_nodes"][b] = len(nodes)
        for n, (ranks, parent, score) in enumerate(nodes, start=1):
            depth = len(ranks)
            out["tokens"][b, n] = topk_ids[b, depth - 1, ranks[-1]]
            out["parents"][b, n] = parent
            out["depths"][b, n] = depth
            out["positions"][b, n] = inputs["start"][b] + depth
            out["ranks"][b, n] = ranks[-1]
            out["scores"][b, n] = score
            out["visibility"][b, n] = out["visibility"][b, parent]
            out["visibility"][b, n, n] = 1
    return out
