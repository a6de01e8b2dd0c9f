"""tree_build's and tree_accept's honest variants and mutants for the mutation suite.

Both ops are exact (every output compared bit for bit), so any output a mutant changes is beyond
the honest error (0). Each mutant is the op's reference algorithm with one plausible kernel bug,
written out here with a switch per bug (the reference itself stays untouched); the honest
variants are the torch backend at 1, 2 and all threads."""

from __future__ import annotations

import functools
import heapq

import numpy as np

from kdtr.impl.base import HOST, Implementation, Serves
from kdtr.ops import get_op
from tests.mutation import torch_at_thread_counts

TREE_BUILD, TREE_ACCEPT = get_op("tree_build"), get_op("tree_accept")


def honest(op) -> list[Implementation]:
    return torch_at_thread_counts(Serves(op.name))


def _host(op, name: str, compute, bug: str, doc: str) -> Implementation:
    return Implementation(name, (Serves(op.name),),
                          lambda _op, variant, inputs, params: functools.partial(compute, inputs, params, bug),
                          device=HOST, doc=doc)


# -- tree_build ---------------------------------------------------------------------------

BUILD_BUGS = {
    "tie_other_way": "exact ties popped larger rank tuple first",
    "sibling_same_rank": "a node's sibling scored with its own rank's log-prob, not the next",
    "parent_off_by_one": "parents stored one past the node they name",
    "position_off_by_one": "positions = start + depth - 1",
    "depth_zero_based": "depths stored from 0 for the root's children",
    "rank_one_based": "ranks stored from 1",
    "token_wrong_depth": "tokens read from the next depth's top-k ids",
    "visibility_no_self": "a node does not see itself",
    "visibility_parent_only": "a node sees its parent, not all its ancestors",
    "budget_one_short": "one node fewer than the budget",
    "scores_fp32": "path scores summed in float32",
    "padding_zero": "unused slots hold 0, not -1 / -inf",
}


def build(inputs, params, bug: str | None) -> dict[str, np.ndarray]:
    """tree_build's reference (Algorithm 1 with a lazy heap) with `bug` switched on."""
    lp_all, ids = inputs["topk_logp"], inputs["topk_ids"]
    batch, depth_count, k = lp_all.shape
    q = int(params["budget"]) + 1
    pad = 0 if bug == "padding_zero" else -1
    out = {name: np.full((batch, q), pad, np.int32) for name in ("tokens", "parents", "depths", "positions", "ranks")}
    out["scores"] = np.full((batch, q), 0.0 if bug == "padding_zero" else -np.inf)
    out["visibility"] = np.zeros((batch, q, q), np.uint8)
    out["num_nodes"] = np.zeros(batch, np.int32)
    real = np.float32 if bug == "scores_fp32" else float
    for b in range(batch):
        lp = [[real(v) for v in row] for row in lp_all[b]]
        order = (lambda ranks: tuple(-r for r in ranks)) if bug == "tie_other_way" else (lambda ranks: ranks)
        heap = [(-lp[0][0], order((0,)), (0,), 0)]
        nodes = []
        budget = q - 1 - (bug == "budget_one_short" and q > 1)
        while heap and len(nodes) < budget:
            neg, _, ranks, parent = heapq.heappop(heap)
            score = -neg
            nodes.append((ranks, parent, score))
            node, depth, rank = len(nodes), len(ranks), ranks[-1]
            if rank + 1 < k:
                step = rank if bug == "sibling_same_rank" else rank + 1
                sibling = (score - lp[depth - 1][rank]) + lp[depth - 1][step]
                heapq.heappush(heap, (-sibling, order(ranks[:-1] + (rank + 1,)), ranks[:-1] + (rank + 1,), parent))
            if depth < depth_count:
                heapq.heappush(heap, (-(score + lp[depth][0]), order(ranks + (0,)), ranks + (0,), node))
        out["tokens"][b, 0] = inputs["root_token"][b]
        out["depths"][b, 0] = 0
        out["positions"][b, 0] = inputs["start"][b]
        out["scores"][b, 0] = 0.0
        out["visibility"][b, 0, 0] = 1
        out["num_nodes"][b] = len(nodes)
        for n, (ranks, parent, score) in enumerate(nodes, start=1):
            depth = len(ranks)
            out["tokens"][b, n] = ids[b, min(depth, depth_count - 1) if bug == "token_wrong_depth" else depth - 1, ranks[-1]]
            out["parents"][b, n] = parent + 1 if bug == "parent_off_by_one" else parent
            out["depths"][b, n] = depth - 1 if bug == "depth_zero_based" else depth
            out["positions"][b, n] = inputs["start"][b] + depth - (bug == "position_off_by_one")
            out["ranks"][b, n] = ranks[-1] + (bug == "rank_one_based")
            out["scores"][b, n] = score
            if bug == "visibility_parent_only":
                out["visibility"][b, n, parent] = 1
            else:
                out["visibility"][b, n] = out["visibility"][b, parent]
            out["visibility"][b, n, n] = 0 if bug == "visibility_no_self" else 1
    return out


