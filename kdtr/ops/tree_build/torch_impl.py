"""tree_build's torch backend: best-first selection vectorised over the batch."""

from __future__ import annotations


def run_torch(variant, inputs, params):
    """Best-first selection vectorised over the batch: a candidate table instead of heaps."""
    import torch

    lp = inputs["topk_logp"].to(torch.float64)
    ids = inputs["topk_ids"]
    batch, depth_count, k = lp.shape
    budget = int(params["budget"])
    q, cap, dev = budget + 1, 2 * budget + 1, lp.device
    rows = torch.arange(batch, device=dev)
    score = torch.full((batch, cap), -torch.inf, dtype=torch.float64, device=dev)
    ranks = torch.full((batch, cap, depth_count), -1, dtype=torch.int64, device=dev)
    parent = torch.zeros((batch, cap), dtype=torch.int64, device=dev)
    valid = torch.zeros((batch, cap), dtype=torch.bool, device=dev)
    score[:, 0], ranks[:, 0, 0], valid[:, 0] = lp[:, 0, 0], 0, True

    i32 = dict(dtype=torch.int32, device=dev)
    out = {name: torch.full((batch, q), -1, **i32) for name in
           ("tokens", "parents", "depths", "positions", "ranks")}
    out["scores"] = torch.full((batch, q), -torch.inf, dtype=torch.float64, device=dev)
    out["visibility"] = torch.zeros((batch, q, q), dtype=torch.uint8, device=dev)
    out["tokens"][:, 0] = inputs["root_token"]
    out["depths"][:, 0] = 0
    out["positions"][:, 0] = inputs["start"]
    out["scores"][:, 0] = 0.0
    out["visibility"][:, 0, 0] = 1
    num_nodes = torch.zeros(batch, **i32)

    for node in range(1, q):
        active = valid.any(dim=1)
        best = torch.where(valid, score, -torch.inf).amax(dim=1, keepdim=True)
        tied = valid & (score == best)
        for col in range(depth_count):            # lexicographic tie-break on rank tuples
            col_ranks = torch.where(tied, ranks[:, :, col], torch.iinfo(torch.int64).max)
            tied &= ranks[:, :, col] == col_ranks.amin(dim=1, keepdim=True)
        pick = tied.to(torch.int8).argmax(dim=1)
        pick_ranks = ranks[rows, pick]                                   # [B, L]
        depth = (pick_ranks >= 0).sum(dim=1)                             # 1..L
        rank = pick_ranks.gather(1, (depth - 1).clamp(min=0)[:, None])[:, 0]
        s = score[rows, pick]
        par = parent[rows, pick]
        valid[rows, pick] &= ~active

        sel = active
        out["tokens"][sel, node] = ids[rows, (depth - 1).clamp(min=0), rank.clamp(min=0)][sel]
        out["parents"][sel, node] = par.to(torch.int32)[sel]
        out["depths"][sel, node] = depth.to(torch.int32)[sel]
        out["positions"][sel, node] = (inputs["start"] + depth.to(torch.int32))[sel]
        out["ranks"][sel, node] = rank.to(torch.int32)[sel]
        out["scores"][sel, node] = s[sel]
        vis_row = out["visibility"][rows, par.clamp(min=0)]
        vis_row[:, node] = 1
        out["visibility"][sel, node] = vis_row[sel]
        num_nodes += sel.to(torch.int32)

        free_rank = (~valid).to(torch.int64).cumsum(dim=1) - 1
        d_idx = (depth - 1).clamp(min=0)
        has_sibling = sel & (rank + 1 < k)
        slot = ((free_rank == 0) & ~valid).to(torch.int8).argmax(dim=1)
        sib_score = (s - lp[rows, d_idx, rank.clamp(min=0)]) + lp[rows, d_idx, (rank + 1).clamp(max=k - 1)]
        sib_ranks = pick_ranks.clone()
        sib_ranks[rows, d_idx] = rank + 1
        _push(score, ranks, parent, valid, has_sibling, slot, sib_score, sib_ranks, par)

        free_rank = (~valid).to(torch.int64).cumsum(dim=1) - 1
        has_child = sel & (depth < depth_count)
        slot = ((free_rank == 0) & ~valid).to(torch.int8).argmax(dim=1)
        d_next = depth.clamp(max=depth_count - 1)
        child_ranks = pick_ranks.clone()
        child_ranks[rows, d_next] = torch.where(depth < depth_count, 0, child_ranks[rows, d_next])
        child_score = s + lp[rows, d_next, 0]
        _push(score, ranks, parent, valid, has_child, slot, child_score, child_ranks, torch.full_like(par, node))
    out["num_nodes"] = num_nodes
    return out


def _push(score, ranks, parent, valid, mask, slot, new_score, new_ranks, new_parent):
    """Write a candidate into `slot` of the rows where `mask` holds."""
    rows = mask.nonzero()[:, 0]
    score[rows, slot[rows]] = new_score[rows]
    ranks[rows, slot[rows]] = new_ranks[rows]
    parent[rows, slot[rows]] = new_parent[rows]
    valid[rows, slot[rows]] = True
