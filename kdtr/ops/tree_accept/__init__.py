"""tree_accept: the greedy walk down a draft tree with the target's predictions (docs/ops/tree_accept.md).

The op's contract is here; the numpy reference is in `reference`, the torch backend in
`torch_impl`, the kernel and its launch in `cuda`.
"""

from __future__ import annotations

import numpy as np

from .._common import LeadingRequests, inline_array, name_from, rng_for
from ..base import Case, Generated, Op, Param, Tolerance
from ..tree_build import OP as TREE_BUILD
from . import cuda, torch_impl
from .reference import reference

OUTPUT_DTYPES = {"accept_len": "i32", "accept_nodes": "i32", "accept_tokens": "i32", "bonus": "i32"}
MODES = ("mixed", "none", "full", "partial", "random")


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
    kernels = cuda.KERNELS
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
        return reference(variant, inputs, params)

    def tolerances(self, variant):
        # Integer outputs of a discrete walk: any difference is a bug.
        return {name: Tolerance(exact=True) for name in self.outputs}

    def output_specs(self, variant, inputs, params):
        batch, q = inputs["tokens"].shape
        return {"accept_len": ("i32", (batch,)), "accept_nodes": ("i32", (batch, q)),
                "accept_tokens": ("i32", (batch, q)), "bonus": ("i32", (batch,))}

    # -- backends -------------------------------------------------------------------------
    def run_torch(self, variant, inputs, params):
        return torch_impl.run_torch(variant, inputs, params)

    def run_cuda(self, variant, inputs, params, outputs, *, kernel=None, defines=None):
        """One warp per request (cuda.run_cuda). `defines` may not override TA_CHUNKS (the launch's sizing)."""
        cuda.run_cuda(self, variant, inputs, params, outputs, kernel, defines)

    # -- reports --------------------------------------------------------------------------
    def describe(self, variant, inputs, params):
        batch, q = inputs["tokens"].shape
        return {"B": batch, "Q": q}


OP = TreeAccept()
