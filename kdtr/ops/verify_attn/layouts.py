"""The two layouts verify_attn's variants store the same math in (docs/ops/verify_attn.md), one object each.

A layout knows its tensors: names and dtypes, the index checks, how generated requests are packed,
the per-request view the numpy reference reads, the one dense gather every torch path uses (the
torch backend, the bf16 baseline, the device reference, SDPA), the outputs' shapes and the kernel
arguments. Nothing outside this module tells the variants apart.
"""

from __future__ import annotations

import math
from typing import Iterator, Mapping

import numpy as np

from ...dtypes import NUMPY_DTYPES
from .._common import take_leading
from ..base import Tolerance
from .paging import pool_rows, request_slots

LATENT, ROPE = 512, 64
ROW = LATENT + ROPE                          # one 576-wide latent KV row per token


def check_scale(params) -> None:
    scale = params["sm_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
        raise ValueError(f"params.sm_scale must be a finite number, got {scale!r}")


def dense_keys(keys_prefix, keys_tree, prefix_len, visibility):
    """Every request's keys in one row block, [n, W + Q, 576] (prefix rows past its own prefix
    zeroed), and what each of its tree rows may see, [n, Q, W + Q]: its prefix and its tree mask."""
    import torch

    width, q_len = keys_prefix.shape[1], keys_tree.shape[1]
    prefix_cols = torch.arange(width, device=keys_tree.device)[None] < prefix_len[:, None]   # [n, W]
    # rows past a request's prefix are another request's or NaN: zero them, then mask them
    keys = torch.cat([torch.where(prefix_cols[:, :, None], keys_prefix, 0.0), keys_tree], dim=1)
    allowed = torch.cat([prefix_cols[:, None, :].expand(-1, q_len, -1), visibility], dim=2)
    return keys, allowed


class Dense:
    """`fp32`: contiguous per-request KV [B, S, 576] (rows past P_b + Q are NaN padding), exact FP32."""

    name = "fp32"
    input_specs = {"q": "f32", "kv": "f32", "prefix_len": "i32", "visibility": "u8"}
    out_dtype = "f32"
    compute_unit = "fp32_fma"         # the exact variant (FP32 FMA, no tensor cores)
    # Figures for the default input scale (outputs of rms ~0.04, max ~0.7; lse ~8).
    tolerances = {
        # FP32 dots over 576 dims and a softmax over up to ~10^5 keys: the torch backend's worst
        # element is ~1e-6 off the float64 result; 4x margin. Norm-wise the contract is 1e-6 of the
        # float64 result (measured: ~5e-7).
        "out": Tolerance(atol=4e-6, rtol=1e-4, l2=1e-6),
        # lse is ~8: an f32 ulp there is ~1e-6; 1e-5 allows a few.
        "lse": Tolerance(atol=1e-5, rtol=1e-6),
    }
    baseline_tolerances = {
        # torch's FP32 path (cuBLAS SGEMM and its summation orders; SDPA's math path) landed at
        # 1.1-1.5e-6 of the float64 result in norm on the H200 (results/bench-20261129-121548-
        # h200.json), just over our kernel's 1e-6 contract: a speed baseline must compute the op,
        # not meet that contract. Elementwise bounds stay.
        "out": Tolerance(atol=4e-6, rtol=1e-4, l2=1e-5),
        "lse": tolerances["lse"],
    }

    def input_bytes(self, batch, heads, keys, q_len, slots="tokens") -> tuple[int, int]:
        """Host bytes of a case's generated inputs, and of the generator's float32 draw of its KV."""
        return 4 * (batch * keys * ROW + batch * q_len * heads * ROW) + batch * q_len * q_len, 4 * keys * ROW

    def check(self, inputs) -> tuple[int, np.ndarray]:
        q = inputs["q"]
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
        return q_len, inputs["visibility"]

    def pack(self, normal, rng, prefix_len, visibility, heads, slots="tokens") -> dict[str, np.ndarray]:
        """`slots` is the paged layout's (VerifyAttn.check_params keeps it at its default here)."""
        batch, q_len = visibility.shape[:2]
        rows = int(prefix_len.max()) + q_len
        kv = np.full((batch, rows, ROW), np.nan, np.float32)      # padding rows are NaN
        for b in range(batch):
            normal(kv[b, :prefix_len[b] + q_len])
        q = normal(np.empty((batch, q_len, heads, ROW), np.float32))
        return {"q": q, "kv": kv, "prefix_len": prefix_len, "visibility": visibility}

    def requests(self, inputs) -> Iterator[tuple[np.ndarray, np.ndarray, int, np.ndarray]]:
        q_len = inputs["q"].shape[1]
        for b, prefix_len in enumerate(inputs["prefix_len"]):
            keys = inputs["kv"][b, :prefix_len + q_len]
            yield inputs["q"][b], keys, int(prefix_len), inputs["visibility"][b]

    def dims(self, inputs) -> tuple[int, int, int, int]:
        """(B, Q, H, a bound on every request's P_b + Q), from shapes only (numpy or torch)."""
        batch, q_len, heads, _ = inputs["q"].shape
        return batch, q_len, heads, inputs["kv"].shape[1]

    def request_keys(self, inputs) -> int:
        """One request's keys as the split choice prices them, from shapes only: the padded bound."""
        return inputs["kv"].shape[1]

    def longest_prefix(self, inputs) -> int:
        return int(inputs["prefix_len"].max())

    def prefixes_and_masks(self, inputs) -> tuple[np.ndarray, np.ndarray]:
        """Every request's prefix length P_b [B] (int64) and tree mask [B, Q, Q], without touching K/V."""
        return inputs["prefix_len"].astype(np.int64), inputs["visibility"]

    def kv_tokens(self, inputs) -> int:
        return int(inputs["prefix_len"].sum()) + inputs["visibility"].shape[0] * inputs["visibility"].shape[1]

    def gather(self, inputs, width: int | None = None, lo: int = 0, hi: int | None = None):
        """Requests lo..hi of torch inputs, dtypes as stored: q [n, Q, H, 576], the first `width`
        (default: the longest of these) prefix rows [n, W, 576] (rows past a request's own prefix
        are padding: dense_keys zeroes and masks them), the tree rows [n, Q, 576], the prefix
        lengths [n] and the tree part of the mask [n, Q, Q] (bool)."""
        import torch

        batch, q_len = inputs["q"].shape[:2]
        hi = batch if hi is None else hi
        prefix_len = inputs["prefix_len"][lo:hi].long()
        width = int(prefix_len.max()) if width is None else width
        kv = inputs["kv"][lo:hi]
        device = kv.device
        tree_rows = prefix_len[:, None] + torch.arange(q_len, device=device)[None]
        keys_tree = kv[torch.arange(hi - lo, device=device)[:, None], tree_rows]
        return inputs["q"][lo:hi], kv[:, :width], keys_tree, prefix_len, inputs["visibility"][lo:hi].bool()

    def flat(self, tensor):
        """An output computed as [B, Q, H, ...] in this layout's shape."""
        return tensor

    def take(self, inputs, indices) -> dict[str, np.ndarray]:
        """The requests `indices` (in that order) as a batch of their own (numpy)."""
        return take_leading(inputs, {}, indices)[0]

    def by_request(self, output: np.ndarray, batch: int) -> np.ndarray:
        """An output with one leading axis per request."""
        return output

    def output_specs(self, inputs):
        batch, q_len, heads, _ = inputs["q"].shape
        return {"out": ("f32", (batch, q_len, heads, LATENT)), "lse": ("f32", (batch, q_len, heads))}

    def kernel_operands(self, inputs) -> list:
        return [inputs["q"], inputs["kv"]]

    def kernel_tail(self, inputs, batch, q_len, heads, kv_bound, sm_scale, splits) -> list:
        from ctypes import c_float, c_int

        return [inputs["prefix_len"], inputs["visibility"], c_int(batch), c_int(q_len), c_int(heads),
                c_int(kv_bound), c_float(sm_scale), c_int(splits)]


class Paged:
    """`bf16_paged`: SGLang's page-size-1 token pool, bf16 inputs, bf16 out and f32 lse."""

    name = "bf16_paged"
    input_specs = {"q": "bf16", "kv_buffer": "bf16", "kv_indptr": "i32", "kv_indices": "i32",
                   "tree_slots": "i32", "custom_mask": "u8", "mask_indptr": "i32"}
    out_dtype = "bf16"
    compute_unit = "bf16_mma"
    tolerances = {
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
    baseline_tolerances = {
        # out: the op's bf16 bound as it is. It was derived for exactly the bf16 baseline's
        # numerics (fp32 scores, softmax weights rounded to bf16 for P·V, the output rounded to
        # bf16), so a baseline that passes it computes the op as precisely as our kernel must.
        "out": tolerances["out"],
        # lse: 1e-4 instead of our kernel's 1e-5. cuBLAS chooses its own fp32 summation order
        # (split-K) for the 576-long score dots (unscaled scores reach ~±40, an f32 ulp there is
        # ~4e-6) and torch's logsumexp sums up to 1.3e5 terms; an lse off by 1e-4 moves exp(lse)
        # by 1e-4 relative, 20x below one bf16 rounding of the output (2^-9 = 2e-3), so a
        # baseline within it is still exact at the precision of the op's bf16 output.
        "lse": Tolerance(atol=1e-4, rtol=1e-6),
    }

    def input_bytes(self, batch, heads, keys, q_len, slots="tokens") -> tuple[int, int]:
        """Host bytes of a case's generated inputs (the pool holds a quarter of unused slots or
        pages), and of the generator's float32 draw of the pool."""
        pool = pool_rows(np.full(batch, keys), slots)
        return 2 * (pool + batch * q_len * heads) * ROW + 4 * pool + 2 * batch * q_len * keys, 4 * pool * ROW

    def check(self, inputs) -> tuple[int, np.ndarray]:
        q = inputs["q"]
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
        return q_len, np.stack([m for *_, m in self.requests(inputs)])

    def pack(self, normal, rng, prefix_len, visibility, heads, slots="tokens") -> dict[str, np.ndarray]:
        """`slots`: how the keys sit in the pool (paging.request_slots); unused slots are NaN."""
        batch, q_len = visibility.shape[:2]
        bf16 = NUMPY_DTYPES["bf16"]
        kv_indices, tree_slots, pool = request_slots(rng, prefix_len, q_len, slots)
        kv_buffer = normal(np.empty((pool, ROW), bf16))
        unused = np.ones(pool, bool)
        unused[kv_indices] = unused[tree_slots] = False
        kv_buffer[unused] = np.nan
        kv_indptr = np.concatenate([[0], np.cumsum(prefix_len)]).astype(np.int32)
        masks = []
        for b in range(batch):
            mask = np.ones((q_len, prefix_len[b] + q_len), np.uint8)
            mask[:, prefix_len[b]:] = visibility[b]
            masks.append(mask.ravel())
        mask_indptr = np.concatenate([[0], np.cumsum([m.size for m in masks])]).astype(np.int32)
        return {"q": normal(np.empty((batch * q_len, heads, ROW), bf16)), "kv_buffer": kv_buffer,
                "kv_indptr": kv_indptr, "kv_indices": kv_indices, "tree_slots": tree_slots,
                "custom_mask": np.concatenate(masks), "mask_indptr": mask_indptr}

    def requests(self, inputs) -> Iterator[tuple[np.ndarray, np.ndarray, int, np.ndarray]]:
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

    def dims(self, inputs) -> tuple[int, int, int, int]:
        batch = inputs["kv_indptr"].shape[0] - 1
        q_len = inputs["tree_slots"].shape[0] // batch
        return batch, q_len, inputs["q"].shape[1], inputs["kv_indices"].shape[0] + q_len   # >= every P_b + Q

    def request_keys(self, inputs) -> int:
        """One request's keys as the split choice prices them, from shapes only (no device read, so
        graph-capturable): the mean, ceil(sum P_b / B) + Q, exact when the prefixes are equal (the
        bound of `dims` is B times that for a batch)."""
        batch, q_len, _, _ = self.dims(inputs)
        return -(-inputs["kv_indices"].shape[0] // batch) + q_len

    def longest_prefix(self, inputs) -> int:
        return int((inputs["kv_indptr"][1:] - inputs["kv_indptr"][:-1]).max())

    def prefixes_and_masks(self, inputs) -> tuple[np.ndarray, np.ndarray]:
        """As Dense's: P_b from kv_indptr, the tree columns of each request's custom_mask rows."""
        indptr, mask_indptr = inputs["kv_indptr"], inputs["mask_indptr"]
        prefix_len = np.diff(indptr).astype(np.int64)
        q_len = len(inputs["tree_slots"]) // len(prefix_len)
        masks = [inputs["custom_mask"][mask_indptr[b]:mask_indptr[b + 1]].reshape(q_len, p + q_len)[:, p:]
                 for b, p in enumerate(prefix_len)]
        return prefix_len, np.stack(masks) if masks else np.zeros((0, q_len, q_len), np.uint8)

    def kv_tokens(self, inputs) -> int:
        return int(inputs["kv_indices"].size + inputs["tree_slots"].size)

    def gather(self, inputs, width: int | None = None, lo: int = 0, hi: int | None = None):
        """As Dense.gather, from the pool: q [n, Q, H, 576] is a view of the stored [B*Q, H, 576]."""
        import torch

        indptr = inputs["kv_indptr"].long()
        batch = indptr.numel() - 1
        hi = batch if hi is None else hi
        q_len = inputs["tree_slots"].numel() // batch
        q = inputs["q"][lo * q_len:hi * q_len].view(hi - lo, q_len, inputs["q"].shape[1], ROW)
        device = q.device
        prefix_len = (indptr[1:] - indptr[:-1])[lo:hi]
        width = int(prefix_len.max()) if width is None else width
        indices = inputs["kv_indices"].long()
        pos = indptr[lo:hi, None] + torch.arange(width, device=device)[None]
        slots = indices[pos.clamp(max=indices.numel() - 1)] if width else pos
        keys_prefix = inputs["kv_buffer"][slots]
        keys_tree = inputs["kv_buffer"][inputs["tree_slots"].long().view(batch, q_len)[lo:hi]]
        rows = torch.arange(q_len, device=device)
        mask_pos = (inputs["mask_indptr"].long()[lo:hi, None, None]
                    + rows[None, :, None] * (prefix_len + q_len)[:, None, None]
                    + prefix_len[:, None, None] + rows[None, None, :])
        return q, keys_prefix, keys_tree, prefix_len, inputs["custom_mask"][mask_pos].bool()

    def flat(self, tensor):
        return tensor.reshape((-1,) + tuple(tensor.shape[2:]))

    def take(self, inputs, indices) -> dict[str, np.ndarray]:
        """The requests `indices` (in that order) as a batch of their own, over the same pool."""
        indptr, mask_indptr = inputs["kv_indptr"], inputs["mask_indptr"]
        q_len = len(inputs["tree_slots"]) // (len(indptr) - 1)

        def rows(name, starts, ends):
            return np.concatenate([inputs[name][starts[b]:ends[b]] for b in indices])

        def offsets(starts, ends):
            return np.concatenate([[0], np.cumsum([ends[b] - starts[b] for b in indices])]).astype(np.int32)

        per_q = np.arange(len(indptr)) * q_len
        return {"q": rows("q", per_q, per_q + q_len), "kv_buffer": inputs["kv_buffer"],
                "kv_indptr": offsets(indptr[:-1], indptr[1:]),
                "kv_indices": rows("kv_indices", indptr[:-1], indptr[1:]),
                "tree_slots": rows("tree_slots", per_q, per_q + q_len),
                "custom_mask": rows("custom_mask", mask_indptr[:-1], mask_indptr[1:]),
                "mask_indptr": offsets(mask_indptr[:-1], mask_indptr[1:])}

    def by_request(self, output: np.ndarray, batch: int) -> np.ndarray:
        return output.reshape((batch, -1) + tuple(output.shape[1:]))

    def output_specs(self, inputs):
        rows, heads, _ = inputs["q"].shape
        return {"out": ("bf16", (rows, heads, LATENT)), "lse": ("f32", (rows, heads))}

    def kernel_operands(self, inputs) -> list:
        return [inputs[n] for n in ("q", "kv_buffer", "kv_indptr", "kv_indices", "tree_slots",
                                    "custom_mask", "mask_indptr")]

    def kernel_tail(self, inputs, batch, q_len, heads, kv_bound, sm_scale, splits) -> list:
        from ctypes import c_float, c_int

        return [c_int(batch), c_int(q_len), c_int(heads), c_float(sm_scale * math.log2(math.e)), c_int(splits)]


LAYOUTS: Mapping[str, Dense | Paged] = {"fp32": Dense(), "bf16_paged": Paged()}
