"""bf16_wgmma2's balanced schedule (kernels/attn_schedule.cuh) and its merge, on the CPU.

wgmma is not on the CPU emulator, so the main kernel itself runs only on a GPU (the goldens); what
it adds for the schedule is here: `lpt_job`, the device function every block of a balanced launch
runs, called by a probe kernel on the emulator (tests/kernels/emulator/) against a model of the
header's rule and against properties that do not use the model (every key of every request in
exactly one chunk, longest first, the host's bound on the jobs); `_merge_lpt` against the uniform
grid's merge, bit for bit, on the same partials. A model of list scheduling prices the schedule
against the uniform grid at the mixed serving shapes. run_cuda's launches: test_attn_launch.py."""

from __future__ import annotations

import heapq
import math
import shutil
from ctypes import c_int

import numpy as np
import pytest

from kdtr.ops.verify_attn.cuda import KERNELS, LPT_MAX_BATCH, balanced_chunk, balanced_jobs, splits_for

from .emulator import KERNELS_DIR, EmulatedGpu, EmulatedKernel, compiler

WGMMA2 = next(k for k in KERNELS if k.name == "bf16_wgmma2")
H100 = (90, 132, 232448)
emulator = pytest.mark.skipif(compiler() is None, reason="no g++ to build the CPU emulator with")

PROBE = r"""
#include "attn_common.cuh"
#include "attn_schedule.cuh"
// Block (0, y) evaluates job job0 + y of the schedule and writes (b, z, n, chunk, ibase, kvlen);
// block (0, 0) also the meta.
extern "C" __global__ void lpt_probe(const int* kv_indptr, int B, int Q, int row_tiles, int chunk, int sms,
                                     int job0, int* meta, int* out) {
    extern __shared__ int scratch[];
    const LptJob j = lpt_job(job0 + blockIdx.y, kv_indptr, B, Q, row_tiles, chunk, sms, meta, blockIdx.y == 0,
                             scratch);
    if (threadIdx.x == 0) {
        int* o = out + 6 * blockIdx.y;
        o[0] = j.b; o[1] = j.z; o[2] = j.n; o[3] = j.chunk; o[4] = j.ibase; o[5] = j.kvlen;
    }
}
// Block (0, y) evaluates seg_range for block y of G and writes (b, cum, t0, t1); block (0, 0) the meta.
extern "C" __global__ void seg_probe(const int* kv_indptr, int B, int Q, int G, int* meta, int* out) {
    extern __shared__ int scratch[];
    const SegRange r = seg_range(blockIdx.y, G, kv_indptr, B, Q, meta, blockIdx.y == 0, scratch);
    if (threadIdx.x == 0) {
        int* o = out + 4 * blockIdx.y;
        o[0] = r.b; o[1] = r.cum; o[2] = r.t0; o[3] = r.t1;
    }
}
"""


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    """kernels/ with the probe beside them (the emulator builds from a kernels directory)."""
    d = tmp_path_factory.mktemp("lpt_probe")
    for f in list(KERNELS_DIR.glob("*.cu")) + list(KERNELS_DIR.glob("*.cuh")):
        shutil.copy(f, d / f.name)
    (d / "lpt_probe.cu").write_text(PROBE)
    return d


def model(kv, row_tiles, chunk_min, sms):
    """The header's rule in Python: the chunk, then each request's (chunks, keys a chunk), then the
    jobs in order."""
    kt = [math.ceil(k / 64) for k in kv]
    chunk = chunk_min
    if sms and min(kt) != max(kt):
        chunk = max(chunk, 64 * math.ceil(row_tiles * sum(kt) / sms))
    n = [math.ceil(k / chunk) for k in kv]
    ch = [64 * math.ceil(math.ceil(k / m) / 64) for k, m in zip(kv, n)]
    order = sorted(range(len(kv)), key=lambda b: (-ch[b], b))
    return [(b, z, n[b], ch[b]) for b in order for z in range(n[b])]


def emulated(probe_dir, entry, prefix, count, width, args, shared_mem, order):
    """A probe kernel of lpt_probe.cu run on the emulator, block (0, y) for y < count: (its rows
    [count, width], meta [B, 2]); args go between (kv_indptr, B) and (meta, out)."""
    import torch

    batch = len(prefix)
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(prefix)]).astype(np.int32))
    meta = torch.full((batch, 2), -7, dtype=torch.int32)
    out = torch.full((count, width), -7, dtype=torch.int32)
    kernel = EmulatedKernel("lpt_probe.cu", entry, {}, EmulatedGpu(*H100, order=order, kernels_dir=probe_dir))
    kernel.launch((1, count), 256, [indptr, c_int(batch), *map(c_int, args), meta, out], shared_mem=shared_mem)
    return out.numpy(), meta.numpy()


