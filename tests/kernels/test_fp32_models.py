"""A numpy model of fp32_dmma's (kernels/verify_attn_fp32_dmma.cu) index math and reduction structure,
checked against VerifyAttn.reference (float64) on CPU: which block owns which rows and keys
(per-request splits, empty splits, 16-key sub-tiles, the empty last split of the timing shape), q . k
in float64 (exact products; 4 dim-quarter partials added in quarter order, one rounding to float32
after the scale), the masks, the online softmax with its rescale across sub-tiles, the partial layout
and the merge. The model computes in float32 at every point where the kernel rounds to fp32 (the
scaled score, p, l, O, the merge); where numpy's float32 sum order differs from the kernel's fmaf
chains (over a sub-tile's keys) results move by float32 roundings only. Also: its lane layouts cover
every output once."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdtr.ops.base import Case
from kdtr.ops.verify_attn import LATENT, OP, ROW
from kdtr.ops.verify_attn.cuda import splits_for

KERNEL = OP.cuda_kernel("fp32_dmma", "fp32")
SMS = 132                                   # H200
DMMA_QUARTER = 144                          # dims of one S warp's partial
ROUND_KEYS = 16                             # a split's length is rounded up to one sub-tile


def model_block_dmma(qr, keys, allowed, sm_scale, kbeg, kend):
    """fp32_dmma's block: [kbeg, kend) in 16-key sub-tiles; q . k in float64 per dim quarter, the
    quarters added in order, s = float32(dot * sm_scale); then the same online softmax and O update
    in float32 as the kernel (O = alpha O, then + P V)."""
    rows = qr.shape[0]
    m = np.full(rows, -np.inf, np.float32)
    l = np.zeros(rows, np.float32)
    o = np.zeros((rows, LATENT), np.float32)
    q64 = qr.astype(np.float64)
    for key0 in range(kbeg, kend, 16):
        kt = keys[key0:min(key0 + 16, kend)]
        k64 = kt.astype(np.float64)
        dot = np.zeros((rows, kt.shape[0]))
        for w in range(ROW // DMMA_QUARTER):
            d = slice(w * DMMA_QUARTER, (w + 1) * DMMA_QUARTER)
            dot = dot + q64[:, d] @ k64[:, d].T
        ok = allowed[:, key0:key0 + kt.shape[0]]
        s = np.where(ok, (dot * float(np.float32(sm_scale))).astype(np.float32), -np.inf).astype(np.float32)
        m_new = np.maximum(m, s.max(axis=1))
        with np.errstate(invalid="ignore"):
            p = np.where(ok, np.exp(s - m_new[:, None]), 0).astype(np.float32)
            alpha = np.where(m_new == -np.inf, 1, np.exp(m - m_new)).astype(np.float32)
        l = (l * alpha + p.sum(axis=1, dtype=np.float32)).astype(np.float32)
        o = ((alpha[:, None] * o).astype(np.float32) + p @ kt[:, :LATENT]).astype(np.float32)
        m = m_new
    return o, m, l


def model_run(inputs, params, splits=None):
    """The whole launch: grid (row tiles, B, splits), then the merge when splits > 1."""
    q, kv, prefix_len, vis = inputs["q"], inputs["kv"], inputs["prefix_len"], inputs["visibility"]
    batch, q_len, heads, _ = q.shape
    rows_req = q_len * heads
    rows_per_block = KERNEL.rows
    tiles = math.ceil(rows_req / rows_per_block)
    if splits is None:
        splits = splits_for(KERNEL, tiles * batch, kv.shape[1], SMS, batch * rows_req)
    scale = float(params["sm_scale"])
    out = np.full((batch, rows_req, LATENT), np.nan, np.float32)
    lse = np.full((batch, rows_req), np.nan, np.float32)
    owner = np.zeros((batch, rows_req, kv.shape[1]), np.int32)       # blocks that read (row, key)
    for b in range(batch):
        plen = int(prefix_len[b])
        kvlen = plen + q_len
        keys = kv[b, :kvlen]
        qb = q[b].reshape(rows_req, ROW)
        allowed = np.ones((rows_req, kvlen), bool)
        allowed[:, plen:] = np.repeat(vis[b].astype(bool), heads, axis=0)   # row i*H + h -> token i
        chunk = (-(-kvlen // splits) + ROUND_KEYS - 1) // ROUND_KEYS * ROUND_KEYS
        ws = []
        for z in range(splits):
            kbeg = min(z * chunk, kvlen)
            kend = min(kbeg + chunk, kvlen)
            parts = []
            for t in range(tiles):
                r0, r1 = t * rows_per_block, min(rows_req, (t + 1) * rows_per_block)
                parts.append(model_block_dmma(qb[r0:r1], keys, allowed[r0:r1], scale, kbeg, kend))
                owner[b, r0:r1, kbeg:kend] += 1
            ws.append(tuple(np.concatenate(x) for x in zip(*parts)))
        if splits == 1:
            o, m, l = ws[0]
            out[b], lse[b] = o / l[:, None], m + np.log(l)
            continue
        big_m = np.max([m for _, m, _ in ws], axis=0)                # merge: ascending z
        acc = np.zeros((rows_req, LATENT), np.float32)
        tot = np.zeros(rows_req, np.float32)
        for o, m, l in ws:
            seen = m != -np.inf                                      # an empty split is skipped
            w = np.where(seen, np.exp(np.where(seen, m - big_m, 0)), 0).astype(np.float32)
            tot = (tot + w * l).astype(np.float32)
            acc = (acc + w[:, None] * np.where(seen[:, None], o, 0)).astype(np.float32)
        out[b], lse[b] = acc / tot[:, None], big_m + np.log(tot)
    for b in range(batch):                 # every real key read exactly once per row, padding never
        kvlen = int(prefix_len[b]) + q_len
        assert np.all(owner[b, :, :kvlen] == 1) and not owner[b, :, kvlen:].any()
    return {"out": out.reshape(batch, q_len, heads, LATENT), "lse": lse.reshape(batch, q_len, heads)}, splits


def check(got, want):
    # The op's own fp32 tolerances (VerifyAttn.tolerances: out elementwise 4e-6 + 1e-4 |r|, rel L2
    # 1e-6; lse 1e-5 + 1e-6 |r|): the contract the CUDA kernels must meet, so each model's grouping
    # of the sums (dim partials, key tiles, split merge) must meet it too.
    tol = OP.tolerances("fp32")
    for name in ("out", "lse"):
        g, w, t = got[name].astype(np.float64), want[name].astype(np.float64), tol[name]
        assert np.all(np.isfinite(g)), name
        bad = np.abs(g - w) > t.atol + t.rtol * np.abs(w)
        assert not bad.any(), (name, np.argwhere(bad)[:3], np.abs(g - w).max())
        if t.l2 is not None:
            rel = np.linalg.norm(g - w) / np.linalg.norm(w)
            assert rel <= t.l2, (name, rel)


CASES = [   # (params, forced splits, expected splits from the host's rule)
    (dict(batch=1, heads=16, prefix=2048, budget=16), None, 16),          # the timing shape
    (dict(batch=3, heads=8, prefix=300, budget=8, prefix_mode="mixed"), None, None),
    (dict(batch=2, heads=5, prefix=0, budget=4), None, None),             # no prefix, odd H
    (dict(batch=1, heads=3, prefix=37, budget=20, sharpness=0.2), None, None),   # prefix < a split
    (dict(batch=2, heads=5, prefix=700, budget=12, prefix_mode="mixed"), 1, 1),  # 12 tiles, direct
    (dict(batch=2, heads=5, prefix=700, budget=12, prefix_mode="mixed"), 3, 3),  # multi-tile splits
    (dict(batch=3, heads=1, prefix=90, budget=6, prefix_mode="mixed"), 13, 13),  # empty splits
]


@pytest.mark.parametrize("params,splits,expect", CASES, ids=[str(i) for i in range(len(CASES))])
def test_model_matches_reference(params, splits, expect):
    merged = {p.name: p.default for p in OP.params} | params
    gen = OP.generate(Case("verify_attn-fp32-s11", OP.name, "fp32", 11, merged))
    OP.check_inputs("fp32", gen.inputs, gen.params)
    want = OP.reference("fp32", gen.inputs, gen.params)
    got, used = model_run(gen.inputs, gen.params, splits)
    if expect is not None:
        assert used == expect
    check(got, want)


def test_timing_shape_grid():
    """B=1 H=16 Q=17 P=2048 on 132 SMs, one wave: 8 row tiles of 34 x 16 splits of <= 144 keys
    (9 sub-tiles of 16; the last split empty). Every key in exactly one split."""
    tiles = math.ceil(17 * 16 / KERNEL.rows)
    splits = splits_for(KERNEL, tiles, 2048 + 17, SMS, 17 * 16)
    assert (tiles, splits) == (8, 16) and tiles * splits <= SMS
    chunk = (-(-2065 // splits) + ROUND_KEYS - 1) // ROUND_KEYS * ROUND_KEYS
    assert chunk == 144
    assert [min(2065, (z + 1) * chunk) - min(2065, z * chunk) for z in range(splits)] == [144] * 14 + [49, 0]


def test_dmma_lane_layouts_cover_each_output_once():
    """fp32_dmma, as its .cu computes the maps: each S warp's MMAs take every dim of its quarter once
    (group G = 9 w + jg, k-step u, lane t -> dim 16 G + 4 t + u) and write every (row < 34, key < 16)
    of its partial once (C: keys g / g + 8, rows 8 n + 2 t, + 1); the softmax threads own every
    (row, key) once; the O warps every (row, column) of the 34 x 512 tile once."""
    rows, keys = KERNEL.rows, KERNEL.keys
    for sw in range(4):
        dims = [16 * (9 * sw + jg) + 4 * t + u for jg in range(9) for u in range(4) for t in range(4)]
        assert sorted(dims) == list(range(DMMA_QUARTER * sw, DMMA_QUARTER * (sw + 1)))
    written = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for n in range(5):
            row = 8 * n + 2 * t                          # c0, c2: (row, g), (row, g + 8); c1, c3: row + 1
            written += [(r, k) for r in (row, row + 1) for k in (g, g + 8) if r < rows]
    assert len(written) == rows * keys and set(written) == {(r, k) for r in range(rows) for k in range(keys)}
    soft = [(tid >> 2, 4 * (tid & 3) + k) for tid in range(256) if tid >> 2 < rows for k in range(4)]
    assert len(soft) == rows * keys and set(soft) == {(r, k) for r in range(rows) for k in range(keys)}
    o_tile = [((w & 1) * (rows // 2) + r, 4 * (32 * (w >> 1) + lane) + c)
              for w in range(8) for lane in range(32) for r in range(rows // 2) for c in range(4)]
    assert len(o_tile) == rows * LATENT and set(o_tile) == {(r, c) for r in range(rows) for c in range(LATENT)}
