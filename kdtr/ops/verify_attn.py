"""verify_attn: MLA absorbed tree-verify attention over prefix + tree with the tree's mask (ops.md §2).

Two layouts share one math: `fp32` (contiguous [B, S, 576] KV, exact FP32) and `bf16_paged`
(SGLang's page-size-1 token pool). The reference works in float64 on the stored inputs.
"""

from __future__ import annotations

import functools
from typing import Mapping, NamedTuple

import numpy as np

from ..dtypes import NUMPY_DTYPES
from ._common import name_from, rng_for
from .base import Case, Cost, Generated, Op, Param, Tolerance
from .tree_build import OP as TREE_BUILD

LATENT, ROPE = 512, 64
ROW = LATENT + ROPE                          # one 576-wide latent KV row per token
FLOP_PER_KEY = 2 * ROW + 2 * LATENT          # q·k over 576 dims, p·v over 512, per query row
KIMI_K2_SCALE = 0.14467963                   # 192^-0.5 · (0.1·ln 64 + 1)^2
REFERENCE_CHUNK = 1 << 23                    # float64 score elements per reference block (64 MB)


def attend_reference(q: np.ndarray, keys: np.ndarray, prefix_len: int, visibility: np.ndarray,
                     sm_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One request in float64: q [Q, H, 576], keys [P + Q, 576] -> out [Q, H, 512], lse [Q, H]."""
    nq, heads, _ = q.shape
    keys = keys.astype(np.float64)
    values = keys[:, :LATENT]
    allowed = np.ones((nq, keys.shape[0]), dtype=bool)
    allowed[:, prefix_len:] = visibility.astype(bool)
    out = np.empty((nq, heads, LATENT))
    lse = np.empty((nq, heads))
    rows_per_chunk = max(1, REFERENCE_CHUNK // max(1, keys.shape[0] * heads))
    for lo in range(0, nq, rows_per_chunk):
        hi = min(nq, lo + rows_per_chunk)
        scores = sm_scale * np.einsum("qhd,kd->qhk", q[lo:hi].astype(np.float64), keys)
        scores = np.where(allowed[lo:hi, None, :], scores, -np.inf)
        peak = scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        out[lo:hi] = np.einsum("qhk,kd->qhd", weights, values) / total
        lse[lo:hi] = (peak + np.log(total))[..., 0]
    return out, lse


def fp32_gemm_sizing(defines) -> tuple[int, int]:
    """(rows per block, dynamic shared bytes) of kernels/verify_attn_fp32_gemm.cu for its knobs
    FK_ROWS (default 68, a multiple of 4), FK_RING (default 3) and FK_QB (default 0, the pass-A lane
    layout, which sets the partials' layout): the .cu's FK_SMEM_BYTES, written out again here (the
    kernel traps when launched with less than it needs)."""
    rows, ring = int(defines.get("FK_ROWS", 68)), int(defines.get("FK_RING", 3))
    qb = int(defines.get("FK_QB", 0))
    if rows < 4 or rows % 4 or not 2 <= ring <= 8 or qb not in (0, 1):
        raise ValueError(f"fp32_gemm: FK_ROWS must be a positive multiple of 4, FK_RING in [2, 8] and "
                         f"FK_QB 0 or 1, got {rows}, {ring}, {qb}")
    keys, stride = 64, 68                                      # FK_KEYS; FK_STR = FK_PS = 64 + 4
    stage = (rows + keys) * stride
    # partials: 8 dim groups of [rows][keys] (QB=1) or of 4 row quarters [rows/4][keys] + 16 (QB=0)
    partials = 8 * rows * keys if qb else 8 * 4 * (rows // 4 * keys + 16)
    floats = max(ring * stage, partials) + rows * stride + ring * 8 * LATENT + 4 * ((rows + 3) // 4 * 4)
    return rows, 4 * floats


class VerifyAttn(Op):
    name = "verify_attn"
    variants = ("fp32", "bf16_paged")
    params = (
        Param("batch", int, 1, 1, 4096, doc="requests B"),
        Param("heads", int, 16, 1, 1024, doc="query heads H (one shared latent KV head)"),
        Param("prefix", int, 128, 0, 1 << 22, doc="cached tokens before the tree (the largest)"),
        Param("prefix_mode", str, "same", choices=("same", "mixed"),
              doc="same: every request has `prefix`; mixed: request 0 has it, others draw from [0, prefix]"),
        Param("budget", int, 8, 0, 4096, doc="tree nodes besides the root; Q = budget + 1"),
        Param("depth", int, 6, 1, 64, doc="draft depth of the drafter the trees come from"),
        Param("sharpness", float, 1.0, 0.0, 1e6, doc="drafter logit scale (chains vs bushes)"),
        Param("sm_scale", float, KIMI_K2_SCALE, 0.0, 1e3,
              doc="softmax scale: 0.14467963 Kimi K2, 0.13523378 DeepSeek-V3, 0.07216878 no YaRN"),
        Param("scale", float, 0.6, 1e-6, 1e6,
              doc="std of the random q and kv entries; 0.6 gives scores of std ~1.25 (Kimi K2 scale)"),
    )
    outputs = ("out", "lse")
    kernel_params = ("sm_scale",)
    _defaults = {p.name: p.default for p in params}

    def case_name(self, variant, params):
        name = name_from(params, [("batch", "b"), ("heads", "h"), ("prefix", "p"), ("budget", "n")],
                         [("prefix_mode", ""), ("depth", "l"), ("sharpness", "s"), ("sm_scale", "sc"),
                          ("scale", "x")], self._defaults)
        return f"{variant}_{name}"

    def input_specs(self, variant):
        if variant == "fp32":
            return {"q": "f32", "kv": "f32", "prefix_len": "i32", "visibility": "u8"}
        return {"q": "bf16", "kv_buffer": "bf16", "kv_indptr": "i32", "kv_indices": "i32",
                "tree_slots": "i32", "custom_mask": "u8", "mask_indptr": "i32"}

    def check_inputs(self, variant, inputs, params):
        """Every index a kernel follows must land inside its buffer."""
        scale = params["sm_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
            raise ValueError(f"params.sm_scale must be a finite number, got {scale!r}")
        q = inputs["q"]
        if variant == "fp32":
            if q.ndim != 4 or q.shape[3] != ROW or 0 in q.shape:
                raise ValueError(f"q must be [B, Q, H, {ROW}], got {list(q.shape)}")
            batch, q_len = q.shape[:2]
            kv, prefix_len = inputs["kv"], inputs["prefix_len"]
            if kv.ndim != 3 or kv.shape[0] != batch or kv.shape[2] != ROW:
                raise ValueError(f"kv must be [B={batch}, S, {ROW}], got {list(kv.shape)}")
            if prefix_len.shape != (batch,) or np.any(prefix_len < 0) \
                    or np.any(prefix_len.astype(np.int64) + q_len > kv.shape[1]):
                raise ValueError(f"prefix_len must be [B] with 0 <= prefix_len <= S - Q = {kv.shape[1] - q_len}")
            if inputs["visibility"].shape != (batch, q_len, q_len):
                raise ValueError(f"visibility must be [B, Q, Q] = {[batch, q_len, q_len]}, "
                                 f"got {list(inputs['visibility'].shape)}")
            visibility = inputs["visibility"]
        else:
            indptr, slots = inputs["kv_indptr"].astype(np.int64), inputs["tree_slots"]
            if q.ndim != 3 or q.shape[2] != ROW or 0 in q.shape:
                raise ValueError(f"q must be [B*Q, H, {ROW}], got {list(q.shape)}")
            if indptr.ndim != 1 or indptr.size < 2 or indptr[0] != 0 or np.any(np.diff(indptr) < 0) \
                    or indptr[-1] != inputs["kv_indices"].size:
                raise ValueError("kv_indptr must start at 0, not decrease, and end at len(kv_indices)")
            batch = indptr.size - 1
            if slots.ndim != 1 or slots.size % batch or slots.size != q.shape[0]:
                raise ValueError(f"tree_slots must hold B*Q = {q.shape[0]} slots for B = {batch}")
            q_len = slots.size // batch
            pool = inputs["kv_buffer"].shape[0]
            if inputs["kv_buffer"].ndim != 2 or inputs["kv_buffer"].shape[1] != ROW:
                raise ValueError(f"kv_buffer must be [N, {ROW}], got {list(inputs['kv_buffer'].shape)}")
            for name in ("kv_indices", "tree_slots"):
                if inputs[name].size and (inputs[name].min() < 0 or inputs[name].max() >= pool):
                    raise ValueError(f"{name} holds a slot outside the pool [0, {pool})")
            sizes = q_len * (np.diff(indptr) + q_len)
            expected_indptr = np.concatenate([[0], np.cumsum(sizes)])
            if not np.array_equal(inputs["mask_indptr"].astype(np.int64), expected_indptr) \
                    or inputs["custom_mask"].size != expected_indptr[-1]:
                raise ValueError("mask_indptr must be the exclusive cumsum of Q*(P_b+Q) and end at "
                                 "len(custom_mask)")
            visibility = np.stack([m for *_, m in self.requests(variant, inputs)])
        node = np.arange(q_len)
        if np.any(visibility[:, node, node] != 1):
            raise ValueError("every tree row must see itself (visibility diagonal all 1)")

    # -- goldens --------------------------------------------------------------------------
    def trees(self, case: Case) -> dict[str, np.ndarray]:
        """The case's real trees (vocab >= budget and K = budget, so every tree is full)."""
        p = case.params
        return TREE_BUILD.real_trees(case.name, case.seed, batch=p["batch"], depth=p["depth"],
                                     budget=p["budget"], vocab=max(p["budget"], 32), sharpness=p["sharpness"])

    def generate(self, case: Case) -> Generated:
        p = case.params
        batch, heads, budget = p["batch"], p["heads"], p["budget"]
        q_len = budget + 1
        rng = rng_for(case.seed, 2)
        built = self.trees(case)
        if not np.all(built["num_nodes"] == budget):          # K = budget makes every tree full
            raise AssertionError("tree_build produced a tree smaller than its budget")
        visibility = built["visibility"]
        prefix_len = np.full(batch, p["prefix"], np.int32)
        if p["prefix_mode"] == "mixed" and batch > 1:
            prefix_len[1:] = rng.integers(0, p["prefix"] + 1, size=batch - 1)
        params = {"sm_scale": p["sm_scale"], "batch": batch, "heads": heads, "prefix": p["prefix"],
                  "budget": budget, "prefix_mode": p["prefix_mode"]}
        scale = np.float32(p["scale"])

        def normal(shape):
            return rng.standard_normal(shape, dtype=np.float32) * scale

        if case.variant == "fp32":
            rows = int(prefix_len.max()) + q_len
            kv = np.full((batch, rows, ROW), np.nan, np.float32)      # padding rows are NaN
            for b in range(batch):
                kv[b, :prefix_len[b] + q_len] = normal((prefix_len[b] + q_len, ROW))
            inputs = {"q": normal((batch, q_len, heads, ROW)), "kv": kv, "prefix_len": prefix_len,
                      "visibility": visibility}
            return Generated(inputs, params)

        bf16 = NUMPY_DTYPES["bf16"]
        used = int(prefix_len.sum()) + batch * q_len
        pool = used + max(1, used // 4)                               # unused slots are NaN
        slots = rng.permutation(pool).astype(np.int32)                # a fragmented pool
        kv_buffer = normal((pool, ROW)).astype(bf16)
        kv_buffer[slots[used:]] = np.nan
        kv_indptr = np.concatenate([[0], np.cumsum(prefix_len)]).astype(np.int32)
        masks = []
        for b in range(batch):
            mask = np.ones((q_len, prefix_len[b] + q_len), np.uint8)
            mask[:, prefix_len[b]:] = visibility[b]
            masks.append(mask.ravel())
        mask_indptr = np.concatenate([[0], np.cumsum([m.size for m in masks])]).astype(np.int32)
        inputs = {"q": normal((batch * q_len, heads, ROW)).astype(bf16), "kv_buffer": kv_buffer,
                  "kv_indptr": kv_indptr, "kv_indices": slots[:kv_indptr[-1]].copy(),
                  "tree_slots": slots[kv_indptr[-1]:used].copy(),
                  "custom_mask": np.concatenate(masks), "mask_indptr": mask_indptr}
        return Generated(inputs, params)

    def estimate_bytes(self, variant, params):
        """The generator's inputs (plus its float32 draw of the bf16 pool) and the reference's
        float64 copy of one request's keys, its score blocks and its float64 outputs."""
        batch, heads, prefix, q_len = params["batch"], params["heads"], params["prefix"], params["budget"] + 1
        keys = prefix + q_len
        if variant == "fp32":
            inputs = 4 * (batch * keys * ROW + batch * q_len * heads * ROW) + batch * q_len * q_len
            draw = 4 * keys * ROW
        else:
            pool = batch * keys + max(1, batch * keys // 4)
            inputs = 2 * (pool + batch * q_len * heads) * ROW + 4 * pool + 2 * batch * q_len * keys
            draw = 4 * pool * ROW
        block = max(min(q_len * heads * keys, REFERENCE_CHUNK), heads * keys)   # attend_reference's
        reference = 8 * keys * ROW + 2 * keys * ROW + q_len * keys + 3 * 8 * block \
            + 2 * 8 * batch * q_len * heads * (LATENT + 1)
        return inputs + draw + reference

    def requests(self, variant: str, inputs: Mapping[str, np.ndarray]):
        """Per request: (q [Q, H, 576], keys [P + Q, 576], P, visibility [Q, Q]) in the stored dtype."""
        if variant == "fp32":
            q_len = inputs["q"].shape[1]
            for b, prefix_len in enumerate(inputs["prefix_len"]):
                keys = inputs["kv"][b, :prefix_len + q_len]
                yield inputs["q"][b], keys, int(prefix_len), inputs["visibility"][b]
            return
        indptr, mask_indptr = inputs["kv_indptr"], inputs["mask_indptr"]
        batch = len(indptr) - 1
        q_len = len(inputs["tree_slots"]) // batch
        for b in range(batch):
            prefix_len = int(indptr[b + 1] - indptr[b])
            slots = np.concatenate([inputs["kv_indices"][indptr[b]:indptr[b + 1]],
                                    inputs["tree_slots"][b * q_len:(b + 1) * q_len]])
            mask = inputs["custom_mask"][mask_indptr[b]:mask_indptr[b + 1]]
            mask = mask.reshape(q_len, prefix_len + q_len)[:, prefix_len:]
            yield (inputs["q"][b * q_len:(b + 1) * q_len], inputs["kv_buffer"][slots], prefix_len, mask)

    def reference(self, variant, inputs, params):
        outs, lses = [], []
        for q, keys, prefix_len, visibility in self.requests(variant, inputs):
            out, lse = attend_reference(q, keys, prefix_len, visibility, float(params["sm_scale"]))
            outs.append(out)
            lses.append(lse)
        out, lse = np.stack(outs), np.stack(lses)                   # [B, Q, H, ...]
        if variant == "bf16_paged":
            out, lse = out.reshape((-1,) + out.shape[2:]), lse.reshape((-1,) + lse.shape[2:])
        # expected outputs at reference precision, stored as f32 for both variants (ops.md §2)
        return {"out": out.astype(np.float32), "lse": lse.astype(np.float32)}

    def tolerances(self, variant):
        # Figures below are for the default input scale (outputs of rms ~0.04, max ~0.7; lse ~8).
        if variant == "fp32":
            return {
                # FP32 dots over 576 dims and a softmax over up to ~10^5 keys: the torch backend's
                # worst element is ~1e-6 off the float64 result; 4x margin. Norm-wise the contract
                # is 1e-6 of the float64 result (measured: ~5e-7).
                "out": Tolerance(atol=4e-6, rtol=1e-4, l2=1e-6),
                # lse is ~8: an f32 ulp there is ~1e-6; 1e-5 allows a few.
                "lse": Tolerance(atol=1e-5, rtol=1e-6),
            }
        return {
            # bf16 output: one rounding is <= 2^-9 relative; rtol 2^-7 is 2 bf16 ulps of the
            # reference at worst. Tensor-core kernels also round the softmax weights to bf16 for
            # P·V (2^-9 relative each): |err| <= 2^-9·sum(p·|v|) <= 2^-9·max|v| = 6.5e-3 at the
            # default scale (max|v| ~3.3). A numpy model of such a kernel (weights rounded to bf16,
            # then the output) exceeds the rtol term by up to 1.8e-3 over 18 cases of the default
            # shapes: atol 4e-3. Norm-wise 8e-3 (that model: 2.1e-3).
            "out": Tolerance(atol=4e-3, rtol=2.0 ** -7, l2=8e-3),
            # lse comes from fp32 scores of the exact bf16 inputs: f32 rounding only.
            "lse": Tolerance(atol=1e-5, rtol=1e-6),
        }

    def output_specs(self, variant, inputs, params):
        if variant == "fp32":
            batch, q_len, heads, _ = inputs["q"].shape
            return {"out": ("f32", (batch, q_len, heads, LATENT)), "lse": ("f32", (batch, q_len, heads))}
        rows, heads, _ = inputs["q"].shape
        return {"out": ("bf16", (rows, heads, LATENT)), "lse": ("f32", (rows, heads))}

    # -- backends -------------------------------------------------------------------------
    def run_torch(self, variant, inputs, params):
        """What a user writes: gather keys, bmm, masked fp32 softmax, bmm (scores materialised)."""
        import torch

        if variant == "fp32":
            q, kv = inputs["q"], inputs["kv"]
            batch, q_len, heads, _ = q.shape
            prefix_len = inputs["prefix_len"].long()
            width = int(prefix_len.max())
            keys_prefix = kv[:, :width]
            tree_rows = prefix_len[:, None] + torch.arange(q_len, device=q.device)[None]
            keys_tree = kv[torch.arange(batch, device=q.device)[:, None], tree_rows]
            visibility = inputs["visibility"].bool()
        else:
            indptr = inputs["kv_indptr"].long()
            width = int((indptr[1:] - indptr[:-1]).max())
            q, keys_prefix, keys_tree, prefix_len, visibility = _paged_gather(inputs, width)
            q, keys_prefix, keys_tree = q.float(), keys_prefix.float(), keys_tree.float()
            batch, q_len, heads, _ = q.shape
        keys, allowed = _keys_and_allowed(keys_prefix, keys_tree, prefix_len, visibility)
        scores = torch.bmm(q.reshape(batch, q_len * heads, ROW), keys.transpose(1, 2))
        scores = scores.view(batch, q_len, heads, -1) * float(params["sm_scale"])
        scores = scores.masked_fill(~allowed[:, :, None, :], -torch.inf)
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - lse[..., None]).view(batch, q_len * heads, -1)
        out = torch.bmm(weights, keys[..., :LATENT]).view(batch, q_len, heads, LATENT)
        if variant == "fp32":
            return {"out": out, "lse": lse}
        return {"out": out.reshape(batch * q_len, heads, LATENT).to(torch.bfloat16),
                "lse": lse.reshape(batch * q_len, heads)}

    # CUDA binding (kernels/verify_attn_*.cu). One entry per kernel: the variant it serves, source,
    # entry, merge entry, (token, head) rows and keys per tile, threads, dynamic shared memory (the
    # .cu's *_SMEM_BYTES), arch suffix ("a": sm_90a-only code, run only on an sm_90 device), the
    # fewest key tiles per split, whether a full grid is re-split to even out its last wave,
    # (optional) `sizing`: defines -> (rows per tile, shared bytes), for a kernel whose tile is a knob,
    # `pieces`: for a kernel that reads its operands pre-split, the bytes of one 16-row tile of them
    # (the entry `<main>_pieces`, grid (PIECES_SPLIT x tiles, B) of PIECES_BLOCK threads, writes
    # every kv and q tile of them first; the main kernel then takes that buffer in place of q and
    # kv), and `min_sm`: the
    # oldest architecture that has the instructions it uses, and `min_fill`: the fraction of the SMs
    # its grid must occupy (a default is skipped on older architectures and on smaller grids).
    # `dependent`: its pieces, main and merge kernels are launched as programmatic dependents of the
    # grid before each (each passes griddepcontrol.wait before its first global access).
    PIECES_SPLIT, PIECES_BLOCK = 4, 144     # a `pieces` kernel's blocks per tile and threads per block

    class CudaKernel(NamedTuple):
        variant: str
        source: str
        main: str
        merge: str
        rows: int
        keys: int
        threads: int
        smem: int
        arch_feature: str = ""
        split_min_tiles: int = 4
        rebalance: bool = False
        sizing: object = None
        pieces: int = 0
        min_sm: int = 0
        min_fill: float = 0.0
        dependent: bool = False

    CUDA_KERNELS = {
        "fp32_ffma": CudaKernel("fp32", "verify_attn_fp32.cu", "verify_attn_fp32", "verify_attn_fp32_merge",
                                32, 16, 512, 183680),
        # two register-tiled GEMMs per 64-key tile, one exact softmax between them, 68-row tiles x
        # 64-key splits (132 blocks at B=1 H=16 Q=17 P=2048): 59.1 us there against fp32_ffma's
        # 66.5 on an H200 (kernels/NOTES.md, "fp32_gemm"); all-FFMA, the fp32 default until session
        # 5. Knobs FK_ROWS / FK_RING / FK_QB resize it through `sizing`.
        "fp32_gemm": CudaKernel("fp32", "verify_attn_fp32_gemm.cu", "verify_attn_fp32_gemm",
                                "verify_attn_fp32_gemm_merge", 68, 64, 512, 210048, split_min_tiles=1,
                                sizing=fp32_gemm_sizing),
        # warp-specialised: the scores on the FP64 tensor cores (exact products, fp64 sums) in 4
        # warps, the softmax and P.V on FFMA in 8, 16-key sub-tiles handed over through mbarriers;
        # 34-row tiles, 8 x 16 = 128 blocks at B=1 H=16 Q=17 P=2048: 50.8 us there against
        # fp32_gemm's 58.6 in one process on an H200 (kernels/NOTES.md, "Session 5").
        "fp32_dmma": CudaKernel("fp32", "verify_attn_fp32_dmma.cu", "verify_attn_fp32_dmma",
                                "verify_attn_fp32_dmma_merge", 34, 16, 384, 228592, split_min_tiles=4),
        # every fp32 operand split exactly into three bf16 pieces (once, by a pieces kernel: its
        # buffer is 1.5x the kv and q), six piece products per product on the bf16 tensor cores
        # (mma.sync): 4 score warps (built for sm_90a: setmaxnreg lets them hold their Q pieces), 4
        # softmax warps, 8 P.V warps, the pieces streamed by bulk copies; the three kernels launched
        # as programmatic dependents; 16-row tiles, 17 x 7 = 119 blocks at B=1 H=16 Q=17 P=2048:
        # 32.32 us there in session 8's bench record (fp32_dmma: 50.4-51.2 in one A/B process on an
        # H200), and the lowest error of the fp32 kernels (rel L2 1.3e-7 against 2.2e-7;
        # kernels/NOTES.md, "Session 8").
        # Bulk copies need sm_90 or newer. Its per-block chains are long: with half the SMs busy
        # (B=4 H=16 Q=17 P=8192: 68 blocks) it ran 683-684 us against fp32_dmma's 582-589, so it is
        # chosen only when its grid fills 3/4 of the SMs.
        "fp32_bf16x3": CudaKernel("fp32", "verify_attn_fp32_bf16x3.cu", "verify_attn_fp32_bf16x3",
                                  "verify_attn_fp32_bf16x3_merge", 16, 16, 512, 229576, "a", split_min_tiles=4,
                                  pieces=55296, min_sm=90, min_fill=0.75, dependent=True),
        "bf16_mma": CudaKernel("bf16_paged", "verify_attn_bf16_paged.cu", "verify_attn_bf16_paged",
                               "verify_attn_bf16_merge", 64, 32, 256, 166144),
        "bf16_wgmma2": CudaKernel("bf16_paged", "verify_attn_bf16_wgmma2.cu", "verify_attn_bf16_wgmma2",
                                  "verify_attn_bf16_wgmma2_merge", 64, 64, 256, 223768, "a", 2, True),
    }
    # Kernels the launch may pick by default (each passed the GPU tests on an H200; kernels/NOTES.md);
    # others run only when named.
    CUDA_DEFAULTS = ("fp32_bf16x3", "fp32_dmma", "fp32_gemm", "fp32_ffma", "bf16_mma", "bf16_wgmma2")

    def cuda_kernels(self, variant):
        return tuple(name for name, k in self.CUDA_KERNELS.items() if k.variant == variant)

    def kernel_sources(self, variant):
        return tuple(dict.fromkeys(k.source for k in self.CUDA_KERNELS.values() if k.variant == variant))

    def kernel_choice(self, variant, inputs, params):
        """Name of the CUDA kernel run_cuda launches for these inputs here (a CUDA_KERNELS key):
        for fp32 the first fp32 kernel of CUDA_DEFAULTS whose shared memory fits, whose instructions
        exist here and whose grid fills its min_fill of the SMs (Hopper: fp32_bf16x3 when it fills 3/4
        of them, else fp32_dmma), else fp32_ffma; for bf16_paged the wgmma kernel on sm_90
        (H100/H200), else the portable one."""
        from ..device import device_arch, gpu_available, max_shared_optin

        if variant == "fp32":
            if gpu_available():
                sm = int(device_arch().removeprefix("sm_"))
                for name in self.CUDA_DEFAULTS:
                    k = self.CUDA_KERNELS[name]
                    if k.variant == "fp32" and k.smem + 64 <= max_shared_optin() and sm >= k.min_sm \
                            and (not k.min_fill or self._fill(k, inputs) >= k.min_fill):
                        return name
            return "fp32_ffma"
        if "bf16_wgmma2" in self.CUDA_DEFAULTS and gpu_available() and device_arch() == "sm_90":
            return "bf16_wgmma2"
        return "bf16_mma"

    def _fill(self, k, inputs):
        """Blocks of k's fp32 grid for these inputs per SM."""
        from ..device import multiprocessor_count

        batch, q_len, heads, _ = inputs["q"].shape
        tiles, _, splits = self._grid(k, batch, q_len, heads, inputs["kv"].shape[1])
        return tiles * batch * splits / multiprocessor_count()

    def _grid(self, k, batch, q_len, heads, kv_bound, defines=None):
        """Row tiles per request, dynamic shared memory and KV splits of the grid run_cuda launches
        k with (`sizing` resizes a kernel whose tile is a knob)."""
        import math

        from ..device import multiprocessor_count

        tile_rows, smem = k.sizing(defines or {}) if k.sizing else (k.rows, k.smem)
        tiles = math.ceil(q_len * heads / tile_rows)
        return tiles, smem, self._splits(k, tiles * batch, kv_bound, multiprocessor_count())

    @staticmethod
    def _splits(k, ctas, kv_bound, sms):
        """KV splits per (row tile, request): fill the SMs when there are fewer tiles than SMs
        (each split at least k.split_min_tiles key tiles); with k.rebalance, a grid of one or more
        waves is split in two when that evens out a ragged last wave by more than 3%."""
        import math

        if ctas >= sms:
            if k.rebalance and kv_bound >= 16 * k.keys:
                one, two = math.ceil(ctas / sms), math.ceil(2 * ctas / sms) / 2
                return 2 if two < 0.97 * one else 1
            return 1
        return max(1, min(sms // ctas, math.ceil(kv_bound / (k.split_min_tiles * k.keys))))

    def run_cuda(self, variant, inputs, params, outputs, *, kernel=None, splits=None, defines=None):
        """One block per (row tile, request, KV split); a merge kernel when the keys are split.

        `kernel` names a CUDA_KERNELS entry (default: kernel_choice); `splits` overrides the split
        count; `defines` are extra compile-time defines (the kernels' timing diagnostics). Splits
        are chosen from shapes only (no device sync, so this can be graph-captured).
        """
        import math
        from ctypes import c_float, c_int, c_void_p

        import torch

        from ..device import device_arch, get_kernel

        name = kernel or self.kernel_choice(variant, inputs, params)
        k = self.CUDA_KERNELS[name]
        if k.variant != variant:
            raise ValueError(f"kernel {name} serves verify_attn/{k.variant}, not {variant}")
        if variant == "fp32":
            batch, q_len, heads, _ = inputs["q"].shape
            kv_bound = inputs["kv"].shape[1]
        else:
            batch = inputs["kv_indptr"].numel() - 1
            q_len, heads = inputs["tree_slots"].numel() // batch, inputs["q"].shape[1]
            kv_bound = inputs["kv_indices"].numel() + q_len       # >= every request's P_b + Q
        rows = batch * q_len * heads
        tiles, smem, auto_splits = self._grid(k, batch, q_len, heads, kv_bound, defines)
        splits = auto_splits if splits is None else splits
        arch = device_arch() + k.arch_feature if k.arch_feature else None
        main = get_kernel(k.source, k.main, arch=arch, defines=defines or {})
        merger = get_kernel(k.source, k.merge, arch=arch) if splits > 1 else None
        if splits > 1:
            device = outputs["out"].device
            ws_o = torch.empty((splits, rows, LATENT), dtype=torch.float32, device=device)
            ws_m = torch.empty((splits, rows), dtype=torch.float32, device=device)
            ws_l = torch.empty((splits, rows), dtype=torch.float32, device=device)
            workspace = [ws_o, ws_m, ws_l]
        else:
            workspace = [c_void_p(0)] * 3
        if variant == "fp32":
            operands = [inputs["q"], inputs["kv"]]
            if k.pieces:
                kv_tiles = math.ceil(kv_bound / k.keys)
                pieces = torch.empty(batch * (kv_tiles + tiles) * k.pieces, dtype=torch.uint8,
                                     device=outputs["out"].device)
                get_kernel(k.source, k.main + "_pieces", arch=arch).launch(
                    (self.PIECES_SPLIT * (kv_tiles + tiles), batch), self.PIECES_BLOCK,
                    operands + [inputs["prefix_len"], c_int(q_len), c_int(heads), c_int(kv_bound), pieces],
                    dependent=k.dependent)
                operands = [pieces]
            args = operands + [inputs["prefix_len"], inputs["visibility"], c_int(batch), c_int(q_len),
                               c_int(heads), c_int(kv_bound), c_float(float(params["sm_scale"])), c_int(splits)]
        else:
            args = [inputs[n] for n in ("q", "kv_buffer", "kv_indptr", "kv_indices", "tree_slots",
                                              "custom_mask", "mask_indptr")]
            args += [c_int(batch), c_int(q_len), c_int(heads),
                     c_float(float(params["sm_scale"]) * math.log2(math.e)), c_int(splits)]
        main.launch((tiles, batch, splits), k.threads, args + [outputs["out"], outputs["lse"], *workspace],
                    shared_mem=smem, dependent=k.dependent)
        if merger is not None:
            merger.launch(rows, 128, [*workspace, c_int(splits), c_int(rows), outputs["out"], outputs["lse"]],
                          dependent=k.dependent)

    # -- reports --------------------------------------------------------------------------
    def describe(self, variant, inputs, params):
        if variant == "fp32":
            batch, q_len, heads, _ = inputs["q"].shape
            prefix = int(inputs["prefix_len"].max())
        else:
            batch = len(inputs["kv_indptr"]) - 1
            q_len = len(inputs["tree_slots"]) // batch
            heads = inputs["q"].shape[1]
            prefix = int(np.diff(inputs["kv_indptr"]).max())
        return {"B": batch, "H": heads, "Q": q_len, "prefix": prefix}

    def cost(self, variant, inputs, params):
        """FLOPs over visible (row, key) pairs; bytes: q, each KV row once, the tree mask, outputs."""
        visible_keys, kv_rows, mask_bytes = 0, 0, 0
        for q, keys, prefix_len, visibility in self.requests(variant, inputs):
            heads = q.shape[1]
            visible_keys += heads * (prefix_len * q.shape[0] + int(visibility.astype(bool).sum()))
            kv_rows += keys.shape[0]
            mask_bytes += visibility.size
        itemsize = inputs["q"].dtype.itemsize
        out_bytes = sum(NUMPY_DTYPES[d].itemsize * int(np.prod(s))
                        for d, s in self.output_specs(variant, inputs, params).values())
        moved = inputs["q"].nbytes + kv_rows * ROW * itemsize + mask_bytes + out_bytes
        return Cost(flops=float(visible_keys * FLOP_PER_KEY), bytes=float(moved))


    # -- bench ----------------------------------------------------------------------------
    def compute_unit(self, variant):
        # fp32 is the exact variant (FP32 FMA, no tensor cores): rated against FP32 FLOP/s
        return "fp32_fma" if variant == "fp32" else "bf16_mma"

    def baselines(self, variant, inputs, params):
        """fp32: torch eager (run_torch), torch.compile of it, PyTorch SDPA with the tree mask.
        bf16_paged: what a user writes in bf16 (`torch_bf16`, see `attend_torch_bf16`) and its
        torch.compile, the fair baselines; the torch backend (`torch_fp32`: bf16 inputs upcast, fp32
        GEMMs, slower than a user's bf16 code, kept as the exact-math baseline; its torch.compile
        only on request: --baseline torch_compile_fp32); SDPA with the tree mask."""
        from .base import Baseline

        sdpa = Baseline(self._sdpa_runner, skip=self._sdpa_skip(variant, inputs),
                        doc="F.scaled_dot_product_attention with a bool tree mask over "
                            "contiguous KV (layout built once, untimed)")
        if variant == "fp32":
            out = super().baselines(variant, inputs, params)
            out["torch_compile"] = Baseline(self._compiled_runner, slow_setup=True,
                                            doc="torch.compile(run_torch, dynamic=True): one compile "
                                                "per variant serves every shape")
            out["sdpa"] = sdpa
            return out
        return {
            "torch_bf16": Baseline(self._bf16_runner, doc="attend_torch_bf16 eager: bf16 GEMMs with fp32 "
                                                          "accumulation, fp32 scores and softmax, P in bf16"),
            "torch_compile_bf16": Baseline(functools.partial(self._bf16_runner, compiled=True), slow_setup=True,
                                           doc="torch.compile(attend_torch_bf16, dynamic=True)"),
            "torch_fp32": Baseline(self._torch_runner, backend="torch",
                                   doc="the torch backend (run_torch), eager: bf16 inputs upcast, fp32 GEMMs"),
            "torch_compile_fp32": Baseline(self._compiled_runner, slow_setup=True, default=False,
                                           doc="torch.compile(run_torch, dynamic=True); only with --baseline"),
            "sdpa": sdpa,
        }

    def _bf16_runner(self, variant, inputs, params, compiled=False):
        """The bf16 baseline on the case's inputs. The longest prefix is host-side metadata a
        serving engine has (SGLang's max_seq_len), taken once here, untimed; all gathers, the mask,
        both GEMMs and the softmax are in every timed call."""
        import torch

        if variant != "bf16_paged":
            raise ValueError("the bf16 baseline is for bf16_paged")
        width = int((inputs["kv_indptr"][1:] - inputs["kv_indptr"][:-1]).max())
        run = _compiled_bf16() if compiled else attend_torch_bf16
        scale = float(params["sm_scale"])
        matmul = torch.backends.cuda.matmul

        def call():
            # fp32 accumulation everywhere: no split-K partial sums rounded to bf16 (torch's default
            # allows them for bf16 GEMMs); restored after the call.
            previous = matmul.allow_bf16_reduced_precision_reduction
            matmul.allow_bf16_reduced_precision_reduction = False
            try:
                return run(inputs, width, scale)
            finally:
                matmul.allow_bf16_reduced_precision_reduction = previous
        return call

    def baseline_tolerances(self, variant):
        tolerances = self.tolerances(variant)
        if variant == "fp32":
            # torch's FP32 path (cuBLAS SGEMM and its summation orders; SDPA's math path) landed at
            # 1.1-1.5e-6 of the float64 result in norm on the H200 (results/bench-20261129-121548-
            # h200.json), just over our kernel's 1e-6 contract: a speed baseline must compute the op,
            # not meet that contract. Elementwise bounds stay.
            out = tolerances["out"]
            tolerances["out"] = Tolerance(atol=out.atol, rtol=out.rtol, l2=1e-5)
        else:
            # out: the op's bf16 bound as it is. It was derived for exactly the bf16 baseline's
            # numerics (fp32 scores, softmax weights rounded to bf16 for P·V, the output rounded to
            # bf16), so a baseline that passes it computes the op as precisely as our kernel must.
            # lse: 1e-4 instead of our kernel's 1e-5. cuBLAS chooses its own fp32 summation order
            # (split-K) for the 576-long score dots (unscaled scores reach ~±40, an f32 ulp there is
            # ~4e-6) and torch's logsumexp sums up to 1.3e5 terms; an lse off by 1e-4 moves exp(lse)
            # by 1e-4 relative, 20x below one bf16 rounding of the output (2^-9 = 2e-3), so a
            # baseline within it is still exact at the precision of the op's bf16 output.
            tolerances["lse"] = Tolerance(atol=1e-4, rtol=1e-6)
        return tolerances

    def bench_extra(self, variant, inputs, params):
        if variant == "fp32":
            kv_tokens = int(inputs["prefix_len"].sum()) + inputs["visibility"].shape[0] * inputs["visibility"].shape[1]
        else:
            kv_tokens = int(inputs["kv_indices"].size + inputs["tree_slots"].size)
        return {"kv_tokens": kv_tokens, "prefix_mode": params.get("prefix_mode", "same")}

    def _compiled_runner(self, variant, inputs, params):
        return functools.partial(_compiled_run_torch(variant), inputs, params)

    def _sdpa_skip(self, variant, inputs):
        """Why SDPA would not fit in device memory here (None: it fits). A bool mask and head dim
        576 send SDPA down its math path, which expands the one latent KV head to H heads in fp32
        and materialises fp32 scores and weights."""
        free = _device_free_bytes()
        if free is None:
            return None
        shape = self.describe(variant, inputs, {})
        batch, heads, q_len = shape["B"], shape["H"], shape["Q"]
        keys = shape["prefix"] + q_len
        need = (batch * heads * keys * (ROW + LATENT) * 4 + 3 * batch * heads * q_len * keys * 4
                + batch * keys * ROW * inputs["q"].dtype.itemsize)
        if need > SDPA_MEMORY_FRACTION * free:
            return (f"would need ~{need / 1e9:.0f} GB (KV expanded to {heads} heads in fp32, fp32 "
                    f"scores); {free / 1e9:.0f} GB free")
        return None

    def _sdpa_runner(self, variant, inputs, params):
        import torch.nn.functional as F

        q, keys, allowed = self._dense_layout(variant, inputs, inputs["q"].dtype)
        batch, heads, q_len, _ = q.shape
        keys, mask, scale = keys[:, None], allowed[:, None], float(params["sm_scale"])   # one KV head

        def run():
            out = F.scaled_dot_product_attention(q, keys, keys[..., :LATENT], attn_mask=mask, scale=scale,
                                                 enable_gqa=True).transpose(1, 2)     # [B, Q, H, 512]
            return {"out": out if variant == "fp32" else out.reshape(batch * q_len, heads, LATENT)}
        return run

    def _dense_layout(self, variant, inputs, dtype, lo=0, hi=None):
        """Requests lo..hi of torch inputs as dense tensors: q [n, H, Q, 576] (a view where the dtype
        allows), keys [n, W + Q, 576] (each prefix padded with zero rows to the longest W, then the
        tree) and allowed [n, Q, W + Q] (bool)."""
        import torch

        if variant == "fp32":
            batch, q_len, heads, _ = inputs["q"].shape
            hi = batch if hi is None else hi
            prefix_len = inputs["prefix_len"][lo:hi].long()
            q = inputs["q"][lo:hi].transpose(1, 2)
            kv = inputs["kv"][lo:hi]
            device = kv.device
            width = int(prefix_len.max())
            keys_prefix = kv[:, :width]
            tree_rows = prefix_len[:, None] + torch.arange(q_len, device=device)[None]
            keys_tree = kv[torch.arange(hi - lo, device=device)[:, None], tree_rows]
            visibility = inputs["visibility"][lo:hi].bool()
        else:
            indptr = inputs["kv_indptr"].long()
            batch = indptr.numel() - 1
            hi = batch if hi is None else hi
            q_len, heads = inputs["tree_slots"].numel() // batch, inputs["q"].shape[1]
            q = inputs["q"][lo * q_len:hi * q_len].view(hi - lo, q_len, heads, ROW).transpose(1, 2)
            device = q.device
            prefix_len = (indptr[1:] - indptr[:-1])[lo:hi]
            width = int(prefix_len.max())
            buffer = inputs["kv_buffer"]
            if width:
                indices = inputs["kv_indices"].long()
                pos = indptr[lo:hi, None] + torch.arange(width, device=device)[None]
                keys_prefix = buffer[indices[pos.clamp(max=indices.numel() - 1)]]
            else:
                keys_prefix = buffer.new_zeros((hi - lo, 0, ROW))
            keys_tree = buffer[inputs["tree_slots"].long().view(batch, q_len)[lo:hi]]
            rows = torch.arange(q_len, device=device)
            mask_pos = (inputs["mask_indptr"].long()[lo:hi, None, None]
                        + rows[None, :, None] * (prefix_len + q_len)[:, None, None]
                        + prefix_len[:, None, None] + rows[None, None, :])
            visibility = inputs["custom_mask"][mask_pos].bool()
        prefix_cols = torch.arange(width, device=device)[None] < prefix_len[:, None]       # [n, W]
        keys = torch.cat([torch.where(prefix_cols[:, :, None], keys_prefix.to(dtype), 0),  # NaN padding -> 0
                          keys_tree.to(dtype)], dim=1)
        allowed = torch.cat([prefix_cols[:, None, :].expand(-1, q_len, -1), visibility], dim=2)
        return q.to(dtype), keys, allowed

    def bench_reference(self, variant, inputs, params):
        """On a GPU: float64 there with the reference's math (see dense_reference); else None."""
        if inputs["q"].device.type != "cuda":
            return None
        return self.dense_reference(variant, inputs, params)

    def dense_reference(self, variant, inputs, params, chunk_bytes=None):
        """float64 in torch with the reference's math (masked softmax over dense keys), on the
        inputs' device, in chunks of requests and heads whose float64 scores stay under
        `chunk_bytes` (REFERENCE_DEVICE_BYTES)."""
        import torch

        chunk_bytes = chunk_bytes or REFERENCE_DEVICE_BYTES
        if variant == "fp32":
            batch, q_len, heads, _ = inputs["q"].shape
            width = int(inputs["prefix_len"].max())
        else:
            batch = inputs["kv_indptr"].numel() - 1
            q_len, heads = inputs["tree_slots"].numel() // batch, inputs["q"].shape[1]
            width = int((inputs["kv_indptr"][1:] - inputs["kv_indptr"][:-1]).max())
        per_head = q_len * (width + q_len) * 8                    # float64 score bytes, one request
        head_step = max(1, min(heads, chunk_bytes // per_head))
        batch_step = max(1, chunk_bytes // (per_head * heads)) if head_step == heads else 1
        scale = float(params["sm_scale"])
        device = inputs["q"].device
        out = torch.empty((batch, q_len, heads, LATENT), dtype=torch.float32, device=device)
        lse = torch.empty((batch, q_len, heads), dtype=torch.float32, device=device)
        for lo in range(0, batch, batch_step):
            hi = min(batch, lo + batch_step)
            q, keys, allowed = self._dense_layout(variant, inputs, torch.float64, lo, hi)
            n, total = hi - lo, keys.shape[1]
            for h0 in range(0, heads, head_step):
                h1 = min(heads, h0 + head_step)
                rows = q[:, h0:h1].reshape(n, (h1 - h0) * q_len, ROW)
                scores = torch.bmm(rows, keys.transpose(1, 2)).view(n, h1 - h0, q_len, total) * scale
                scores.masked_fill_(~allowed[:, None], -torch.inf)
                part_lse = torch.logsumexp(scores, dim=-1)                        # [n, h, Q]
                weights = scores.sub_(part_lse[..., None]).exp_().view(n, (h1 - h0) * q_len, total)
                part = torch.bmm(weights, keys[..., :LATENT]).view(n, h1 - h0, q_len, LATENT)
                out[lo:hi, :, h0:h1] = part.transpose(1, 2).float()
                lse[lo:hi, :, h0:h1] = part_lse.transpose(1, 2).float()
                del scores, weights, part
        if variant == "fp32":
            return {"out": out, "lse": lse}
        return {"out": out.view(batch * q_len, heads, LATENT), "lse": lse.view(batch * q_len, heads)}


SDPA_MEMORY_FRACTION = 0.85             # of free device memory SDPA's estimated need may take
REFERENCE_DEVICE_BYTES = 2 << 30        # float64 scores per chunk of the device reference


def _device_free_bytes() -> int | None:
    try:
        import torch

        return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None
    except Exception:   # noqa: BLE001 - no usable GPU: no memory estimate
        return None


def _paged_gather(inputs, width: int):
    """bf16_paged's inputs in contiguous form, dtypes as stored: q [B, Q, H, 576], each request's
    first `width` prefix rows [B, width, 576] (rows past its own prefix belong to another request or
    are NaN padding: `_keys_and_allowed` zeroes and masks them), its tree rows [B, Q, 576], its prefix
    length [B] and the tree part of its mask [B, Q, Q] (bool)."""
    import torch

    indptr = inputs["kv_indptr"].long()
    batch = indptr.numel() - 1
    q_len = inputs["tree_slots"].numel() // batch
    q = inputs["q"].view(batch, q_len, inputs["q"].shape[1], ROW)
    device = q.device
    prefix_len = indptr[1:] - indptr[:-1]
    indices = inputs["kv_indices"].long()
    pos = indptr[:-1, None] + torch.arange(width, device=device)[None]
    slots = indices[pos.clamp(max=indices.numel() - 1)] if width else pos
    keys_prefix = inputs["kv_buffer"][slots]
    keys_tree = inputs["kv_buffer"][inputs["tree_slots"].long().view(batch, q_len)]
    rows = torch.arange(q_len, device=device)
    mask_pos = (inputs["mask_indptr"].long()[:-1, None, None]
                + rows[None, :, None] * (prefix_len + q_len)[:, None, None]
                + prefix_len[:, None, None] + rows[None, None, :])
    return q, keys_prefix, keys_tree, prefix_len, inputs["custom_mask"][mask_pos].bool()


def _keys_and_allowed(keys_prefix, keys_tree, prefix_len, visibility):
    """Every request's keys in one row block, [B, W + Q, 576] (prefix rows past its own prefix
    zeroed), and what each of its tree rows may see, [B, Q, W + Q]: its prefix and its tree mask."""
    import torch

    width, q_len = keys_prefix.shape[1], keys_tree.shape[1]
    prefix_cols = torch.arange(width, device=keys_tree.device)[None] < prefix_len[:, None]   # [B, W]
    # rows past a request's prefix are another request's or NaN: zero them, then mask them
    keys = torch.cat([torch.where(prefix_cols[:, :, None], keys_prefix, 0.0), keys_tree], dim=1)
    allowed = torch.cat([prefix_cols[:, None, :].expand(-1, q_len, -1), visibility], dim=2)
    return keys, allowed


def attend_torch_bf16(inputs, width: int, sm_scale: float):
    """bf16_paged as a user writes it in bf16 torch: gather the paged bf16 keys, scores = bf16 GEMM
    with fp32 accumulation and fp32 output (torch.bmm(..., out_dtype=torch.float32) on CUDA), masked
    softmax in fp32 (logsumexp, exp), P rounded to bf16, bf16 GEMM for P·V (fp32 accumulation,
    bf16 output). `width` is the longest prefix (host metadata).

    Scores are fp32, not bf16 (the HF-eager habit of a bf16 `q @ k.T`): that is how our kernel and
    FlashAttention-style kernels keep them (the MMA accumulates and stays in fp32), and the op has an
    lse output. bf16 scores carry a rounding of |s|·2^-9 each (~0.01 at this op's logit scale), which
    puts lse ~1e-2 off and every softmax weight up to ~1% off: a different, less precise op, not a
    faster way to compute this one. fp32 scores cost the GEMM nothing (same MMA, fp32 epilogue) and
    the elementwise softmax passes twice the bytes of bf16 ones.
    On the CPU (tests) the score GEMM runs on the upcast inputs: the same math (products of bf16
    values are exact in fp32, sums in fp32)."""
    import torch

    q, keys_prefix, keys_tree, prefix_len, visibility = _paged_gather(inputs, width)      # bf16 as stored
    batch, q_len, heads, _ = q.shape
    keys, allowed = _keys_and_allowed(keys_prefix, keys_tree, prefix_len, visibility)
    q = q.view(batch, q_len * heads, ROW)
    scores = _score_gemm()(q, keys).view(batch, q_len, heads, -1) * sm_scale
    scores = scores.masked_fill(~allowed[:, :, None, :], -torch.inf)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse[..., None]).to(torch.bfloat16).view(batch, q_len * heads, -1)
    out = torch.bmm(weights, keys[..., :LATENT])                                        # bf16
    return {"out": out.view(batch * q_len, heads, LATENT), "lse": lse.reshape(batch * q_len, heads)}


@functools.lru_cache(maxsize=None)
def _score_gemm():
    """The score GEMM of attend_torch_bf16 (bf16 in, fp32 accumulation and output), kept out of
    torch.compile: Inductor (torch 2.11) fails on bmm's out_dtype, and it would hand this GEMM to
    cuBLAS anyway; the gathers, mask and softmax around it are compiled."""
    import torch

    def gemm(q, keys):
        if q.is_cuda:
            return torch.bmm(q, keys.transpose(1, 2), out_dtype=torch.float32)
        return torch.bmm(q.float(), keys.transpose(1, 2).float())
    return torch.compiler.disable(gemm)


@functools.lru_cache(maxsize=None)
def _compiled_bf16():
    """torch.compile of attend_torch_bf16, made once per process (dynamic shapes)."""
    import torch

    return torch.compile(attend_torch_bf16, dynamic=True)


@functools.lru_cache(maxsize=None)
def _compiled_run_torch(variant: str):
    """torch.compile of run_torch for one variant, made once per process (dynamic shapes)."""
    import logging

    import torch

    torch._logging.set_logs(dynamo=logging.ERROR)    # the graph break at int(prefix_len.max()) is expected
    return torch.compile(functools.partial(OP.run_torch, variant), dynamic=True)


OP = VerifyAttn()