def probe(probe_dir, prefix, q_len, row_tiles, chunk, sms, job0, count, order=0):
    """(jobs [count, 6], meta [B, 2]) from the emulated lpt_job."""
    return emulated(probe_dir, "lpt_probe", prefix, count, 6, (q_len, row_tiles, chunk, sms, job0),
                    4 * (128 + 4 * len(prefix)), order)


BATCHES = {   # name: (prefixes, Q, row tiles, least chunk, SMs)
    "uniform": ([8192] * 8, 33, 5, 3 * 64 * 43, 132),
    "uniform_one_split": ([4096] * 32, 65, 9, 4096 + 128, 132),
    "mixed_over_a_wave": (list(np.random.default_rng(1).integers(0, 4097, 32)), 65, 9, 17 * 64, 132),
    "mixed_under_a_wave": ([4096, 10, 3000, 0, 77], 17, 5, 128, 132),
    "mixed_forced_chunk": ([4096, 10, 3000, 0, 77, 640, 641], 17, 5, 256, 0),
    "one_key_each": ([0, 0, 0], 1, 1, 64, 132),
    "ties": ([100, 1000, 100, 1000, 100], 9, 2, 64, 132),
}


@emulator
@pytest.mark.parametrize("name", BATCHES)
def test_every_block_finds_its_job_of_the_modelled_schedule(probe_dir, name):
    prefix, q_len, row_tiles, chunk, sms = BATCHES[name]
    kv = [p + q_len for p in prefix]
    want = model(kv, row_tiles, chunk, sms)
    got, meta = probe(probe_dir, prefix, q_len, row_tiles, chunk, sms, 0, len(want) + 3)
    ibase = np.concatenate([[0], np.cumsum(prefix)])
    for y, (b, z, n, ch) in enumerate(want):
        assert got[y].tolist() == [b, z, n, ch, ibase[b], kv[b]], (name, y)
    assert (got[len(want):, 0] == -1).all()                      # past the last job: no request
    first = {}
    for y, (b, *_) in enumerate(want):
        first.setdefault(b, y)
    assert meta.tolist() == [[first[b], sum(1 for j in want if j[0] == b)] for b in range(len(prefix))]


@emulator
def test_the_schedule_is_the_same_in_every_thread_order(probe_dir):
    prefix, q_len, row_tiles, chunk, sms = BATCHES["mixed_over_a_wave"]
    runs = [probe(probe_dir, prefix, q_len, row_tiles, chunk, sms, 0, 40, order=o) for o in (0, 1, 7)]
    for jobs, meta in runs[1:]:
        np.testing.assert_array_equal(jobs, runs[0][0])
        np.testing.assert_array_equal(meta, runs[0][1])


