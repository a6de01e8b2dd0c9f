"""tree_accept's numpy reference: the greedy walk down one request's tree with the target's
predictions, applied to every request."""

from __future__ import annotations

import numpy as np


def walk(tokens: np.ndarray, parents: np.ndarray, target_ids: np.ndarray) -> tuple[list[int], int]:
    """Accepted node indices (root first) and the bonus token of one request."""
    children: dict[int, dict[int, int]] = {}
    for node in range(1, len(tokens)):
        if parents[node] >= 0:
            children.setdefault(int(parents[node]), {})[int(tokens[node])] = node
    path, cur = [0], 0
    nxt = int(target_ids[0])
    while nxt in children.get(cur, {}):
        cur = children[cur][nxt]
        path.append(cur)
        nxt = int(target_ids[cur])
    return path, nxt


def reference(variant, inputs, params) -> dict[str, np.ndarray]:
    """Every request's walk by `walk`, the accepted path padded with -1 to Q (docs/ops/tree_accept.md)."""
    tokens, parents, target = inputs["tokens"], inputs["parents"], inputs["target_ids"]
    batch, q = tokens.shape
    out = {"accept_len": np.zeros(batch, np.int32), "bonus": np.zeros(batch, np.int32),
           "accept_nodes": np.full((batch, q), -1, np.int32),
           "accept_tokens": np.full((batch, q), -1, np.int32)}
    for b in range(batch):
        path, bonus = walk(tokens[b], parents[b], target[b])
        out["accept_len"][b] = len(path)
        out["bonus"][b] = bonus
        out["accept_nodes"][b, :len(path)] = path
        out["accept_tokens"][b, :len(path)] = tokens[b, path]
    return out
