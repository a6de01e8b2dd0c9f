"""A CPU model of bf16_mma_block's index arithmetic (kernels/attn_bf16_mma.cuh) at bf16_mma's tiles
(<64, 32>), so that a tiling bug shows without a GPU: the instantiation and the registry agree (rows,
keys, threads, shared memory), the warp pairs of the S exchange, the exchange buffer's slots, the
copies of Q and of a K tile, the output lanes, the key splits, and the two-slot ring of slot indices;
then the online softmax at 16- and 32-key steps (bf16 P, fp32 sums) against the float64 reference, so
bf16_mma99's 16-key steps (test_bf16_mma99_model.py models the rest of it) keep bf16_mma's accuracy."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from kdtr.ops.verify_attn import OP

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
D, DV, STR = 576, 512, 584           # ATTN_D, ATTN_DV, FB_STR
NAMES = ("bf16_mma",)


def instantiation(name: str) -> tuple[int, int, int]:
    """(ROWS, KEYS, threads) the kernel's .cu instantiates bf16_mma_block with."""
    text = (KERNELS_DIR / f"verify_attn_{name}.cu").read_text()
    rows, keys = map(int, re.search(r"bf16_mma_block<(\d+), (\d+)>", text).groups())
    (bound,) = map(int, re.search(r"__launch_bounds__\(BF16_MMA_THREADS\((\d+)\), 1\)", text).groups())
    assert bound == rows
    return rows, keys, 64 * (rows // 16)


def smem_bytes(rows: int, keys: int) -> int:
    """BF16_MMA_SMEM_BYTES, term by term: sQ, the K ring, sX (float4 per lane), sSlot."""
    return (rows * STR + 2 * keys * STR) * 2 + 2 * (rows // 16) * (keys // 8) * 32 * 16 + 2 * keys * 4


def test_the_header_formula_is_the_models():
    text = (KERNELS_DIR / "attn_bf16_mma.cuh").read_text()
    macro = re.search(r"#define BF16_MMA_SMEM_BYTES\(rows, keys\) \\\n\s*(.+)\n", text).group(1)
    for rows, keys in ((64, 32), (48, 16), (32, 16), (16, 32)):
        assert eval(macro.replace("FB_STR", str(STR)), {"rows": rows, "keys": keys}) == smem_bytes(rows, keys)


@pytest.mark.parametrize("name", NAMES)
def test_the_registry_is_the_instantiation(name):
    rows, keys, threads = instantiation(name)
    k = OP.cuda_kernel(name, "bf16_paged")
    assert (k.rows, k.keys, k.threads, k.smem) == (rows, keys, threads, smem_bytes(rows, keys))
    assert f"{k.smem:,} B" in (KERNELS_DIR / f"verify_attn_{name}.cu").read_text()


def warp_roles(rows: int):
    """(rg, half, partner) per warp, as the kernel computes them."""
    rg_count = rows // 16
    shift = 2 if rg_count == 4 else rg_count // 2
    return [(warp & (rg_count - 1), warp >> shift, warp ^ rg_count) for warp in range(2 * rg_count)]


@pytest.mark.parametrize("rows", [16, 32, 64])
def test_warps_pair_over_the_two_halves_of_each_row_group(rows):
    roles = warp_roles(rows)
    assert sorted((rg, half) for rg, half, _ in roles) == [(r, h) for r in range(rows // 16) for h in (0, 1)]
    for warp, (rg, half, partner) in enumerate(roles):
        assert roles[partner][2] == warp and roles[partner][0] == rg and roles[partner][1] == 1 - half
        assert 1 <= 1 + rg <= 15                         # a named barrier id (0 is __syncthreads)


@pytest.mark.parametrize("name", NAMES)
def test_exchange_slots_are_the_warps_own_and_inside_sx(name):
    rows, keys, _ = instantiation(name)
    nt, warps = keys // 8, 2 * (rows // 16)
    slots = [(w * nt + n) * 32 + lane for w in range(warps) for n in range(nt) for lane in range(32)]
    assert sorted(slots) == list(range(warps * nt * 32))        # float4 slots of sX, each written once
    def written(w):
        return {(w * nt + n) * 32 + lane for n in range(nt) for lane in range(32)}
    for w, (_, _, partner) in enumerate(warp_roles(rows)):      # a warp reads its partner's, not its own
        assert partner != w and written(partner) <= set(slots) and not written(partner) & written(w)


@pytest.mark.parametrize("name", NAMES)
def test_copies_cover_q_and_each_k_tile_once(name):
    rows, keys, threads = instantiation(name)
    chunks = D // 8
    assert keys * chunks % threads == 0 and keys <= threads
    tile = [tid + i * threads for i in range(keys * chunks // threads) for tid in range(threads)]
    assert sorted((e // chunks, e % chunks) for e in tile) == [(k, c) for k in range(keys) for c in range(chunks)]
    q = [e for tid in range(threads) for e in range(tid, rows * chunks, threads)]
    assert sorted(q) == list(range(rows * chunks))
    # the 16-byte destinations stay inside sQ / the ring buffer and are 16-byte aligned
    assert all(((e // chunks) * STR + (e % chunks) * 8) * 2 % 16 == 0 for e in q)
    assert max((k * STR + c * 8) * 2 for k in range(2 * keys) for c in range(chunks)) + 16 <= 2 * keys * STR * 2


@pytest.mark.parametrize("name", NAMES)
def test_each_output_element_has_one_writer(name):
    rows, keys, threads = instantiation(name)
    seen = {}
    for tid in range(threads):
        lane, warp = tid % 32, tid // 32
        rg, half, _ = warp_roles(rows)[warp]
        g, t = lane >> 2, lane & 3
        for r in (rg * 16 + g, rg * 16 + g + 8):
            for n in range(32):
                for e in (0, 1):
                    col = half * 256 + n * 8 + 2 * t + e
                    assert (r, col) not in seen, (tid, r, col, seen.get((r, col)))
                    seen[(r, col)] = tid
    assert len(seen) == rows * DV
    lse_writers = [(tid, rg * 16 + (tid % 32 >> 2)) for tid in range(threads)
                   for rg, half, _ in [warp_roles(rows)[tid // 32]] if half == 0 and tid % 4 == 0]
    assert sorted(r + d for _, r in lse_writers for d in (0, 8)) == list(range(rows))


def split_tiles(kvlen: int, splits: int, keys: int):
    """Per split z: its key tiles [key0, min(key0 + keys, kend)), as the block walks them."""
    per = (kvlen + splits - 1) // splits
    chunk = (per + keys - 1) // keys * keys
    out = []
    for z in range(splits):
        kbeg, kend = z * chunk, min(z * chunk + chunk, kvlen)
        ntiles = (kend - kbeg + keys - 1) // keys if kend > kbeg else 0
        out.append([(kbeg + i * keys, min(kbeg + (i + 1) * keys, kend)) for i in range(ntiles)])
    return out


@pytest.mark.parametrize("keys", [16, 32])
@pytest.mark.parametrize("kvlen,splits", [(30, 1), (30, 4), (8226, 7), (8226, 132), (17, 3), (1, 2), (4161, 64)])
def test_key_splits_cover_the_keys_once(keys, kvlen, splits):
    covered = [j for tiles in split_tiles(kvlen, splits, keys) for lo, hi in tiles for j in range(lo, hi)]
    assert covered == list(range(kvlen))


@pytest.mark.parametrize("keys", [16, 32])
@pytest.mark.parametrize("ntiles", [0, 1, 2, 3, 7])
def test_the_slot_ring_hands_each_tile_its_own_slots(keys, ntiles):
    """sSlot [2][KEYS]: the prologue writes tile 0's slots to buffer 0 and starts tile 1's into buffer
    1; step `it` copies tile it+1 reading buffer (it+1) & 1, then fetches tile it+2's into buffer it & 1
    (whose tile `it` was read by the copy at step it-1, or the prologue)."""
    buf = {0: 0, 1: 1}                   # buffer -> the tile whose slots it holds (after cp.async lands)
    read = {}
    if ntiles > 0:
        read[0] = buf[0]                 # prologue: load_tile(0) reads buffer 0
    for it in range(ntiles):
        if it + 1 < ntiles:
            read[it + 1] = buf[(it + 1) & 1]
            buf[it & 1] = it + 2
    assert read == {t: t for t in range(ntiles)}


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 round to nearest even, back as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def model_block(q, keys, allowed, scale_log2, keys_per_step):
    """The block's softmax: log2-domain scores in fp32, a running max rebased every step, p rounded
    to bf16 for P V while l sums the fp32 p; returns (out, lse) in natural log."""
    rows = q.shape[0]
    m = np.full(rows, -np.inf, np.float32)
    l = np.zeros(rows, np.float32)
    o = np.zeros((rows, DV), np.float32)
    for key0 in range(0, keys.shape[0], keys_per_step):
        kt = keys[key0:key0 + keys_per_step]
        ok = allowed[:, key0:key0 + kt.shape[0]]
        s = np.where(ok, (q @ kt.T).astype(np.float32) * np.float32(scale_log2), -np.inf).astype(np.float32)
        m_new = np.maximum(m, s.max(axis=1))
        with np.errstate(invalid="ignore"):
            p = np.where(ok, np.exp2(s - m_new[:, None]), 0).astype(np.float32)
            alpha = np.where(m_new == -np.inf, 1, np.exp2(m - m_new)).astype(np.float32)
        l = (l * alpha + p.sum(axis=1, dtype=np.float32)).astype(np.float32)
        o = (alpha[:, None] * o + bf16(p) @ kt[:, :DV]).astype(np.float32)
        m = m_new
    return bf16(o / l[:, None]), (np.log(2) * (m + np.log2(l))).astype(np.float32)


@pytest.mark.parametrize("keys_per_step", [16, 32])
def test_the_16_key_steps_keep_bf16_mma_accuracy(keys_per_step):
    """One request's rows (Q=9, H=8, P=300, a random tree mask) through the block's softmax at both
    key steps, against float64: within the variant's own tolerances (layouts.py), and the two step
    sizes within a few bf16 ulps of each other (they differ only in where the max is rebased)."""
    rng = np.random.default_rng(28)
    q_len, heads, prefix = 9, 8, 300
    q = bf16(rng.standard_normal((q_len * heads, D), np.float32))
    keys = bf16(rng.standard_normal((prefix + q_len, D), np.float32))
    tree = np.tril(rng.random((q_len, q_len)) < 0.5) | np.eye(q_len, dtype=bool)
    allowed = np.ones((q_len * heads, prefix + q_len), bool)
    allowed[:, prefix:] = np.repeat(tree, heads, axis=0)
    sm_scale = 1 / math.sqrt(192)
    out, lse = model_block(q, keys, allowed, sm_scale * math.log2(math.e), keys_per_step)
    s = np.where(allowed, (q.astype(np.float64) @ keys.T.astype(np.float64)) * sm_scale, -np.inf)
    want_lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    want = (np.exp(s - want_lse[:, None]) @ keys[:, :DV].astype(np.float64))
    tol = OP.tolerances("bf16_paged")     # the variant's contract, elementwise, and its relative L2
    assert np.all(np.abs(lse - want_lse) <= tol["lse"].atol + tol["lse"].rtol * np.abs(want_lse))
    assert np.all(np.abs(out - want) <= tol["out"].atol + tol["out"].rtol * np.abs(want))
    assert np.linalg.norm(out - want) / np.linalg.norm(want) <= tol["out"].l2
    other, _ = model_block(q, keys, allowed, sm_scale * math.log2(math.e), 48 - keys_per_step)
    assert np.abs(out - other).max() <= 4 * 2.0 ** -8 * np.abs(want).max()    # a few bf16 ulps
