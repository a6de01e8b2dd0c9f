"""bf16_wgmma2's balanced schedule (kernels/attn_schedule.cuh) and its merge, on the CPU.

wgmma is not on the CPU emulator, so the main kernel itself runs only on a GPU (the goldens); what
it adds for the schedule is here: `lpt_job`, the device function every block of a balanced launch
runs, called by a probe kernel on the emulator (tests/kernels/emulator/) against a model of the
header's rule and against properties that do not use the model (every key of every request in
exactly one chunk, longest first, the host's bound on the jobs); `_merge_lpt` against the uniform
grid's merge, bit for bit, on the same partials; and run_cuda's launches (grids, arguments, the
knobs) with the kernels recorded instead of run. A model of list scheduling prices the schedule
against the uniform grid at the mixed serving shapes."""

from __future__ import annotations

import heapq
import math
import shutil
from ctypes import c_int

import numpy as np
import pytest

from kdtr.config import REPO_ROOT

from kdtr.ops.verify_attn.cuda import (CHUNK_KNOB, KERNELS, LPT_MAX_BATCH, SPLITS_KNOB, balanced_chunk,
                                       balanced_jobs, splits_for)

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


# -- the launch ----------------------------------------------------------------------------------------

class Recorder:
    """A kernel whose launches are written down, not run."""

    def __init__(self, name, defines, log):
        self.name, self.defines, self.log = name, defines, log

    def launch(self, grid, block, args, shared_mem=0, stream=None, *, dependent=False):
        self.log.append(dict(entry=self.name, grid=grid, block=block, args=args, dependent=dependent,
                             defines=self.defines))


class RecordingGpu:
    """A stand-in GPU (kdtr.runtime.device.stand_in) whose kernels write their launches down."""

    def __init__(self, arch, sms, smem_optin, log):
        self.arch, self.sms, self.smem_optin, self.log = arch, sms, smem_optin, log

    def get_kernel(self, source, name, defines, arch):
        return Recorder(name, dict(defines), self.log)


# the session-15 paths, opt-in (the kernel's header, kernels/NOTES.md session 16): on in these tests
ON = {"WG2_LPT": "1", "WG2_PDL": "1", "WG2_STAGED_STORE": "1"}
HINT = {"WG2_KV_HINT": "1"}     # what the launch adds for a call of at most KV_HINT_MAX_BYTES of keys
NO_KNOBS = {k: None for k in ON}   # `launches` / `gpu_run` defines: none of ON passed (the source defaults)
SEG = {"WG2_LPT": "2", "WG2_STAGED_STORE": None}    # the segment schedule
SEG_PREFETCH = {**SEG, "WG2_SEG_PREFETCH": "1"}     # ... loading the next segment early


def launches(batch, defines=None, splits=None, seed=None, **params):
    """run_cuda's launches of bf16_wgmma2 on a stand-in H100 for a generated bf16_paged case (the
    session's fresh seed unless `seed`), with the session-15 knobs on (ON) unless `defines` turns
    one off (a value None: not passed at all)."""
    defines = {k: v for k, v in {**ON, **(defines or {})}.items() if v is not None}
    from kdtr.dtypes import to_torch
    from kdtr.runtime import device

    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, generated, poisoned_outputs

    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED if seed is None else seed, batch=batch, **params)
    inputs = {name: to_torch(a, "cpu") for name, a in gen.inputs.items()}
    outputs = poisoned_outputs(VERIFY_ATTN, "bf16_paged", gen.inputs, gen.params, device="cpu")
    log = []
    with device.stand_in(RecordingGpu(*H100, log)):
        VERIFY_ATTN.run_cuda("bf16_paged", inputs, gen.params, outputs, kernel="bf16_wgmma2",
                             defines=defines, splits=splits)
    return gen, log


def value(arg):
    return getattr(arg, "value", arg)