# -- tree_accept --------------------------------------------------------------------------

ACCEPT_BUGS = {
    "bonus_off_by_one": "the bonus token read from the node after the last accepted one",
    "bonus_of_parent": "the bonus token read at the last accepted node's parent",
    "length_without_root": "accept_len counts the root out",
    "padding_zero": "unused accept slots hold 0, not -1",
    "tokens_from_targets": "accept_tokens read from target_ids",
    "leaf_never_accepted": "the walk stops before a node with no children",
    "parent_ignored": "a target matched against any later node's token, whatever its parent",
    "parent_off_by_one": "children found through parents[node] - 1",
    "first_32_nodes_only": "only the first 32 nodes searched (one register chunk)",
    "root_token_left_out": "accept_tokens start at the first accepted child",
    "target_by_depth": "the next target read at the walk's depth, not at the node",
}


def accept(inputs, params, bug: str | None) -> dict[str, np.ndarray]:
    """tree_accept's reference walk with `bug` switched on."""
    tokens, parents, target = inputs["tokens"], inputs["parents"], inputs["target_ids"]
    batch, q = tokens.shape
    pad = 0 if bug == "padding_zero" else -1
    out = {"accept_len": np.zeros(batch, np.int32), "bonus": np.zeros(batch, np.int32),
           "accept_nodes": np.full((batch, q), pad, np.int32), "accept_tokens": np.full((batch, q), pad, np.int32)}
    for b in range(batch):
        children: dict[int, list[int]] = {}
        searched = range(1, min(q, 32) if bug == "first_32_nodes_only" else q)
        for node in searched:
            parent = int(parents[b, node]) - (bug == "parent_off_by_one")
            if parents[b, node] >= 0:
                children.setdefault(parent, []).append(node)
        path, cur = [0], 0
        nxt = int(target[b, 0])
        while True:
            pool = [n for n in searched if n > cur] if bug == "parent_ignored" else children.get(cur, [])
            match = next((n for n in pool if int(tokens[b, n]) == nxt), None)
            if match is None or (bug == "leaf_never_accepted" and match not in children):
                break
            cur = match
            path.append(cur)
            nxt = int(target[b, len(path) - 1 if bug == "target_by_depth" else cur])
        if bug == "bonus_off_by_one":
            nxt = int(target[b, min(cur + 1, q - 1)])
        elif bug == "bonus_of_parent" and len(path) > 1:
            nxt = int(target[b, path[-2]])
        out["accept_len"][b] = len(path) - (bug == "length_without_root")
        out["bonus"][b] = nxt
        out["accept_nodes"][b, :len(path)] = path
        source = target if bug == "tokens_from_targets" else tokens
        picked = source[b, path[1:]] if bug == "root_token_left_out" else source[b, path]
        out["accept_tokens"][b, :len(picked)] = picked
    return out


def mutants(op) -> list[Implementation]:
    compute, bugs = (build, BUILD_BUGS) if op is TREE_BUILD else (accept, ACCEPT_BUGS)
    return [_host(op, name, compute, name, doc) for name, doc in bugs.items()]
