"""tree_build: the best-first DDTree draft tree from per-depth top-K log-probs (docs/ops/tree_build.md).

The op's contract is here; the numpy reference (the DDTree paper's Algorithm 1 with a lazy heap:
fp64 path scores in a fixed operation order, exact ties broken by the lexicographically smaller
rank tuple) is in `reference`, the torch backend in `torch_impl`, the kernels and their launch in
`cuda`.
"""

from __future__ import annotations

import numpy as np

from .._common import LeadingRequests, inline_array, name_from, rng_for
from ..base import Baseline, BenchRole, Case, Generated, Op, Param, Tolerance
from . import cuda, torch_impl
from .cuda import check_kernel_limits
from .reference import log_softmax_f32, reference, top_k

OUTPUT_DTYPES = {
    "tokens": "i32", "parents": "i32", "depths": "i32", "positions": "i32", "ranks": "i32",
    "scores": "f64", "visibility": "u8", "num_nodes": "i32",
}
AUX_LIMIT_BYTES = 1 << 20   # drafter logits are kept in the bundle (role aux) below this size


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
    kernels = cuda.KERNELS
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
        return reference(variant, inputs, params)

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
        return torch_impl.run_torch(variant, inputs, params)

    def kernel_choice(self, variant, inputs, params, gpu=None):
        """sorted where its log-prob table fits, else warp; smem beyond (cuda.choose)."""
        return cuda.choose(inputs, params, gpu)

    def run_cuda(self, variant, inputs, params, outputs, *, kernel=None, defines=None):
        """`kernel` names an entry of `kernels` (default: kernel_choice); `defines` are extra
        compile-time defines (sorted's TB_FORCE_EXACT, its timing diagnostic TB_PROFILE, which gives
        wrong outputs)."""
        cuda.run_cuda(self, variant, inputs, params, outputs, kernel, defines)

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
