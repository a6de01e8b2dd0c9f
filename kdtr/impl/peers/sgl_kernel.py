"""`sgl_kernel`: sgl-kernel's `verify_tree_greedy` for tree_accept, our tree converted to the layout
SGLang's EAGLE path builds (first-child / next-sibling arrays).

Per request b of Q nodes: candidates[b] = tokens[b] (int64), retrive_index[b, i] = b·Q + i (the
node's row in the flattened batch, int64), retrive_next_token[b, i] = i's first child (its lowest
node index; -1 for none), retrive_next_sibling[b, c] = the next child of c's parent by node index
(-1 for none), target_predict[b] = target_ids[b] (int64); root and padding nodes (parent -1) are in
no list. Outputs SGLang allocates: predicts [B·Q] int32, accept_index [B, Q] int32 filled with -1
(Q steps: a path is at most Q nodes long), accept_token_num [B] int32. The kernel accepts, from the
root, the child whose token equals the target's prediction at the last accepted node, and writes:
accept_index[b, k] = the k-th accepted node's flat row (root first), accept_token_num[b] = accepted
nodes excluding the root, predicts[row] = the target's token at each accepted node (the next node's
token, and the bonus at the last one). Ours back: accept_len = accept_token_num + 1, accept_nodes =
accept_index - b·Q (-1 kept), accept_tokens = [root token, predicts at the first τ-1 accepted nodes],
bonus = predicts at the last accepted node.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from . import missing_module, package_version
from ..base import Implementation, Serves

UNSET = -0x21524111                 # predicts entries the kernel does not write keep 0xDEADBEEF


# -- (a) conversions ---------------------------------------------------------------------------------

def first_child_next_sibling(parents):
    """(retrive_next_token, retrive_next_sibling) [B, Q] int64 of a tree given by `parents` [B, Q]
    (root and padding: -1): children linked in node-index order. Vectorised: sort the nodes by
    (parent, index); neighbours with one parent are siblings, the first of each run is the child."""
    import torch

    batch, q = parents.shape
    device = parents.device
    index = torch.arange(q, device=device).expand(batch, q)
    parent = parents.long()
    linked = parent >= 0
    key = torch.where(linked, parent, q) * q + index
    order = key.argsort(dim=1)
    sorted_parent = torch.where(linked, parent, q).gather(1, order)
    next_sibling = torch.full((batch, q), -1, dtype=torch.int64, device=device)
    next_token = torch.full((batch, q), -1, dtype=torch.int64, device=device)
    if q > 1:
        same = (sorted_parent[:, 1:] == sorted_parent[:, :-1]) & (sorted_parent[:, 1:] < q)
        next_sibling.scatter_(1, order[:, :-1], torch.where(same, order[:, 1:], -1))
    run_start = torch.ones_like(sorted_parent, dtype=torch.bool)
    run_start[:, 1:] = sorted_parent[:, 1:] != sorted_parent[:, :-1]
    first = run_start & (sorted_parent < q)
    rows = torch.arange(batch, device=device)[:, None].expand(batch, q)
    next_token[rows[first], sorted_parent[first]] = order[first]
    return next_token, next_sibling


def to_sgl(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """verify_tree_greedy's arguments (by its parameter names) for docs/ops/tree_accept.md's inputs."""
    import torch

    tokens = inputs["tokens"]
    batch, q = tokens.shape
    device = tokens.device
    next_token, next_sibling = first_child_next_sibling(inputs["parents"])
    return {
        "predicts": torch.full((batch * q,), UNSET, dtype=torch.int32, device=device),
        "accept_index": torch.full((batch, q), -1, dtype=torch.int32, device=device),
        "accept_token_num": torch.zeros((batch,), dtype=torch.int32, device=device),
        "candidates": tokens.to(torch.int64),
        "retrive_index": torch.arange(batch * q, dtype=torch.int64, device=device).view(batch, q),
        "retrive_next_token": next_token,
        "retrive_next_sibling": next_sibling,
        "target_predict": inputs["target_ids"].to(torch.int64),
    }


def from_sgl(arguments: Mapping[str, Any], tokens) -> dict[str, Any]:
    """docs/ops/tree_accept.md's outputs from what verify_tree_greedy wrote."""
    import torch

    batch, q = tokens.shape
    device = tokens.device
    rows = arguments["accept_index"].long()                          # flat rows, -1 past the path
    length = arguments["accept_token_num"] + 1
    offset = torch.arange(batch, device=device)[:, None] * q
    nodes = torch.where(rows >= 0, rows - offset, -1).to(torch.int32)
    predicts = arguments["predicts"]
    slot = torch.arange(q, device=device)[None]
    prior = torch.cat([rows.new_zeros((batch, 1)), rows[:, :-1]], dim=1).clamp(min=0)  # node before slot k
    accept_tokens = torch.where(slot == 0, tokens[:, :1], predicts[prior])
    accept_tokens = torch.where(slot < length[:, None], accept_tokens, -1).to(torch.int32)
    last = rows.gather(1, (length.long() - 1).clamp(min=0)[:, None])[:, 0]
    return {"accept_len": length.to(torch.int32), "accept_nodes": nodes, "accept_tokens": accept_tokens,
            "bonus": predicts[last.clamp(min=0)].to(torch.int32)}


# -- (b) the call ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _kernel():
    """sgl_kernel.verify_tree_greedy, or why it cannot be had."""
    fault = missing_module("sgl_kernel")
    if fault:
        return fault
    import sgl_kernel

    fn = getattr(sgl_kernel, "verify_tree_greedy", None)
    return fn if fn is not None else f"sgl_kernel {package_version('sgl-kernel')} has no verify_tree_greedy"


def _probe() -> str | None:
    from ..builtin import _cuda_probe

    got = _kernel()
    return got if isinstance(got, str) else _cuda_probe()


def _prepare(op, variant, inputs, params):
    fn = _kernel()
    arguments = to_sgl(inputs)

    def call():
        fn(**arguments)
        return from_sgl(arguments, inputs["tokens"])
    return call


IMPL = Implementation("sgl_kernel", (Serves("tree_accept", "default"),), _prepare, probe=_probe,
                      version_info=lambda: {"sgl-kernel": package_version("sgl-kernel")}, device="cuda",
                      doc="sgl-kernel's verify_tree_greedy on SGLang's EAGLE first-child/next-sibling layout")
