"""verify_attn: MLA absorbed tree-verify attention over prefix + tree with the tree's mask (docs/ops/verify_attn.md).

Two layouts share one math: `fp32` (contiguous [B, S, 576] KV, exact FP32) and `bf16_paged`
(SGLang's page-size-1 token pool); `layouts` holds what differs between them. The reference works
in float64 on the stored inputs (`reference`), the torch backend and the bench baselines are in
`torch_impl`, the kernels and their launch in `cuda`.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from ...dtypes import NUMPY_DTYPES
from .._common import fill_normal, name_from, rng_for
from ..base import Baseline, BenchRole, Case, Cost, Generated, Gpu, Op, Param
from ..tree_build import OP as TREE_BUILD
from . import cuda, torch_impl
from .control import control as reordered_control
from .layouts import LATENT, LAYOUTS, ROPE, ROW, check_scale
from .paging import SLOT_LAYOUTS, TREE_SHAPES, chain_visibility
from .reference import REFERENCE_CHUNK, attend_reference, dense_reference, reference
from .torch_impl import attend_torch_bf16

__all__ = ["OP", "LATENT", "ROPE", "ROW", "FLOP_PER_KEY", "KIMI_K2_SCALE", "attend_reference",
           "attend_torch_bf16", "VerifyAttn"]

FLOP_PER_KEY = 2 * ROW + 2 * LATENT          # q·k over 576 dims, p·v over 512, per query row
KIMI_K2_SCALE = 0.14467963                   # 192^-0.5 · (0.1·ln 64 + 1)^2


def request_cost(variant: str, heads: int, prefix_len: np.ndarray, visibility: np.ndarray) -> Cost:
    """The cost model of VerifyAttn.cost: request b's H·Q rows see its P_b prefix keys and the tree
    nodes its Q×Q mask shows them (2176 FLOP each); it moves q, its P_b + Q KV rows, its mask, and
    out and lse (f32)."""
    layout = LAYOUTS[variant]
    batch, q_len = visibility.shape[:2]
    prefixes = int(prefix_len.astype(np.int64).sum())
    query_rows = batch * q_len * heads
    visible_keys = heads * (q_len * prefixes + int(visibility.astype(bool).sum()))
    itemsize = NUMPY_DTYPES[layout.input_specs["q"]].itemsize
    out_bytes = query_rows * (LATENT * NUMPY_DTYPES[layout.out_dtype].itemsize + 4)
    moved = (query_rows + prefixes + batch * q_len) * ROW * itemsize + visibility.size + out_bytes
    return Cost(flops=float(visible_keys * FLOP_PER_KEY), bytes=float(moved))


class VerifyAttn(Op):
    name = "verify_attn"
    variants = tuple(LAYOUTS)
    params = (
        Param("batch", int, 1, 1, 4096, doc="requests B"),
        Param("heads", int, 16, 1, 1024, doc="query heads H (one shared latent KV head)"),
        Param("prefix", int, 128, 0, 1 << 22, doc="cached tokens before the tree (the largest)"),
        Param("prefix_mode", str, "same", choices=("same", "mixed"),
              doc="same: every request has `prefix`; mixed: request 0 has it, others draw from [0, prefix]"),
        Param("budget", int, 8, 0, 4096, doc="tree nodes besides the root; Q = budget + 1"),
        Param("tree", str, "best", choices=TREE_SHAPES,
              doc="best: best-first trees of tree_build's reference on a random drafter; chain: node i's "
                  "parent is i - 1 (MTP / EAGLE topk-1 drafts: a causal mask; depth, sharpness unused)"),
        Param("slots", str, "tokens", choices=SLOT_LAYOUTS,
              doc="bf16_paged pool: tokens: every key in a random slot; pages64: each request's keys in "
                  "64-token pages in random page order (a paged engine's pool)"),
        Param("depth", int, 6, 1, 64, doc="draft depth of the drafter the trees come from"),
        Param("sharpness", float, 1.0, 0.0, 1e6, doc="drafter logit scale (chains vs bushes)"),
        Param("sm_scale", float, KIMI_K2_SCALE, 0.0, 1e3,
              doc="softmax scale: 0.14467963 Kimi K2, 0.13523378 DeepSeek-V3, 0.07216878 no YaRN"),
        Param("scale", float, 0.6, 1e-6, 1e6,
              doc="std of the random q and kv entries; 0.6 gives scores of std ~1.25 (Kimi K2 scale)"),
    )
    outputs = ("out", "lse")
    kernel_params = ("sm_scale",)
    kernels = cuda.KERNELS
    _defaults = {p.name: p.default for p in params}

    def case_name(self, variant, params):
        name = name_from(params, [("batch", "b"), ("heads", "h"), ("prefix", "p"), ("budget", "n")],
                         [("prefix_mode", ""), ("tree", ""), ("slots", ""), ("depth", "l"), ("sharpness", "s"), ("sm_scale", "sc"),
                          ("scale", "x")], self._defaults)
        return f"{variant}_{name}"

    def check_params(self, variant, params):
        if params.get("slots", "tokens") != "tokens" and LAYOUTS[variant].out_dtype == "f32":
            raise ValueError(f"slots {params['slots']!r} is a pool layout: only bf16_paged has a pool "
                             f"({variant} keeps each request's keys contiguous)")

    def input_specs(self, variant):
        return dict(LAYOUTS[variant].input_specs)

    def check_inputs(self, variant, inputs, params):
        """Every index a kernel follows must land inside its buffer."""
        check_scale(params)
        q_len, visibility = LAYOUTS[variant].check(inputs)
        node = np.arange(q_len)
        if np.any(visibility[:, node, node] != 1):
            raise ValueError("every tree row must see itself (visibility diagonal all 1)")
        for b, (queries, keys, _, _) in enumerate(LAYOUTS[variant].requests(inputs)):
            for what, values in (("queries", queries), ("keys", keys)):
                bad = np.argwhere(~np.isfinite(values.astype(np.float32)))   # bf16 too
                if bad.size:
                    raise ValueError(f"request {b}'s {what} hold {len(bad)} NaN or Inf value(s), the first at "
                                     f"{bad[0].tolist()}: the outputs would be NaN (padding that no "
                                     "request reads may hold anything)")

    # -- goldens --------------------------------------------------------------------------
    def trees(self, case: Case) -> dict[str, np.ndarray]:
        """The case's real trees (vocab >= budget and K = budget, so every tree is full)."""
        p = case.params
        return TREE_BUILD.real_trees(case.name, case.seed, batch=p["batch"], depth=p["depth"],
                                     budget=p["budget"], vocab=max(p["budget"], 32), sharpness=p["sharpness"])

    def _draw_requests(self, case: Case) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
        """What `generate` draws before q and the K/V: the prefix lengths [B] (i32) and tree masks
        [B, Q, Q] (u8), with the random stream positioned where the K/V draw starts."""
        p = case.params
        batch, budget = p["batch"], p["budget"]
        rng = rng_for(case.seed, 2)
        if p["tree"] == "chain":
            visibility = chain_visibility(batch, budget + 1)
        else:
            built = self.trees(case)
            if not np.all(built["num_nodes"] == budget):          # K = budget makes every tree full
                raise AssertionError("tree_build produced a tree smaller than its budget")
            visibility = built["visibility"]
        prefix_len = np.full(batch, p["prefix"], np.int32)
        if p["prefix_mode"] == "mixed" and batch > 1:
            prefix_len[1:] = rng.integers(0, p["prefix"] + 1, size=batch - 1)
        return rng, prefix_len, visibility

    def generate(self, case: Case) -> Generated:
        p = case.params
        batch, heads, budget = p["batch"], p["heads"], p["budget"]
        rng, prefix_len, visibility = self._draw_requests(case)
        params = {"sm_scale": p["sm_scale"], "batch": batch, "heads": heads, "prefix": p["prefix"],
                  "budget": budget, "prefix_mode": p["prefix_mode"]}
        scale = np.float32(p["scale"])

        def normal(out):
            return fill_normal(rng, out, scale)

        inputs = LAYOUTS[case.variant].pack(normal, rng, prefix_len, visibility, heads, p["slots"])
        return Generated(inputs, params)

    def estimate_bytes(self, variant, params):
        """The generator's inputs (plus its float32 draw of the KV) and the reference's float64 copy
        of one request's keys, its score blocks and its float64 outputs."""
        batch, heads, prefix, q_len = params["batch"], params["heads"], params["prefix"], params["budget"] + 1
        keys = prefix + q_len
        inputs, draw = LAYOUTS[variant].input_bytes(batch, heads, keys, q_len, params.get("slots", "tokens"))
        block = max(min(q_len * heads * keys, REFERENCE_CHUNK), heads * keys)   # attend_reference's
        reference = 8 * keys * ROW + 2 * keys * ROW + q_len * keys + 3 * 8 * block \
            + 2 * 8 * batch * q_len * heads * (LATENT + 1)
        return inputs + draw + reference

    def run_bytes(self, variant, params, backend):
        """The torch backend on the CPU (torch_impl.run_torch) holds float32 copies of q and of the
        dense per-request keys, and up to four [B, Q, H, P + Q] float32 score tensors at once
        (scores, masked, shifted, exp) with the [B, Q, P + Q] mask: the score tensors dominate.
        Measured on fp32 B=2 H=16 P=8192 budget 63: 349 MB of peak RSS above torch's import, against
        this 446 MB (with verify's twice the bundle): an upper bound, as a refusal needs."""
        if backend != "torch":
            return super().run_bytes(variant, params, backend)
        batch, heads, q_len = params["batch"], params["heads"], params["budget"] + 1
        keys = params["prefix"] + q_len
        return (4 * batch * q_len * heads * ROW + 2 * 4 * batch * keys * ROW
                + 4 * 4 * batch * q_len * heads * keys + batch * q_len * keys)

    def requests(self, variant: str, inputs):
        """Per request: (q [Q, H, 576], keys [P + Q, 576], P, visibility [Q, Q]) in the stored dtype."""
        return LAYOUTS[variant].requests(inputs)

    def reference(self, variant, inputs, params):
        return reference(variant, inputs, params)

    def tolerances(self, variant):
        return dict(LAYOUTS[variant].tolerances)

    def control(self, variant, inputs, params, order):
        """float32 in a random key and feature order; bf16_paged with its weights rounded to bf16
        for P·V (control.py; docs/numerics.md)."""
        return reordered_control(variant, inputs, params, order)

    def output_specs(self, variant, inputs, params):
        return LAYOUTS[variant].output_specs(inputs)

    # -- requests (verify --invariance) ----------------------------------------------------
    def request_count(self, variant, inputs):
        return LAYOUTS[variant].dims(inputs)[0]

    def take_requests(self, variant, inputs, params, indices):
        return LAYOUTS[variant].take(inputs, indices), dict(params) | (
            {"batch": len(indices)} if "batch" in params else {})

    def by_request(self, variant, outputs, batch):
        return {name: LAYOUTS[variant].by_request(array, batch) for name, array in outputs.items()}

    # -- backends -------------------------------------------------------------------------
    def run_torch(self, variant, inputs, params):
        return torch_impl.run_torch(variant, inputs, params)

    def kernel_choice(self, variant, inputs, params, gpu=None):
        """The first kernel of the variant (in `cuda.KERNELS` order) that runs on the GPU and whose
        grid fills its min_fill of the SMs; DeviceError where none runs."""
        return cuda.choose(variant, inputs, gpu)

    def kernels_serving(self, variant, gpu):
        return cuda.serving(variant, gpu)

    def launch_grid(self, variant, inputs, params, kernel):
        """(row tiles, B, KV splits): the split count is the launch's shape-dependent choice."""
        built, _ = cuda.launched_build(self.cuda_kernel(kernel, variant), variant, inputs, None)
        batch, _, _, tiles, splits = cuda.grid(built, inputs, Gpu.here().sms)
        return tiles, batch, splits

    def run_cuda(self, variant, inputs, params, outputs, *, kernel=None, defines=None, splits=None):
        """`kernel` names an entry of `kernels` (default: kernel_choice); `defines` are extra
        compile-time defines of the main kernel (its timing diagnostics; the launch knob SPLITS
        forces the split count); `splits` overrides the split count. Splits come from shapes only
        (no device sync, so this can be graph-captured)."""
        cuda.run_cuda(self, variant, inputs, params, outputs, kernel, splits, defines)

    # -- reports --------------------------------------------------------------------------
    def describe(self, variant, inputs, params):
        batch, q_len, heads, _ = LAYOUTS[variant].dims(inputs)
        return {"B": batch, "H": heads, "Q": q_len, "prefix": LAYOUTS[variant].longest_prefix(inputs)}

    def cost(self, variant, inputs, params):
        """FLOPs over visible (row, key) pairs; bytes: q, each KV row once, the tree mask, outputs
        (priced from the prefix lengths and masks: no K/V is read)."""
        prefix_len, visibility = LAYOUTS[variant].prefixes_and_masks(inputs)
        return request_cost(variant, LAYOUTS[variant].dims(inputs)[2], prefix_len, visibility)

    def case_cost(self, case):
        """`cost` of the inputs `generate(case)` would draw, from its prefix lengths and tree masks
        alone (drawn as `generate` draws them; no q, no K/V)."""
        _, prefix_len, visibility = self._draw_requests(case)
        return request_cost(case.variant, case.params["heads"], prefix_len, visibility)

    # -- bench ----------------------------------------------------------------------------
    def variant_compute_unit(self, variant):
        return LAYOUTS[variant].compute_unit

    def baselines(self, variant, inputs, params):
        """fp32: torch eager (run_torch), torch.compile of it, PyTorch SDPA with the tree mask.
        bf16_paged: what a user writes in bf16 (`torch_bf16`, see `attend_torch_bf16`) and its
        torch.compile, the fair baselines; the torch backend (`torch_fp32`: bf16 inputs upcast, fp32
        GEMMs, slower than a user's bf16 code, kept as the exact-math baseline; its torch.compile
        only on request: --baseline torch_compile_fp32); SDPA with the tree mask (refused, as its
        probe, where it would not fit in device memory)."""
        def baseline(name, prepare, doc, outputs=None, **role):
            return Baseline(name, doc, BenchRole(**role), prepare, outputs)
        sdpa = replace(baseline("sdpa", torch_impl.sdpa_prepare, "F.scaled_dot_product_attention with a bool tree "
                                "mask over contiguous KV (layout built once, untimed)", outputs=("out",)),
                       probe=functools.partial(torch_impl.sdpa_skip, variant, inputs))
        compiled = "torch.compile(run_torch, dynamic=True)"
        (torch,) = super().baselines(variant, inputs, params)
        if LAYOUTS[variant].out_dtype == "f32":
            return (torch, baseline("torch_compile", torch_impl.compiled_prepare,
                                    f"{compiled}: one compile per variant serves every shape", slow_setup=True), sdpa)
        return (
            baseline("torch_bf16", torch_impl.bf16_prepare, "attend_torch_bf16 eager: bf16 GEMMs with fp32 "
                                                            "accumulation, fp32 scores and softmax, P in bf16"),
            baseline("torch_compile_bf16", functools.partial(torch_impl.bf16_prepare, compiled=True),
                     "torch.compile(attend_torch_bf16, dynamic=True)", slow_setup=True),
            replace(torch, name="torch_fp32", doc="the torch backend (run_torch), eager: bf16 inputs upcast, fp32 GEMMs"),
            baseline("torch_compile_fp32", torch_impl.compiled_prepare, f"{compiled}; only with --baseline",
                     slow_setup=True, default=False),
            sdpa,
        )

    def baseline_tolerances(self, variant):
        return dict(LAYOUTS[variant].baseline_tolerances)

    def bench_extra(self, variant, inputs, params):
        return {"kv_tokens": LAYOUTS[variant].kv_tokens(inputs), "prefix_mode": params.get("prefix_mode", "same")}

    def bench_reference(self, variant, inputs, params):
        """On a GPU: float64 there with the reference's math (see dense_reference); else None."""
        if inputs["q"].device.type != "cuda":
            return None
        return self.dense_reference(variant, inputs, params)

    def dense_reference(self, variant, inputs, params, chunk_bytes=None):
        return dense_reference(variant, inputs, params, chunk_bytes)


OP = VerifyAttn()
