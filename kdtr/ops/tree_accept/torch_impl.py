"""tree_accept's torch backend: the walk vectorised over the batch."""

from __future__ import annotations


def run_torch(variant, inputs, params):
    """The walk vectorised over the batch: each step matches every node at once."""
    import torch

    tokens, parents, target = inputs["tokens"], inputs["parents"], inputs["target_ids"]
    batch, q = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    cur = torch.zeros(batch, dtype=torch.int64, device=tokens.device)
    nxt = target[:, 0].clone()
    going = torch.ones(batch, dtype=torch.bool, device=tokens.device)
    nodes = torch.full((batch, q), -1, dtype=torch.int32, device=tokens.device)
    nodes[:, 0] = 0
    length = torch.ones(batch, dtype=torch.int32, device=tokens.device)
    for step in range(1, q):
        match = (parents == cur[:, None]) & (tokens == nxt[:, None])
        match[:, 0] = False
        going &= match.any(dim=1)
        child = match.to(torch.int8).argmax(dim=1)
        cur = torch.where(going, child, cur)
        nxt = torch.where(going, target[rows, cur], nxt)
        nodes[going, step] = cur[going].to(torch.int32)
        length += going.to(torch.int32)
    accept_tokens = torch.where(nodes >= 0, tokens.gather(1, nodes.clamp(min=0).long()), -1)
    return {"accept_len": length, "accept_nodes": nodes,
            "accept_tokens": accept_tokens.to(torch.int32), "bonus": nxt.to(torch.int32)}