def test_a_mixed_batch_launches_the_schedule_and_its_merge():
    gen, log = launches(4, heads=16, prefix=1024, budget=16, prefix_mode="mixed")
    main, merge = log
    q_len, heads, rows = 17, 16, 17 * 16
    kv_mean = -(-int(np.diff(gen.inputs["kv_indptr"]).sum()) // 4) + q_len
    splits = splits_for(WGMMA2, 5 * 4, kv_mean, H100[1], 4 * rows)
    chunk = balanced_chunk(WGMMA2, kv_mean, splits)
    jobs = balanced_jobs(4, kv_mean, chunk)
    # 4 requests: plain launches (programmatic dependents only up to PDL_MAX_BATCH requests)
    assert (main["entry"], main["grid"], main["dependent"]) == ("verify_attn_bf16_wgmma2", (5, jobs, 1), False)
    assert value(main["args"][11]) == 0                             # n_splits 0: the schedule
    ws_o, ws_m, ws_l, chunk_arg, sms_arg, meta = main["args"][-6:]
    assert tuple(ws_o.shape) == (jobs, rows, 512) and tuple(ws_m.shape) == tuple(ws_l.shape) == (jobs, rows)
    assert (value(chunk_arg), value(sms_arg), tuple(meta.shape)) == (chunk, H100[1], (8,))
    assert (merge["entry"], merge["grid"], merge["block"], merge["dependent"]) == (
        "verify_attn_bf16_wgmma2_merge_lpt", (rows, 4), 128, False)
    assert merge["args"][:4] == [ws_o, ws_m, ws_l, meta] and value(merge["args"][4]) == rows


def test_the_segment_schedule_launches_a_block_an_sm_and_the_merge():
    _, log = launches(4, defines=SEG, heads=16, prefix=1024, budget=16, prefix_mode="mixed")
    main, merge = log
    rows, blocks = 17 * 16, H100[1] // 5
    assert (main["entry"], main["grid"]) == ("verify_attn_bf16_wgmma2", (5, blocks, 1))
    assert value(main["args"][11]) == 0 and main["defines"]["WG2_LPT"] == "2"
    ws_o, ws_m, ws_l, chunk_arg, sms_arg, meta = main["args"][-6:]
    assert tuple(ws_o.shape) == (blocks + 4, rows, 512) and tuple(ws_l.shape) == (blocks + 4, rows)
    assert (value(chunk_arg), value(sms_arg), tuple(meta.shape)) == (0, 0, (8,))
    assert (merge["entry"], merge["grid"]) == ("verify_attn_bf16_wgmma2_merge_lpt", (rows, 4))
    assert merge["args"][:4] == [ws_o, ws_m, ws_l, meta]


def test_the_segment_schedule_takes_no_chunk():
    with pytest.raises(ValueError, match="takes no chunk"):
        launches(4, defines={**SEG, CHUNK_KNOB: "256"}, heads=16, prefix=1024, budget=16, prefix_mode="mixed")


def test_one_request_launches_the_uniform_grid():
    _, log = launches(1, heads=16, prefix=2048, budget=16)
    main, merge = log
    assert main["grid"][:2] == (5, 1) and main["grid"][2] > 1
    assert [value(a) for a in main["args"][-3:]] == [0, 0, None]   # no schedule
    assert merge["entry"] == "verify_attn_bf16_wgmma2_merge" and merge["grid"] == 17 * 16
    assert main["dependent"] and merge["dependent"]                 # one request: PDL


@pytest.mark.parametrize("how", ["splits_knob", "splits_argument", "lpt_off", "too_many_requests"])
def test_the_uniform_grid_where_the_schedule_is_off(how):
    kw = dict(heads=8, prefix=300, budget=8, prefix_mode="mixed")
    batch, defines, splits = 3, None, None
    if how == "splits_knob":
        defines = {SPLITS_KNOB: "2"}
    elif how == "splits_argument":
        splits = 2
    elif how == "lpt_off":
        defines = {"WG2_LPT": "0", SPLITS_KNOB: "2"}
    else:
        batch, kw = LPT_MAX_BATCH + 1, dict(heads=1, prefix=1, budget=0)
    _, log = launches(batch, defines=defines, splits=splits, **kw)
    assert log[0]["grid"][1] == batch and [value(a) for a in log[0]["args"][-3:]] == [0, 0, None]
    if how != "too_many_requests":
        assert log[0]["grid"][2] == 2 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge"
    if how == "lpt_off":                                        # the build without the schedule
        assert all(entry["defines"] == {**ON, "WG2_LPT": "0", **HINT} for entry in log)


# A fixed seed where a test counts on a split (and so a merge) of the mixed batch of 3: about one
# fresh seed in 50 draws prefixes so short (e.g. 300, 33 and 3) that the uniform grid splits nothing.
SPLIT_SEED = 11


def test_pdl_off_launches_plainly():
    _, log = launches(3, defines={"WG2_PDL": "0"}, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    assert [entry["dependent"] for entry in log] == [False, False]
    assert all(entry["defines"] == {**ON, "WG2_PDL": "0", **HINT} for entry in log)


def test_a_forced_chunk_is_taken_as_given():
    gen, log = launches(3, defines={CHUNK_KNOB: "128"}, heads=8, prefix=300, budget=8, prefix_mode="mixed")
    kv_mean = -(-int(np.diff(gen.inputs["kv_indptr"]).sum()) // 3) + 9
    assert log[0]["grid"] == (2, balanced_jobs(3, kv_mean, 128), 1)
    assert [value(a) for a in log[0]["args"][-3:-1]] == [128, 0]    # sms 0: no fair-share rule
    assert all(CHUNK_KNOB not in entry["defines"] for entry in log)


@pytest.mark.parametrize("batch,chunk,says", [(1, "128", "runs the uniform grid"), (3, "100", "multiple of 64")])
def test_a_chunk_the_launch_cannot_take_is_refused(batch, chunk, says):
    with pytest.raises(ValueError, match=says):
        launches(batch, defines={CHUNK_KNOB: chunk}, heads=8, prefix=300, budget=8)


@pytest.mark.parametrize("dims,want", [
    ((8, 8, 17, 21), False),        # a few microseconds, nothing split: no schedule, no merge
    ((8, 8, 17, 2048), True),       # the uniform grid splits (a merge either way)
    ((64, 128, 2, 8192), True),     # one wave of long requests: worth balancing
    ((32, 8, 65, 4096), True),      # the mixed serving batch
    ((1, 16, 17, 2048), False),     # one request
])
def test_the_launch_balances_where_it_can_gain(dims, want):
    from kdtr.ops.verify_attn.cuda import balanced

    batch, heads, q_len, prefix = dims
    tiles, kv = math.ceil(q_len * heads / 64), prefix + q_len
    splits = splits_for(WGMMA2, tiles * batch, kv, H100[1], batch * q_len * heads)
    assert balanced(WGMMA2, batch, tiles, kv, splits, H100[1]) == want


def test_a_forced_chunk_balances_a_small_batch_too():
    _, log = launches(3, defines={CHUNK_KNOB: "64"}, heads=8, prefix=5, budget=2, prefix_mode="mixed")
    assert log[0]["grid"][2] == 1 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge_lpt"


# -- on an H100 / H200 (the balanced launch runs only there) -------------------------------------------

def test_the_default_launch_is_the_uniform_grid():
    """Without defines a mixed batch gets the uniform grid and its merge as plain launches, from a
    build given no knob (WG2_PDL's default 1 since session 17, but a batch of 3 is past
    PDL_MAX_BATCH; the balanced schedule and the staged epilogue stay off): the launch reads the
    build's defaults from the kernel's source, so the two agree."""
    _, log = launches(3, defines=NO_KNOBS, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    from kdtr.ops.verify_attn.cuda import PDL_MAX_BATCH, knob_on

    assert {k: knob_on(WGMMA2, {}, k) for k in ON} == {"WG2_LPT": False, "WG2_PDL": True,
                                                        "WG2_STAGED_STORE": False}
    source = (REPO_ROOT / "kernels" / "verify_attn_bf16_wgmma2.cu").read_text()
    defaults = {"WG2_LPT": 0, "WG2_PDL": 1, "WG2_STAGED_STORE": 0}
    assert all(f"#ifndef {k}\n#define {k} {v}\n" in source for k, v in defaults.items())   # the build's too
    assert all(entry["defines"] == HINT for entry in log)     # a small call: the L2 hint build
    assert PDL_MAX_BATCH < 3 and [entry["dependent"] for entry in log] == [False, False]
    assert log[0]["grid"][1] == 3 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge"
    assert [value(a) for a in log[0]["args"][-3:]] == [0, 0, None]


def test_a_large_call_runs_the_build_without_hints(monkeypatch):
    """Past KV_HINT_MAX_BYTES of keys (here lowered below this case's ~0.5 MB) the launch builds the kernel
    without the gather's L2 hints; a caller's WG2_KV_HINT is kept either way."""
    from kdtr.ops.verify_attn import cuda

    monkeypatch.setattr(cuda, "KV_HINT_MAX_BYTES", 40_000)
    _, log = launches(3, defines=NO_KNOBS, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    assert all(entry["defines"] == {} for entry in log)
    _, log = launches(3, defines=NO_KNOBS | {"WG2_KV_HINT": "2"}, heads=8, prefix=300, budget=8,
                      prefix_mode="mixed", seed=SPLIT_SEED)
    assert all(entry["defines"] == {"WG2_KV_HINT": "2"} for entry in log)


def test_the_default_launch_of_one_request_is_dependent():
    _, log = launches(1, defines=NO_KNOBS, heads=16, prefix=2048, budget=16)
    assert [entry["dependent"] for entry in log] == [True, True]


def test_pdl_off_is_the_f651642_launch():
    """`WG2_PDL=0` gives f651642's launch: plain launches of the uniform grid and its merge."""
    _, log = launches(3, defines={"WG2_LPT": None, "WG2_STAGED_STORE": None, "WG2_PDL": "0"}, heads=8,
                      prefix=300, budget=8, prefix_mode="mixed", seed=SPLIT_SEED)
    assert [entry["dependent"] for entry in log] == [False, False]
    assert log[0]["grid"][1] == 3 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge"


def test_the_launch_follows_the_source_default(monkeypatch):
    """A kernel source whose default turns the schedule on gets the balanced launch without a define."""
    from kdtr.ops.verify_attn import cuda

    monkeypatch.setattr(cuda, "source_default", lambda source, name: "1" if name == "WG2_LPT" else None)
    _, log = launches(3, defines=NO_KNOBS, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    assert log[0]["grid"][2] == 1 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge_lpt"
    assert [entry["dependent"] for entry in log] == [False, False]


def gpu_run(gen, defines=None, graph_calls=0):
    """bf16_wgmma2's outputs on the GPU; with graph_calls, from that many replays of a graph that
    first overwrites q from a copy (a kernel right before ours, as a server's projection is) and
    then runs the op, the copy's source changed between replays."""
    import torch

    from kdtr.dtypes import to_numpy, to_torch

    from .test_cuda_kernels import VERIFY_ATTN, poisoned_outputs

    inputs = {name: to_torch(a, "cuda") for name, a in gen.inputs.items()}
    outputs = poisoned_outputs(VERIFY_ATTN, "bf16_paged", gen.inputs, gen.params)

    defines = {k: v for k, v in {**ON, **(defines or {})}.items() if v is not None}   # None: not passed

    def call():
        VERIFY_ATTN.run_cuda("bf16_paged", inputs, gen.params, outputs, kernel="bf16_wgmma2", defines=defines)

    if not graph_calls:
        call()
        torch.cuda.synchronize()
        return [{n: to_numpy(t) for n, t in outputs.items()}]
    source = inputs["q"].clone()
    call()                                                           # compile and load before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inputs["q"].copy_(source)
        call()
    runs = []
    for i in range(graph_calls):
        source.copy_(to_torch(gen.inputs["q"], "cuda") * (1 - 2 * (i % 2)))      # q, then -q
        graph.replay()
        torch.cuda.synchronize()
        runs.append({n: to_numpy(t) for n, t in outputs.items()})
    return runs


CASES_GPU = {   # name: (case parameters, defines)
    "mixed_b5_split_and_direct": (dict(batch=5, heads=8, prefix=3000, budget=8, prefix_mode="mixed"),
                                  {CHUNK_KNOB: "1024"}),
    "mixed_b64_chain": (dict(batch=64, heads=16, prefix=2048, budget=3, prefix_mode="mixed", tree="chain",
                             slots="pages64"), None),
    "mixed_b200_small": (dict(batch=200, heads=2, prefix=700, budget=4, prefix_mode="mixed"), {CHUNK_KNOB: "128"}),
    "equal_b6_lpt_off": (dict(batch=6, heads=16, prefix=1500, budget=16), {"WG2_LPT": "0"}),
    "equal_b6_pdl_off": (dict(batch=6, heads=16, prefix=1500, budget=16), {"WG2_PDL": "0"}),
    # the segment schedule (its build refuses the staged epilogue): blocks across requests, requests
    # across blocks, one block's several requests written directly; b3: a batch the launch does not
    # balance (3 one-tile requests), the 2 build's uniform grid in one pass (fewer tiles than blocks
    # is the emulator's `fewer_tiles_than_blocks`)
    "seg_mixed_b5": (dict(batch=5, heads=8, prefix=3000, budget=8, prefix_mode="mixed"), SEG),
    "seg_mixed_b64_chain": (dict(batch=64, heads=16, prefix=2048, budget=3, prefix_mode="mixed", tree="chain",
                                 slots="pages64"), SEG),
    "seg_mixed_b200_small": (dict(batch=200, heads=2, prefix=700, budget=4, prefix_mode="mixed"), SEG),
    "seg_equal_b6": (dict(batch=6, heads=16, prefix=1500, budget=16), SEG),
    "seg_b3_under_a_block_each": (dict(batch=3, heads=8, prefix=40, budget=2, prefix_mode="mixed"), SEG),
    # 256 requests of 1 to 10 tiles (about a tenth of them one tile): blocks run one-tile segments after
    # longer ones
    "seg_b256_short_requests": (dict(batch=256, heads=2, prefix=600, budget=4, prefix_mode="mixed"), SEG),
    # the next segment's Q and first tiles gathered during this one (WG2_SEG_PREFETCH=1): each prefetch
    # count (0 to 2 tiles) in the short requests, the partials of requests across blocks, equal
    # requests, and the build's one-pass uniform grid
    "seg_prefetch_b256_short_requests": (dict(batch=256, heads=2, prefix=600, budget=4, prefix_mode="mixed"),
                                         SEG_PREFETCH),
    "seg_prefetch_mixed_b5": (dict(batch=5, heads=8, prefix=3000, budget=8, prefix_mode="mixed"), SEG_PREFETCH),
    "seg_prefetch_mixed_b64_chain": (dict(batch=64, heads=16, prefix=2048, budget=3, prefix_mode="mixed",
                                          tree="chain", slots="pages64"), SEG_PREFETCH),
    "seg_prefetch_equal_b6": (dict(batch=6, heads=16, prefix=1500, budget=16), SEG_PREFETCH),
    "seg_prefetch_b3_under_a_block_each": (dict(batch=3, heads=8, prefix=40, budget=2, prefix_mode="mixed"),
                                           SEG_PREFETCH),     # its uniform grid: no next segment
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES_GPU)
def test_the_balanced_launch_matches_the_reference(name):
    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, check_attn, generated, skip_unless_runs_here

    skip_unless_runs_here("bf16_paged", "bf16_wgmma2")
    params, defines = CASES_GPU[name]
    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED, **params)
    (got,) = gpu_run(gen, defines)
    check_attn("bf16_paged", f"{name} seed {FRESH_SEED}", got, VERIFY_ATTN.reference("bf16_paged", gen.inputs,
                                                                                        gen.params), gen.inputs, gen.params)


@pytest.mark.gpu
def test_a_graph_of_the_balanced_launch_reads_the_inputs_written_before_it(monkeypatch):
    """Programmatic dependent launches: the replays alternate q and -q, written by the copy kernel
    right before ours; each replay's outputs are those of its own q (none read before the wait).
    PDL_MAX_BATCH is raised here so that the balanced launch of 6 requests is dependent too."""
    from kdtr.ops.verify_attn import cuda

    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, check_attn, generated, skip_unless_runs_here

    skip_unless_runs_here("bf16_paged", "bf16_wgmma2")
    monkeypatch.setattr(cuda, "PDL_MAX_BATCH", 6)
    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED, batch=6, heads=16, prefix=2000, budget=8,
                    prefix_mode="mixed")
    both = (gen.inputs, dict(gen.inputs, q=-gen.inputs["q"]))
    want = [VERIFY_ATTN.reference("bf16_paged", inputs, gen.params) for inputs in both]
    for i, got in enumerate(gpu_run(gen, graph_calls=4)):
        check_attn("bf16_paged", f"replay {i} seed {FRESH_SEED}", got, want[i % 2], both[i % 2], gen.params)


@pytest.mark.gpu
def test_a_graph_of_one_request_reads_the_inputs_written_before_it():
    """The default build's launch of one request (main and merge as programmatic dependents, the
    keys split): as above, each replay's outputs are those of the q written right before it."""
    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, check_attn, generated, skip_unless_runs_here

    skip_unless_runs_here("bf16_paged", "bf16_wgmma2")
    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED, batch=1, heads=16, prefix=2048, budget=16)
    both = (gen.inputs, dict(gen.inputs, q=-gen.inputs["q"]))
    want = [VERIFY_ATTN.reference("bf16_paged", inputs, gen.params) for inputs in both]
    for i, got in enumerate(gpu_run(gen, defines=NO_KNOBS, graph_calls=4)):
        check_attn("bf16_paged", f"replay {i} seed {FRESH_SEED}", got, want[i % 2], both[i % 2], gen.params)