@emulator
def test_a_batch_of_the_largest_size_spans_several_passes_of_the_block(probe_dir):
    """LPT_MAX_BATCH requests (each thread holds one; the order loop runs 32 requests a warp): the
    first jobs, some in the middle, the last and one past it."""
    rng = np.random.default_rng(5)
    prefix = list(rng.integers(0, 3000, LPT_MAX_BATCH))
    kv = [p + 5 for p in prefix]
    want = model(kv, 1, 512, 132)
    for job0 in (0, len(want) // 2, len(want) - 2):
        got, _ = probe(probe_dir, prefix, 5, 1, 512, 132, job0, 3)
        expect = [list(want[y]) if y < len(want) else None for y in range(job0, job0 + 3)]
        for row, e in zip(got, expect):
            assert (row[0] == -1) if e is None else row[:4].tolist() == e


# -- the segment schedule (WG2_LPT=2) ------------------------------------------------------------------

def seg_model(kv, blocks):
    """The header's rule in Python: each block's (request of its first tile, tiles before that
    request, t0, t1), None past the last block with tiles; and the meta (first slot, pieces)."""
    kt = [math.ceil(k / 64) for k in kv]
    cum = [0, *np.cumsum(kt).tolist()]
    total = cum[-1]
    g = min(blocks, total)
    out = []
    for y in range(blocks):
        if y >= g:
            out.append(None)
            continue
        t0, t1 = y * total // g, (y + 1) * total // g
        b = max(r for r in range(len(kv)) if cum[r] <= t0)
        out.append((b, cum[b], t0, t1))
    block_of = lambda t: ((t + 1) * g - 1) // total
    meta = [(block_of(cum[r]) + r, block_of(cum[r + 1] - 1) - block_of(cum[r]) + 1) for r in range(len(kv))]
    return out, meta


def seg_probe(probe_dir, prefix, q_len, blocks, order=0):
    """(blocks [G, 4], meta [B, 2]) from the emulated seg_range."""
    return emulated(probe_dir, "seg_probe", prefix, blocks, 4, (q_len, blocks), 4 * (len(prefix) + 34), order)


SEG_BATCHES = {   # name: (prefixes, Q, blocks a row tile)
    "mixed_b32": (list(np.random.default_rng(3).integers(0, 4097, 32)), 4, 132),
    "mixed_b5_few_blocks": ([4096, 10, 3000, 0, 77], 17, 7),
    "fewer_tiles_than_blocks": ([0, 70, 5], 4, 132),
    "equal": ([2000] * 6, 17, 26),
    "over_a_thread_each": (list(np.random.default_rng(4).integers(0, 900, 700)), 5, 132),
}


def segments(kv, ranges):
    """The kernel's pass over each block's segments (its loop's advance, in Python): per block y,
    [(request, first key, end key, partial slot y + b, direct)]."""
    kt = [math.ceil(k / 64) for k in kv]
    out = {}
    for y, r in enumerate(ranges):
        if r is None or r[0] < 0:
            continue
        b, cum, t, t1 = r
        while t < t1:
            end = min(t1, cum + kt[b])
            out.setdefault(y, []).append((b, (t - cum) * 64, min((end - cum) * 64, kv[b]), y + b,
                                          t == cum and end == cum + kt[b]))
            t = end
            if t == cum + kt[b]:
                b, cum = b + 1, cum + kt[b]
    return out


@emulator
@pytest.mark.parametrize("name", SEG_BATCHES)
def test_every_block_finds_its_range_of_the_modelled_segments(probe_dir, name):
    prefix, q_len, blocks = SEG_BATCHES[name]
    kv = [p + q_len for p in prefix]
    want, want_meta = seg_model(kv, blocks)
    got, meta = seg_probe(probe_dir, prefix, q_len, blocks)
    for y, w in enumerate(want):
        assert (got[y][0] == -1) if w is None else got[y].tolist() == list(w), (name, y)
    assert meta.tolist() == [list(m) for m in want_meta]


@emulator
def test_the_segments_are_the_same_in_every_thread_order(probe_dir):
    prefix, q_len, blocks = SEG_BATCHES["over_a_thread_each"]
    runs = [seg_probe(probe_dir, prefix, q_len, blocks, order=o) for o in (0, 1, 7)]
    for got, meta in runs[1:]:
        np.testing.assert_array_equal(got, runs[0][0])
        np.testing.assert_array_equal(meta, runs[0][1])


@pytest.mark.parametrize("name", SEG_BATCHES)
def test_the_segments_cover_every_key_once_in_equal_shares(name):
    """Properties that do not lean on the model's arithmetic: every key of every request in exactly
    one segment, in order; each block's tiles within one of an even share; the partial slots of a
    request consecutive from its meta's first, as many as its meta says, distinct over the batch and
    under G + B; a request is written directly exactly when its meta has one piece."""
    prefix, q_len, blocks = SEG_BATCHES[name]
    kv = [p + q_len for p in prefix]
    ranges, meta = seg_model(kv, blocks)
    segs = segments(kv, ranges)
    total = sum(math.ceil(k / 64) for k in kv)
    sizes = [r[3] - r[2] for r in ranges if r is not None]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == total
    per_request = {}
    for y in sorted(segs):
        for b, k0, k1, slot, direct in segs[y]:
            per_request.setdefault(b, []).append((k0, k1, slot, direct))
    slots = [slot for pieces in per_request.values() for _, _, slot, direct in pieces if not direct]
    assert len(slots) == len(set(slots)) and max(slots, default=0) < blocks + len(kv)
    for b, k in enumerate(kv):
        pieces = per_request[b]
        assert pieces[0][0] == 0 and pieces[-1][1] == k and all(lo < hi for lo, hi, *_ in pieces)
        assert all(pieces[i][1] == pieces[i + 1][0] for i in range(len(pieces) - 1))
        first, n = meta[b]
        assert len(pieces) == n and [p[2] for p in pieces] == list(range(first, first + n))
        assert all(p[3] == (n == 1) for p in pieces)


@pytest.mark.parametrize("name", BATCHES)
def test_the_schedule_covers_every_key_once_longest_first(name):
    """Properties of the rule that do not lean on the model's own order: each request's chunks tile
    [0, kvlen) with none empty, the jobs run longest chunk first (a request's together, in order),
    and the host's bound holds."""
    prefix, q_len, row_tiles, chunk, sms = BATCHES[name]
    kv = [p + q_len for p in prefix]
    jobs = model(kv, row_tiles, chunk, sms)
    for b, k in enumerate(kv):
        mine = [(z, n, ch) for bb, z, n, ch in jobs if bb == b]
        assert [z for z, *_ in mine] == list(range(len(mine)))
        n, ch = mine[0][1:]
        ranges = [(z * ch, min((z + 1) * ch, k)) for z in range(n)]
        assert ranges[0][0] == 0 and ranges[-1][1] == k and all(lo < hi for lo, hi in ranges)
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(n - 1))
        assert ch % 64 == 0 and ch >= chunk if n > 1 else True
    sizes = [ch for _, _, _, ch in jobs]
    assert sizes == sorted(sizes, reverse=True)
    mean = -(-sum(prefix) // len(prefix)) + q_len                 # Paged.request_keys
    assert len(jobs) <= balanced_jobs(len(prefix), mean, chunk)


@pytest.mark.parametrize("dims", [(8, 8, 33, 8192), (2, 16, 17, 2048), (4, 64, 9, 512), (8, 16, 33, 8192),
                                  (64, 16, 65, 32768), (3, 8, 5, 1)])
def test_equal_requests_get_the_uniform_grids_splits(dims):
    """A batch of equal requests: the host's least chunk is the uniform grid's split of that request,
    and the schedule's chunks are the uniform grid's non-empty splits, key for key (so the merge
    adds the same partials in the same order: the same bits)."""
    batch, heads, q_len, prefix = dims
    tiles, kv = math.ceil(q_len * heads / 64), prefix + q_len
    splits = splits_for(WGMMA2, tiles * batch, kv, H100[1], batch * q_len * heads)
    chunk = balanced_chunk(WGMMA2, kv, splits)
    per = math.ceil(math.ceil(kv / splits) / 64) * 64                 # the uniform kernel's chunk
    uniform = [(z * per, min((z + 1) * per, kv)) for z in range(splits) if z * per < kv]
    jobs = model([kv] * batch, tiles, chunk, H100[1])
    assert [(b, z) for b, z, _, _ in jobs] == [(b, z) for b in range(batch) for z in range(len(uniform))]
    assert [(z * ch, min((z + 1) * ch, kv)) for _, z, _, ch in jobs[:len(uniform)]] == uniform


def list_schedule(durations, sms):
    """Blocks dispatched in order, each to the SM that frees first: the makespan."""
    free = [0.0] * sms
    end = 0.0
    for d in durations:
        t = heapq.heappop(free) + d
        heapq.heappush(free, t)
        end = max(end, t)
    return end


@pytest.mark.parametrize("batch,heads,q_len,prefix", [(32, 8, 65, 4096), (16, 16, 33, 4096), (128, 16, 4, 16384)])
def test_the_schedule_shortens_a_mixed_batch_in_the_wave_model(batch, heads, q_len, prefix):
    """The serving suite's mixed batches (request 0 at P, the others drawn from [0, P]) priced with
    bf16_wgmma2's WaveCost per block (fixed part + key tiles): the balanced schedule's makespan by
    list scheduling against the uniform grid's (the launch's split count for the mean request,
    blocks in (tile, request, split) order). The H100 measured 214 against FlashMLA's 151 us at
    B=32 H=8 and 129 against 84 at B=16 H=16 (issue 37)."""
    rng = np.random.default_rng(20261201)
    prefixes = np.concatenate([[prefix], rng.integers(0, prefix + 1, batch - 1)])
    kv = [int(p) + q_len for p in prefixes]
    tiles, sms, cost = math.ceil(q_len * heads / 64), H100[1], WGMMA2.wave
    mean = -(-int(prefixes.sum()) // batch) + q_len
    splits = splits_for(WGMMA2, tiles * batch, mean, sms, batch * q_len * heads)

    def block(keys):
        return cost.block_us + math.ceil(keys / 64) * cost.tile_us

    uniform = []
    for z in range(splits):
        for k in kv:
            per = math.ceil(math.ceil(k / splits) / 64) * 64
            uniform += [block(max(0, min(per, k - z * per)))] * tiles
    balanced = [block(min(ch, kv[b] - z * ch)) for b, z, _, ch in
                model(kv, tiles, balanced_chunk(WGMMA2, mean, splits), sms) for _ in range(tiles)]
    assert list_schedule(balanced, sms) < 0.85 * list_schedule(uniform, sms)


# -- the merge ---------------------------------------------------------------------------------------

def partials(rng, chunks, rows):
    """Random partials of requests split into `chunks` parts, rows each: m (a few -inf: a part that
    saw only masked keys), l, o; per request a list of parts."""
    out = []
    for n in chunks:
        m = rng.normal(0, 3, (n, rows)).astype(np.float32)
        m[rng.random((n, rows)) < 0.2] = -np.inf
        m[0, np.isinf(m).all(axis=0)] = 0.5                  # every row has a part that saw a key
        l = rng.uniform(1, 40, (n, rows)).astype(np.float32)
        o = rng.normal(0, 5, (n, rows, 512)).astype(np.float32)
        out.append((m, l, o))
    return out


@emulator
@pytest.mark.parametrize("order", [0, 7])
def test_the_balanced_merge_gives_the_uniform_merges_bits(order):
    """Requests of 3, 1, 5, 2 and 1 parts (rows = Q*H = 10), their parts at first slots in a
    scrambled order: _merge_lpt writes the split requests' out and lse
    with the bits of _merge on the same partials laid out [split][B*Q*H rows] (absent parts empty),
    and leaves the unsplit ones (the main kernel wrote them) alone."""
    import torch

    rng = np.random.default_rng(3)
    chunks, rows = [3, 1, 5, 2, 1], 10
    parts = partials(rng, chunks, rows)
    batch, slots = len(chunks), sum(chunks)
    starts = {}
    at = 0
    for b in (2, 0, 4, 3, 1):                                   # first slots in another order
        starts[b] = at
        at += chunks[b]
    ws_o = np.full((slots, rows, 512), np.nan, np.float32)
    ws_m, ws_l = np.full((slots, rows), np.nan, np.float32), np.full((slots, rows), np.nan, np.float32)
    for b, (m, l, o) in enumerate(parts):
        ws_m[starts[b]:starts[b] + chunks[b]], ws_l[starts[b]:starts[b] + chunks[b]] = m, l
        ws_o[starts[b]:starts[b] + chunks[b]] = o
    meta = np.array([[starts[b], chunks[b]] for b in range(batch)], np.int32)
    most = max(chunks)
    u_o = np.zeros((most, batch * rows, 512), np.float32)
    u_m = np.full((most, batch * rows), -np.inf, np.float32)
    u_l = np.zeros((most, batch * rows), np.float32)
    for b, (m, l, o) in enumerate(parts):
        u_m[:chunks[b], b * rows:(b + 1) * rows], u_l[:chunks[b], b * rows:(b + 1) * rows] = m, l
        u_o[:chunks[b], b * rows:(b + 1) * rows] = o
    gpu = EmulatedGpu(*H100, order=order)

    def run(entry, grid, args):
        out = torch.full((batch * rows, 512), float("nan"), dtype=torch.bfloat16)
        lse = torch.full((batch * rows,), float("nan"), dtype=torch.float32)
        EmulatedKernel("verify_attn_bf16_wgmma2.cu", entry, {}, gpu).launch(
            grid, 128, [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args] + [out, lse])
        return out.view(torch.int16).numpy(), lse.numpy()

    lpt = run("verify_attn_bf16_wgmma2_merge_lpt", (rows, batch),
              [ws_o, ws_m, ws_l, meta, c_int(rows)])
    uni = run("verify_attn_bf16_wgmma2_merge", batch * rows, [u_o, u_m, u_l, c_int(most), c_int(batch * rows)])
    for b in range(batch):
        mine = slice(b * rows, (b + 1) * rows)
        if chunks[b] == 1:
            assert np.isnan(lpt[1][mine]).all() and (lpt[0][mine] == np.int16(0x7fc0)).all()
            continue
        np.testing.assert_array_equal(lpt[0][mine], uni[0][mine], err_msg=f"out of request {b}")
        np.testing.assert_array_equal(lpt[1][mine].view(np.uint32), uni[1][mine].view(np.uint32))
        m, l, o = (a.astype(np.float64) for a in parts[b])
        big = m.max(axis=0)
        w = np.where(np.isinf(m), 0.0, np.exp(m - big))
        want = (w[..., None] * o).sum(0) / (w * l).sum(0)[:, None]
        got = torch.from_numpy(lpt[0][mine]).view(torch.bfloat16).float().numpy()
        assert np.abs(got - want).max() <= 2 ** -7 * np.abs(want).max()
