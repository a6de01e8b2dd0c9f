"""tree_accept: the greedy walk down a draft tree with the target's predictions (docs/ops/tree_accept.md)."""

from __future__ import annotations

import numpy as np

from .._common import LeadingRequests, inline_array, name_from, rng_for
from ..base import Case, CudaKernel, Generated, Op, Param, Tolerance
from ..tree_build import OP as TREE_BUILD

OUTPUT_DTYPES = {"accept_len": "i32", "accept_nodes": "i32", "accept_tokens": "i32", "bonus": "i32"}
MODES = ("mixed", "none", "full", "partial", "random")


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


def _first_shared_sibling_token(tokens: np.ndarray, parents: np.ndarray,
                                chunk_elements: int = 1 << 20) -> int | None:
    """The first request in which two children of one node carry the same token, or None.

    Works on ~1M elements at a time (a 1 GB bundle must not cost several GB to check): per
    request, key = parent << 32 | token as uint64, each root/padding slot a distinct sentinel
    above every real key, then a sort along the row and a look at neighbours.
    """
    batch, q = tokens.shape
    rows = max(1, chunk_elements // q)
    sentinels = np.uint64(np.iinfo(np.uint64).max) - np.arange(q, dtype=np.uint64)
    for first in range(0, batch, rows):
        par = parents[first:first + rows]
        keys = (par.astype(np.uint64) << np.uint64(32)) | tokens[first:first + rows].astype(np.uint32)
        keys = np.where(par >= 0, keys, sentinels)
        keys.sort(axis=1)
        dup = np.flatnonzero((keys[:, 1:] == keys[:, :-1]).any(axis=1))
        if len(dup):
            return first + int(dup[0])
    return None


class TreeAccept(LeadingRequests, Op):
    name = "tree_accept"
    request_input = "tokens"
    variants = ("default",)
    params = (
        Param("batch", int, 4, 1, 65536, doc="requests B"),
        Param("budget", int, 16, 0, 4096, doc="non-root tree nodes; Q = budget + 1"),
        Param("depth", int, 6, 1, 64, doc="draft depth of the trees"),
        Param("vocab", int, 32, 2, 1 << 20, doc="drafter vocabulary of the trees"),
        Param("sharpness", float, 1.0, 0.0, 1e6, doc="drafter logit scale (chains vs bushes)"),
        Param("mode", str, "mixed", choices=MODES,
              doc="accept none / a whole root-to-leaf path / part of one / random targets; mixed "
                  "draws one per request"),
    )
    inline_inputs = ("tokens", "parents", "target_ids")
    shape_params = ("batch",)
    outputs = tuple(OUTPUT_DTYPES)
    _defaults = {p.name: p.default for p in params}

    def case_name(self, variant, params):
        return name_from(params, [("batch", "b"), ("budget", "n")],
                         [("depth", "l"), ("vocab", "v"), ("sharpness", "s"), ("mode", "")], self._defaults)

    def input_specs(self, variant):
        return {"tokens": "i32", "parents": "i32", "target_ids": "i32"}

    def check_inputs(self, variant, inputs, params):
        tokens = inputs["tokens"]
        if tokens.ndim != 2 or 0 in tokens.shape:
            raise ValueError(f"tokens must be [B, Q] with B, Q >= 1, got {list(tokens.shape)}")
        for name in ("parents", "target_ids"):
            if inputs[name].shape != tokens.shape:
                raise ValueError(f"{name} shape {list(inputs[name].shape)} != tokens {list(tokens.shape)}")
        parents = inputs["parents"]
        node = np.arange(tokens.shape[1])[None, :]
        if np.any(parents[:, 0] != -1) or np.any((parents >= node) | (parents < -1)):
            raise ValueError("parents must be -1 at the root and satisfy -1 <= parents[i] < i")
        # the walk's child is unique only because siblings carry distinct tokens (docs/ops/tree_accept.md)
        if _first_shared_sibling_token(tokens, parents) is not None:
            raise ValueError("two children of one node carry the same token (siblings must be distinct)")

    # -- goldens --------------------------------------------------------------------------
    def estimate_bytes(self, variant, params):
        """The tree_build run its trees come from dominates."""
        return TREE_BUILD.estimate_bytes("default", params)

    def generate(self, case: Case) -> Generated:
        p, inline = case.params, case.inline
        if "tokens" in inline:
            tokens = inline_array(inline, "tokens", np.int32, 2, 1)
            parents = inline_array(inline, "parents", np.int32, 2, tokens.shape[0])
            target = inline_array(inline, "target_ids", np.int32, 2, tokens.shape[0])
            if parents is None or target is None or not (tokens.shape == parents.shape == target.shape):
                raise ValueError("inline tokens, parents and target_ids must all be given, same shape")
            inputs = {"tokens": tokens, "parents": parents, "target_ids": target}
            return Generated(inputs, {"batch": tokens.shape[0], "q": tokens.shape[1]})
        rng = rng_for(case.seed, 1)
        built = TREE_BUILD.real_trees(case.name, case.seed, batch=p["batch"], depth=p["depth"],
                                      vocab=p["vocab"], budget=p["budget"], sharpness=p["sharpness"])
        tokens, parents = built["tokens"], built["parents"]
        target = np.empty_like(tokens)
        for b in range(tokens.shape[0]):
            mode = p["mode"] if p["mode"] != "mixed" else rng.choice(MODES[1:])
            target[b] = self._targets(rng, tokens[b], parents[b], str(mode), p["vocab"])
        inputs = {"tokens": tokens, "parents": parents, "target_ids": target}
        return Generated(inputs, {"batch": p["batch"], "q": tokens.shape[1], "mode": p["mode"]})

    @staticmethod
    def _targets(rng, tokens, parents, mode, vocab):
        """Target predictions that make the walk accept none / all / part of a random path."""
        q = len(tokens)
        target = rng.integers(-vocab, 2 * vocab, size=q, dtype=np.int64).astype(np.int32)
        if mode == "random":
            return target
        kids = {n: [c for c in range(1, q) if parents[c] == n] for n in range(q)}
        path = [0]
        while kids[path[-1]]:
            path.append(int(rng.choice(kids[path[-1]])))
        stop = {"none": 0, "full": len(path) - 1}.get(mode)
        if stop is None:
            stop = int(rng.integers(0, len(path)))
        for i in range(stop):                       # predict the path's next token
            target[path[i]] = tokens[path[i + 1]]
        child_tokens = {int(tokens[c]) for c in kids[path[stop]]}
        miss = int(target[path[stop]])
        while miss in child_tokens:                 # at the stop: a token no child has
            miss += 1
        target[path[stop]] = miss
        return target

    def reference(self, variant, inputs, params):
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

    def tolerances(self, variant):
        # Integer outputs of a discrete walk: any difference is a bug.
        return {name: Tolerance(exact=True) for name in self.outputs}

    def output_specs(self, variant, inputs, params):
        batch, q = inputs["tokens"].shape
        return {"accept_len": ("i32", (batch,)), "accept_nodes": ("i32", (batch, q)),
                "accept_tokens": ("i32", (batch, q)), "bonus": ("i32", (batch,))}

    # -- backends -------------------------------------------------------------------------
    def run_torch(self, variant, inputs, params):
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

    # CUDA binding: the tree in registers (TA_CHUNKS nodes per lane) up to Q = 32 * REGISTER_CHUNKS_MAX
    # (3 registers per chunk), in shared memory beyond.
    REGISTER_CHUNKS_MAX = 8
    kernels = (CudaKernel(op="tree_accept", variant="default", name="walk", role="default", threads=128,
                          serves=f"every shape: the tree in registers up to Q = {32 * REGISTER_CHUNKS_MAX}, "
                                 "in shared memory beyond"),)

    def run_cuda(self, variant, inputs, params, outputs, *, kernel=None, defines=None):
        """One warp per request, up to 4 per block; node c in lane c % 32, register c / 32 (or in
        shared memory for large trees). `defines` may not override TA_CHUNKS (the launch's sizing)."""
        from ctypes import c_int

        from ...runtime.device import get_kernel

        entry = self.cuda_kernel(kernel or self.kernel_choice(variant, inputs, params), variant)
        batch, q = inputs["tokens"].shape
        chunks = -(-q // 32)                                # one cubin per chunk count
        if chunks > self.REGISTER_CHUNKS_MAX:
            chunks = 0
        per_warp = q * (8 if chunks else 16)                # tokens, path (+ parents, targets)
        warps = max(1, min(entry.threads // 32, (48 << 10) // per_warp))
        args = [inputs["tokens"], inputs["parents"], inputs["target_ids"], c_int(batch), c_int(q),
                outputs["accept_len"], outputs["accept_nodes"], outputs["accept_tokens"], outputs["bonus"]]
        get_kernel(entry.source, entry.entry, defines={**(defines or {}), "TA_CHUNKS": chunks}).launch(
            -(-batch // warps), (32, warps), args, shared_mem=warps * per_warp)

    # -- reports --------------------------------------------------------------------------
    def describe(self, variant, inputs, params):
        batch, q = inputs["tokens"].shape
        return {"B": batch, "Q": q}


OP = TreeAccept()
