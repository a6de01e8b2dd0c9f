"""tree_build: the best-first DDTree draft tree from per-depth top-K log-probs (docs/ops/tree_build.md).

The reference is the DDTree paper's Algorithm 1 with a lazy heap: fp64 path scores in a fixed
operation order, exact ties broken by the lexicographically smaller rank tuple.
"""

from __future__ import annotations

import heapq

import numpy as np

from .._common import LeadingRequests, inline_array, name_from, rng_for
from ..base import Baseline, BenchRole, Case, CudaKernel, Generated, Gpu, Op, Param, Tolerance

OUTPUT_DTYPES = {
    "tokens": "i32", "parents": "i32", "depths": "i32", "positions": "i32", "ranks": "i32",
    "scores": "f64", "visibility": "u8", "num_nodes": "i32",
}
AUX_LIMIT_BYTES = 1 << 20   # drafter logits are kept in the bundle (role aux) below this size
SHARED_MEMORY_LIMIT = 227 * 1024   # bytes of shared memory one block may opt in to on sm_90


def _up16(n: int) -> int:
    return -(-n // 16) * 16


def kernel_shared_bytes(budget: int, depth: int) -> int:
    """Shared memory of the tree_build kernels before staging, as carve() in tree_build_common.cuh
    lays it out: candidates + nodes (40 B per node) and each node's rank path (2 B per depth)."""
    q = budget + 1
    return q * 40 + _up16(q * (depth + 1) * 2)


def sorted_shared_bytes(budget: int, depth: int, k: int) -> int:
    """Shared memory of the sorted kernel (tree_build_sorted.cu): the log-prob table as doubles,
    (L + 2) rows of Kc + 1 (an -inf column and two -inf rows: row L holds the child of a depth-L
    node, row L + 1 is that child's child row, which the pop reads when the child becomes the head
    of an empty list), the token ids [L][Kc], the node records (16 B per node)
    and each node's ancestor-or-self bit mask (ceil(Q / 32) words per node)."""
    q = budget + 1
    kc = min(k, q)
    return (_up16((depth + 2) * (kc + 1) * 8) + _up16(depth * kc * 4) + 16 * q
            + _up16(q * (-(-q // 32)) * 4))


def check_kernel_limits(budget: int, depth: int) -> None:
    """Refuse up front what the kernels cannot hold, naming the limit."""
    need = kernel_shared_bytes(budget, depth)
    if need > SHARED_MEMORY_LIMIT:
        raise ValueError(f"budget {budget} at depth {depth} needs {need} B of shared memory; the tree_build "
                         f"kernel has {SHARED_MEMORY_LIMIT} B on sm_90 (lower the budget or the depth)")


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


class TreeBuild(LeadingRequests, Op):
    name = "tree_build"
    request_input = "topk_logp"
    variants = ("default",)
    params = (
        Param("batch", int, 1, 1, 65536, doc="requests B"),
        Param("depth", int, 4, 1, 64, doc="draft depth L"),
        Param("vocab", int, 64, 1, 1 << 20, doc="drafter vocabulary V"),
        Param("budget", int, 8, 0, 4096, doc="non-root nodes; Q = budget + 1"),
        Param("topk", int, 0, 0, 4096, doc="K per depth; 0 = max(1, min(budget, vocab))"),
        Param("sharpness", float, 1.0, 0.0, 1e6, doc="logit scale: large = chains, small = bushes"),
        Param("quantize", float, 0.0, 0.0, 1e6, doc="round logits to this step (exact ties); 0 = off"),
        Param("max_start", int, 4096, 0, 1 << 30, doc="start positions drawn from [0, max_start]"),
    )
    inline_inputs = ("logits", "probs", "topk_ids", "root_token", "start")
    shape_params = ("batch", "depth")
    outputs = tuple(OUTPUT_DTYPES)
    kernel_params = ("budget",)
    _defaults = {p.name: p.default for p in params}

    def case_name(self, variant, params):
        return name_from(params, [("batch", "b"), ("depth", "l"), ("vocab", "v"), ("budget", "n")],
                         [("topk", "k"), ("sharpness", "s"), ("quantize", "q"), ("max_start", "st")],
                         self._defaults)

    def check_params(self, variant, params):
        if params["topk"] > params["vocab"]:
            raise ValueError(f"topk {params['topk']} exceeds vocab {params['vocab']}")
        check_kernel_limits(params["budget"], params["depth"])

    def input_specs(self, variant):
        return {"topk_logp": "f32", "topk_ids": "i32", "root_token": "i32", "start": "i32"}

    def check_inputs(self, variant, inputs, params):
        lp = inputs["topk_logp"]
        if lp.ndim != 3 or 0 in lp.shape:
            raise ValueError(f"topk_logp must be [B, L, K] with B, L, K >= 1, got {list(lp.shape)}")
        if inputs["topk_ids"].shape != lp.shape:
            raise ValueError(f"topk_ids shape {list(inputs['topk_ids'].shape)} != topk_logp {list(lp.shape)}")
        for name in ("root_token", "start"):
            if inputs[name].shape != lp.shape[:1]:
                raise ValueError(f"{name} shape {list(inputs[name].shape)} != [B] = [{lp.shape[0]}]")
        budget = params["budget"]
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"params.budget must be an integer >= 0, got {budget!r}")
        if not np.all(np.isfinite(lp)):
            raise ValueError("topk_logp holds NaN or Inf")

    # -- goldens --------------------------------------------------------------------------
    def estimate_bytes(self, variant, params):
        """The drafter logits with the log-softmax's and top-k's temporaries (measured: under 7x
        the float32 logits), and the outputs (visibility is [B, Q, Q] bytes)."""
        batch, q_len = params["batch"], params["budget"] + 1
        logits = 4 * batch * params["depth"] * params["vocab"]
        return 8 * logits + batch * q_len * q_len + 8 * 6 * batch * q_len

    def real_trees(self, name: str, seed: int, **params) -> dict[str, np.ndarray]:
        """Trees the reference builds on random drafters: what the other ops' inputs come from."""
        generated = self.generate(Case(name, self.name, "default", seed, dict(self._defaults, **params)))
        return self.reference("default", generated.inputs, generated.params)

    def generate(self, case: Case) -> Generated:
        p, inline = case.params, case.inline
        rng = rng_for(case.seed)
        aux = {}
        if "probs" in inline:
            probs = inline_array(inline, "probs", np.float64, 3, p["batch"])
            if np.any(probs <= 0) or np.any(np.diff(probs, axis=-1) > 0):
                raise ValueError("inline probs must be positive and sorted descending per depth")
            topk_logp = np.log(probs).astype(np.float32)
            ids = inline_array(inline, "topk_ids", np.int32, 3, probs.shape[0])
            if ids is None:
                ids = np.broadcast_to(np.arange(probs.shape[-1], dtype=np.int32), probs.shape).copy()
            if ids.shape != probs.shape:
                raise ValueError(f"inline topk_ids shape {list(ids.shape)} != probs {list(probs.shape)}")
            batch = probs.shape[0]
        else:
            logits = inline_array(inline, "logits", np.float32, 3, p["batch"])
            if logits is None:
                shape = (p["batch"], p["depth"], p["vocab"])
                logits = (rng.standard_normal(shape) * p["sharpness"]).astype(np.float32)
                if p["quantize"] > 0:
                    logits = (np.round(logits / p["quantize"]) * p["quantize"]).astype(np.float32)
            batch, _, vocab = logits.shape
            k = p["topk"] or max(1, min(p["budget"], vocab))
            topk_logp, ids = top_k(log_softmax_f32(logits), min(k, vocab))
            if logits.nbytes <= AUX_LIMIT_BYTES:
                aux["logits"] = logits
        root = inline_array(inline, "root_token", np.int32, 1)
        start = inline_array(inline, "start", np.int32, 1)
        if root is None:
            root = rng.integers(0, max(p["vocab"], 1), size=batch, dtype=np.int32)
        if start is None:
            start = rng.integers(0, p["max_start"] + 1, size=batch, dtype=np.int32)
        inputs = {"topk_logp": np.ascontiguousarray(topk_logp, np.float32),
                  "topk_ids": np.ascontiguousarray(ids, np.int32),
                  "root_token": np.broadcast_to(root, (batch,)).astype(np.int32),
                  "start": np.broadcast_to(start, (batch,)).astype(np.int32)}
        params = {"budget": p["budget"], "batch": batch, "depth": int(topk_logp.shape[1]),
                  "topk": int(topk_logp.shape[2]), "vocab": p["vocab"], "sharpness": p["sharpness"],
                  "quantize": p["quantize"]}
        return Generated(inputs=inputs, params=params, aux=aux)

    def reference(self, variant, inputs, params):
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

    def tolerances(self, variant):
        # Every output is a discrete function of the inputs (fp64 scores in a fixed op order):
        # any difference, a padding -inf included, is a bug.
        return {name: Tolerance(exact=True) for name in self.outputs}

    def output_specs(self, variant, inputs, params):
        batch, q = inputs["topk_logp"].shape[0], int(params["budget"]) + 1
        shapes = {name: (batch, q) for name in OUTPUT_DTYPES}
        shapes["visibility"] = (batch, q, q)
        shapes["num_nodes"] = (batch,)
        return {name: (OUTPUT_DTYPES[name], shapes[name]) for name in OUTPUT_DTYPES}

    # -- backends -------------------------------------------------------------------------
    def run_torch(self, variant, inputs, params):
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
            self._push(score, ranks, parent, valid, has_sibling, slot, sib_score, sib_ranks, par)

            free_rank = (~valid).to(torch.int64).cumsum(dim=1) - 1
            has_child = sel & (depth < depth_count)
            slot = ((free_rank == 0) & ~valid).to(torch.int8).argmax(dim=1)
            d_next = depth.clamp(max=depth_count - 1)
            child_ranks = pick_ranks.clone()
            child_ranks[rows, d_next] = torch.where(depth < depth_count, 0, child_ranks[rows, d_next])
            child_score = s + lp[rows, d_next, 0]
            self._push(score, ranks, parent, valid, has_child, slot, child_score, child_ranks,
                       torch.full_like(par, node))
        out["num_nodes"] = num_nodes
        return out

    @staticmethod
    def _push(score, ranks, parent, valid, mask, slot, new_score, new_ranks, new_parent):
        """Write a candidate into `slot` of the rows where `mask` holds."""
        rows = mask.nonzero()[:, 0]
        score[rows, slot[rows]] = new_score[rows]
        ranks[rows, slot[rows]] = new_ranks[rows]
        parent[rows, slot[rows]] = new_parent[rows]
        valid[rows, slot[rows]] = True

    # CUDA binding: one 256-thread block per request (kernels/README.md).
    REGISTER_BUDGET_MAX = 512           # register-candidate kernels: 32 lanes x 16 slots >= budget
    kernels = (
        CudaKernel(op="tree_build", variant="default", name="sorted", role="default", threads=256,
                   serves=f"budget <= {REGISTER_BUDGET_MAX} where its log-prob table fits shared memory "
                          "(every production shape)"),
        CudaKernel(op="tree_build", variant="default", name="warp", role="fallback", threads=256,
                   serves=f"budget <= {REGISTER_BUDGET_MAX} where sorted's log-prob table does not fit "
                          "(deep trees with a large K)"),
        CudaKernel(op="tree_build", variant="default", name="smem", role="fallback", threads=256,
                   serves=f"budget > {REGISTER_BUDGET_MAX} (more candidates than the register kernels hold)"),
    )

    def kernel_choice(self, variant, inputs, params, gpu=None):
        """The sorted register list up to REGISTER_BUDGET_MAX where its log-prob table fits shared
        memory (1.8x warp at budget 64 on an H200, kernels/NOTES.md), else warp; smem beyond."""
        budget = int(params["budget"])
        if budget > self.REGISTER_BUDGET_MAX:
            return "smem"
        _, depth, k = inputs["topk_logp"].shape
        gpu = gpu or Gpu.here()
        return "sorted" if sorted_shared_bytes(budget, depth, k) + 64 <= gpu.smem_optin else "warp"

    def run_cuda(self, variant, inputs, params, outputs, *, kernel=None, defines=None):
        """`kernel` names an entry of `kernels` (default: kernel_choice); `defines` are extra
        compile-time defines (sorted's TB_FORCE_EXACT, its timing diagnostic TB_PROFILE, which gives
        wrong outputs)."""
        import math
        from ctypes import c_int

        from ...runtime.device import get_kernel, max_shared_optin

        defines = defines or {}
        lp = inputs["topk_logp"]
        batch, depth, k = lp.shape
        budget = int(params["budget"])
        name = kernel or self.kernel_choice(variant, inputs, params)
        entry = self.cuda_kernel(name, variant)
        if name != "smem" and budget > self.REGISTER_BUDGET_MAX:
            raise ValueError(f"{name} holds at most {self.REGISTER_BUDGET_MAX} candidates; budget {budget}")
        q = budget + 1
        check_kernel_limits(budget, depth)
        args = [lp, inputs["topk_ids"], inputs["root_token"], inputs["start"],
                c_int(batch), c_int(depth), c_int(k), c_int(budget)]
        args_out = [outputs[n] for n in ("tokens", "parents", "depths", "positions", "ranks",
                                         "scores", "visibility", "num_nodes")]
        slots = max(1, math.ceil(budget / 32))
        limit = max_shared_optin()
        if name == "sorted":         # 32 x per_lane >= budget slots; the log-prob table must fit
            smem = sorted_shared_bytes(budget, depth, k)
            if smem + 64 > limit:                 # + the static s_num_nodes
                raise ValueError(f"sorted needs {smem} B of shared memory at budget {budget}, depth "
                                 f"{depth}, K {k}; the device has {limit} B")
            get_kernel(entry.source, entry.entry, defines={"TB_NPL": slots, **defines}).launch(
                batch, entry.threads, args + args_out, shared_mem=smem)
            return
        smem = kernel_shared_bytes(budget, depth)
        staged_bytes = 2 * _up16(depth * min(k, q) * 4)          # the log-probs, when they fit
        staged = smem + staged_bytes + 64 <= limit
        smem += staged_bytes if staged else 0
        args += [c_int(int(staged))] + args_out
        if name == "warp":           # capacity 32 x per_lane >= budget (slots in use <= budget): 1..16
            defines = {"TB_NPL": 1 << (slots - 1).bit_length(), **defines}
        get_kernel(entry.source, entry.entry, defines=defines).launch(batch, entry.threads, args, shared_mem=smem)

    # -- reports --------------------------------------------------------------------------
    def describe(self, variant, inputs, params):
        batch, depth, k = inputs["topk_logp"].shape
        return {"B": batch, "L": depth, "K": k, "Q": int(params["budget"]) + 1}


    # -- bench ----------------------------------------------------------------------------
    def baselines(self, variant, inputs, params):
        """The torch backend, and the path the kernel replaces: the per-request CPU heap."""
        cpu_heap = Baseline("cpu_heap", "the heapq reference per request, timed per batch on the host, with the "
                                        "device->host copy of the top-K and the upload of the tree",
                            BenchRole(clock="host"), self._cpu_heap_prepare)
        return (*super().baselines(variant, inputs, params), cpu_heap)

    def _cpu_heap_prepare(self, op, variant, inputs, params):
        from ...dtypes import to_numpy, to_torch

        def run():
            host = {name: to_numpy(tensor) for name, tensor in inputs.items()}
            device = next(iter(inputs.values())).device
            return {name: to_torch(array, device) for name, array in self.reference(variant, host, params).items()}
        return run

OP = TreeBuild()
