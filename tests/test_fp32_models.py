"""Numpy models of the fp32 verify_attn kernels' index math and reduction structure, checked against
VerifyAttn.reference (float64) on CPU: which block owns which rows and keys (per-request splits,
empty splits, key tiles, the short last split of the timing shape), how the dot products are grouped,
the masks, the online softmax with its rescale across tiles, the partial layout and the merge.
- fp32_gemm (kernels/verify_attn_fp32_gemm.cu): 68-row blocks, 64-key tiles, 8 dim-group partials in
  float32 added in group order.
- fp32_dmma (kernels/verify_attn_fp32_dmma.cu): 34-row blocks, 16-key sub-tiles, q . k in float64
  (exact products; 4 dim-quarter partials added in quarter order), one rounding to float32 after the
  scale.
A model computes in float32 at every point where its kernel rounds to fp32 (the scaled score, p, l,
O, the merge); where numpy's float32 sum order differs from the kernel's fmaf chains (inside a dim
group, over a tile's keys) results move by float32 roundings only. Also: lane layouts cover every
output once, and the host's shared-memory formula equals the .cu's (NVRTC)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdtr.ops.base import Case
from kdtr.ops.verify_attn import LATENT, OP, ROW, fp32_gemm_sizing

KERNEL = OP.CUDA_KERNELS["fp32_gemm"]
SMS = 132                                   # H200
KEYS = 64                                   # FK_KEYS
GROUP_OF_DIM = (np.arange(ROW) % 64) // 8   # dim d -> dim group (one warp pair) of its partial sum
DMMA_QUARTER = 144                          # fp32_dmma: dims of one S warp's partial


def model_block(qr, keys, allowed, sm_scale, kbeg, kend):
    """One block: rows qr [R, 576] (f32), keys [kvlen, 576], allowed [R, kvlen] -> (o, m, l),
    o unnormalised (what ws_o holds), as the kernel walks [kbeg, kend) in 64-key tiles."""
    rows = qr.shape[0]
    m = np.full(rows, -np.inf, np.float32)
    l = np.zeros(rows, np.float32)
    o = np.zeros((rows, LATENT), np.float32)
    for key0 in range(kbeg, kend, KEYS):
        kt = keys[key0:min(key0 + KEYS, kend)]
        parts = [qr[:, GROUP_OF_DIM == g] @ kt[:, GROUP_OF_DIM == g].T for g in range(8)]
        dot = np.zeros_like(parts[0])
        for p in parts:                                      # partials added in group order
            dot = (dot + p).astype(np.float32)
        ok = allowed[:, key0:key0 + kt.shape[0]]
        s = np.where(ok, np.float32(sm_scale) * dot, -np.inf).astype(np.float32)
        m_new = np.maximum(m, s.max(axis=1))
        with np.errstate(invalid="ignore"):
            p = np.where(ok, np.exp(s - m_new[:, None]), 0).astype(np.float32)
            alpha = np.where(m_new == -np.inf, 1, np.exp(m - m_new)).astype(np.float32)
        l = (l * alpha + p.sum(axis=1, dtype=np.float32)).astype(np.float32)
        o = (alpha[:, None] * o + p @ kt[:, :LATENT]).astype(np.float32)
        m = m_new
    return o, m, l


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


# kernel -> (block model, keys a split's length is rounded up to)
MODELS = {"fp32_gemm": (model_block, 8), "fp32_dmma": (model_block_dmma, 16)}


def model_run(inputs, params, splits=None, rows_per_block=KERNEL.rows, kernel="fp32_gemm"):
    """The whole launch: grid (row tiles, B, splits), then the merge when splits > 1."""
    q, kv, prefix_len, vis = inputs["q"], inputs["kv"], inputs["prefix_len"], inputs["visibility"]
    batch, q_len, heads, _ = q.shape
    rows_req = q_len * heads
    tiles = math.ceil(rows_req / rows_per_block)
    block, round_keys = MODELS[kernel]
    if splits is None:
        splits = OP._splits(OP.CUDA_KERNELS[kernel], tiles * batch, kv.shape[1], SMS)
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
        chunk = (-(-kvlen // splits) + round_keys - 1) // round_keys * round_keys
        ws = []
        for z in range(splits):
            kbeg = min(z * chunk, kvlen)
            kend = min(kbeg + chunk, kvlen)
            parts = []
            for t in range(tiles):
                r0, r1 = t * rows_per_block, min(rows_req, (t + 1) * rows_per_block)
                parts.append(block(qb[r0:r1], keys, allowed[r0:r1], scale, kbeg, kend))
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


CASES = [   # (params, forced splits, expected splits from the host's rule: fp32_gemm's)
    (dict(batch=1, heads=16, prefix=2048, budget=16), None, 33),          # the timing shape
    (dict(batch=3, heads=8, prefix=300, budget=8, prefix_mode="mixed"), None, None),
    (dict(batch=2, heads=5, prefix=0, budget=4), None, None),             # no prefix, odd H
    (dict(batch=1, heads=3, prefix=37, budget=20, sharpness=0.2), None, None),   # prefix < a split
    (dict(batch=2, heads=5, prefix=700, budget=12, prefix_mode="mixed"), 1, 1),  # 12 tiles, direct
    (dict(batch=2, heads=5, prefix=700, budget=12, prefix_mode="mixed"), 3, 3),  # multi-tile splits
    (dict(batch=3, heads=1, prefix=90, budget=6, prefix_mode="mixed"), 13, 13),  # empty splits
]


@pytest.mark.parametrize("kernel", list(MODELS))
@pytest.mark.parametrize("params,splits,expect", CASES, ids=[str(i) for i in range(len(CASES))])
def test_model_matches_reference(params, splits, expect, kernel):
    merged = {p.name: p.default for p in OP.params} | params
    gen = OP.generate(Case("verify_attn-fp32-s11", OP.name, "fp32", 11, merged))
    OP.check_inputs("fp32", gen.inputs, gen.params)
    want = OP.reference("fp32", gen.inputs, gen.params)
    got, used = model_run(gen.inputs, gen.params, splits, OP.CUDA_KERNELS[kernel].rows, kernel)
    if expect is not None:
        assert used == (expect if kernel == "fp32_gemm" or splits else 16)   # fp32_dmma: 8 row tiles x 16
    check(got, want)


@pytest.mark.parametrize("kernel,grid,chunk_keys,sizes", [
    ("fp32_gemm", (4, 33), 64, [64] * 32 + [17]),
    ("fp32_dmma", (8, 16), 144, [144] * 14 + [49, 0]),
])
def test_timing_shape_grid(kernel, grid, chunk_keys, sizes):
    """B=1 H=16 Q=17 P=2048 on 132 SMs, one wave: fp32_gemm 4 row tiles of 68 x 33 splits (32 of 64
    keys + one of 17); fp32_dmma 8 row tiles of 34 x 16 splits of <= 144 keys (9 sub-tiles of 16; the
    last split empty). Every key in exactly one split."""
    k = OP.CUDA_KERNELS[kernel]
    tiles = math.ceil(17 * 16 / k.rows)
    splits = OP._splits(k, tiles, 2048 + 17, SMS)
    assert (tiles, splits) == grid and tiles * splits <= SMS
    round_keys = MODELS[kernel][1]
    chunk = (-(-2065 // splits) + round_keys - 1) // round_keys * round_keys
    assert chunk == chunk_keys
    assert [min(2065, (z + 1) * chunk) - min(2065, z * chunk) for z in range(splits)] == sizes


def lane_layouts(rows, qb, pb):
    """The .cu's lane -> (row, key) map of pass A and lane -> (row, column) map of pass B, for every
    warp (512 threads): arow/akey/AR/AK/AKS and prow/pcol as the kernel computes them."""
    a_quarter = rows // 4
    pass_a, pass_b = [], []
    for tid in range(512):
        lane, warp = tid & 31, tid >> 5
        rg, grp = warp & 1, warp >> 1
        if qb:
            arow, akey, ar, ak, aks = rg * 2 * a_quarter, lane, 2 * a_quarter, 2, 32
        else:
            arow, akey, ar, ak, aks = rg * 2 * a_quarter + (lane >> 4) * a_quarter, lane & 15, a_quarter, 4, 16
        pass_a += [(grp, arow + r, akey + aks * j) for r in range(ar) for j in range(ak)]
        if pb:
            prow, pcol = (warp & 3) * a_quarter, (warp >> 2) * 128 + 4 * lane
        else:
            prow, pcol = rg * 2 * a_quarter + (lane >> 4) * a_quarter, grp * 64 + 4 * (lane & 15)
        pass_b += [(prow + r, pcol + c) for r in range(a_quarter) for c in range(4)]
    return pass_a, pass_b


@pytest.mark.parametrize("qb,pb", [(1, 0), (0, 0), (1, 1), (0, 1)])
@pytest.mark.parametrize("rows", [68, 64, 32])
def test_lane_layouts_cover_each_output_once(rows, qb, pb):
    """Pass A: every (dim group, row, key) of a 64-key tile is accumulated by exactly one lane (so the
    8 dim-group partials, added in group order, are the model's grouping whatever the layout); pass B:
    every (row, column) of O_tile by exactly one lane."""
    pass_a, pass_b = lane_layouts(rows, qb, pb)
    want_a = {(g, r, k) for g in range(8) for r in range(rows) for k in range(KEYS)}
    want_b = {(r, c) for r in range(rows) for c in range(LATENT)}
    assert len(pass_a) == len(want_a) and set(pass_a) == want_a
    assert len(pass_b) == len(want_b) and set(pass_b) == want_b


@pytest.mark.parametrize("defines", [{}, {"FK_RING": 4}, {"FK_ROWS": 64}, {"FK_ROWS": 32, "FK_RING": 2},
                                     {"FK_QB": 1}, {"FK_QB": 1, "FK_PB": 1}])
def test_host_shared_memory_formula_matches_the_kernel(defines, cache_dir):
    """fp32_gemm_sizing (host) must equal the .cu's FK_SMEM_BYTES: FK_EXPECT_SMEM makes the .cu
    #error out when they differ; everything must fit the H200's 227 KB opt-in limit."""
    from kdtr.nvrtc import compile_kernel

    rows, smem = fp32_gemm_sizing(defines)
    assert smem <= 232448 and rows == int(defines.get("FK_ROWS", 68))
    compile_kernel("verify_attn_fp32_gemm.cu", "sm_90", defines={**defines, "FK_EXPECT_SMEM": smem})


def test_dmma_lane_layouts_cover_each_output_once():
    """fp32_dmma, as its .cu computes the maps: each S warp's MMAs take every dim of its quarter once
    (group G = 9 w + jg, k-step u, lane t -> dim 16 G + 4 t + u) and write every (row < 34, key < 16)
    of its partial once (C: keys g / g + 8, rows 8 n + 2 t, + 1); the softmax threads own every
    (row, key) once; the O warps every (row, column) of the 34 x 512 tile once."""
    rows, keys = OP.CUDA_KERNELS["fp32_dmma"].rows, 16
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
