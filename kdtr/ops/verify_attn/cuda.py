"""verify_attn's CUDA binding: the kernel registry (kernels/README.md is its table), the launch's
choice of kernel and its grid (row tiles x requests x KV splits, a merge when the keys are split;
for a balanced kernel and a batch, row tiles x jobs of the schedule in kernels/attn_schedule.cuh)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...errors import DeviceError
from ...runtime.device import device_arch, get_kernel, multiprocessor_count
from ...runtime.nvrtc import source_default
from ..base import CudaKernel, Gpu
from .layouts import LATENT, LAYOUTS, ROW

PIECES_SPLIT, PIECES_BLOCK = 4, 144     # a `pieces` kernel's blocks per tile and threads per block


SPLITS_KNOB = "SPLITS"    # the launch knob (--define NAME:SPLITS=N) that forces the KV split count
CHUNK_KNOB = "CHUNK"      # the launch knob that forces the balanced schedule's chunk (keys)
LPT_MAX_BATCH = 256       # the balanced schedule's batches: its per-block order costs O(B^2 / 256)
LPT_MIN_SHARE = 8         # ... and key tiles an SM (mean request) where the uniform grid splits nothing
KV_HINT_MAX_BYTES = 256 << 20   # a hint build's key gather marks lines evict-first up to this many key
                                # bytes a call: 1.04-1.10x at 2-153 MB, 0.97x at 613 MB-2.4 GB (H100,
                                # results/h100/s17/bench-hints.json; kernels/NOTES.md, session 17)
PDL_MAX_BATCH = 1         # a PDL build's launches are programmatic dependents up to this batch (one
                          # request: 1.05-1.09x; B=8 H=8 Q=4 lost 3-6%; kernels/NOTES.md, session 17)
# bf16_mma99's tiling knobs (kernels/verify_attn_bf16_mma99.cu): rows a block, a launch knob (the grid,
# so the split count, follows it), and stages of its K/V ring, a compile knob its launch sizes shared
# memory for (every stage count gives the same bytes, which the bench checks)
M99_ROWS, M99_STAGES = "M99_ROWS", "M99_STAGES"
M99_CHOICES = {M99_ROWS: (32, 48), M99_STAGES: (2, 3, 4)}
M99_DEFAULTS = {M99_ROWS: 48, M99_STAGES: 4}


def mma99_smem(rows: int, stages: int) -> int:
    """M99_SMEM_BYTES of verify_attn_bf16_mma99.cu: its K/V ring (16-key tiles of 584-bf16 rows),
    the S partials (rows / 4 warps x 2 n-tiles x 32 lanes, a float4 each), the slot-index buffers."""
    return stages * 16 * 584 * 2 + rows // 4 * 2 * 32 * 16 + (2 * stages - 2) * 16 * 4


@dataclass(frozen=True)
class WaveCost:
    """What one launch costs, in microseconds on the H200 at 1.98 GHz (fitted to each kernel's
    split-count A/B, kernels/NOTES.md), as a function of the KV split count, for grids of fewer
    blocks than SMs: the launch, a block's fixed part (Q load, pipeline fill, epilogue), one key
    tile of a row tile, the merge's launch, and one split's partial row (2 KB of fp32 written, then
    read by the merge, mostly from the L2)."""

    launch_us: float
    block_us: float
    tile_us: float
    merge_us: float
    partial_row_us: float

    def time_us(self, ctas: int, rows: int, kv_tiles: int, splits: int, sms: int) -> float:
        """Waves of one block per SM (the kernels take one SM's shared memory), each as long as one
        block's split, plus the merge of `rows` rows' partials when the keys are split."""
        waves = math.ceil(ctas * splits / sms)
        main = self.launch_us + waves * (self.block_us + math.ceil(kv_tiles / splits) * self.tile_us)
        return main if splits == 1 else main + self.merge_us + rows * splits * self.partial_row_us


@dataclass(frozen=True, kw_only=True)
class AttnKernel(CudaKernel):
    """A verify_attn kernel: its block owns `rows` (token, head) rows of one request and walks its
    KV split in tiles of `keys`; each split has at least `split_min_tiles` tiles; `rebalance` splits
    a full grid in two where that evens out a ragged last wave. `pieces`: it reads its operands
    pre-split, one 16-row tile of them being `pieces` bytes, written first by the entry
    <entry>_pieces (grid (PIECES_SPLIT x tiles, B) of PIECES_BLOCK threads). `min_fill`: the
    fraction of the SMs its grid must occupy for the launch to pick it. `dependent`: its pieces,
    main and merge kernels are launched as programmatic dependents of the grid before each.
    `wave`: its measured costs, which price the split count of grids under one wave (splits_for).
    `max_split_keys`: the most keys one block may sum, for the variant's accuracy (0: no limit).
    `balance_knob`: the define (compile-time and read by the launch, default 0) under which the
    kernel runs the balanced schedule of kernels/attn_schedule.cuh for batches of 2 to
    LPT_MAX_BATCH requests (its main entry takes (chunk, sms, meta) after the workspace and
    <entry>_merge_lpt merges); "": it has none. `pdl_knob`: the define (likewise) under which its
    main and merge entries wait for the grid before them, so the launch makes them programmatic
    dependents; "": launched as `dependent` says. `hint_knob`: the define (default 0 in the source)
    that puts L2 evict-first hints on the key gather, which launched_build sets for small calls.
    A block adds its keys' P·V into O in plain fp32, which drifts like u·sqrt(terms): fp32_dmma
    adds one fmaf a key, fp32_bf16x3 one add per 16-key tile. On the CPU emulator with one split,
    dmma reached rel L2 1.4e-6 at 8k keys and bf16x3 9.6e-7 at 32k, against the fp32 contract's
    1e-6 (kernels/NOTES.md). The launch splits longer ranges; the merge adds the parts.
    The launch knob SPLITS (`--define NAME:SPLITS=N`) forces the split count."""

    rows: int
    keys: int
    split_min_tiles: int = 4
    rebalance: bool = False
    pieces: int = 0
    min_fill: float = 0.0
    dependent: bool = False
    wave: WaveCost | None = None
    max_split_keys: int = 0
    balance_knob: str = ""
    pdl_knob: str = ""
    hint_knob: str = ""
    launch_knobs: tuple[str, ...] = (SPLITS_KNOB,)

    @property
    def merge(self) -> str:
        return self.entry + "_merge"


# In the order the launch tries them: the first that runs on the GPU (and fills its min_fill) serves.
KERNELS = (
    AttnKernel(op="verify_attn", variant="fp32", name="fp32_bf16x3", role="default",
               serves="sm_90 and newer (built for sm_90a / sm_100a) where its grid, split by its wave "
                      "model, fills 3/4 of the SMs (B=4 H=16 Q=17 P=8192: 68 x 7 splits, 381 us "
                      "against fp32_dmma's 585)",
               rows=16, keys=16, threads=512, smem=229576, arch_feature="a", pieces=55296, min_sm=90,
               min_fill=0.75, dependent=True, compute_unit="bf16_mma_x6",
               max_split_keys=16384,           # rel L2 6.9e-7 at 16k keys in one split (9.6e-7 at 32k)
               # non-negative least squares over 80 launches of results/ab-fp32-sweep.json (8 shapes
               # x 10 split counts): a block's fixed part and the merge fit as 0, absorbed in the rest
               wave=WaveCost(launch_us=7.6, block_us=0.0, tile_us=1.14, merge_us=0.0, partial_row_us=0.0024)),
    AttnKernel(op="verify_attn", variant="fp32", name="fp32_dmma", role="fallback",
               serves="grids that fp32_bf16x3 cannot spread over 3/4 of the SMs (too few keys to "
                      "split: B=1 H=16 Q=17 P=16), on GPUs with 228,656 B of shared memory a block",
               rows=34, keys=16, threads=384, smem=228592, min_sm=90,    # mma m16n8k4 f64: sm_90
               max_split_keys=1024),             # rel L2 7.2e-7 at 2k keys in one split (1.4e-6 at 8k)
    AttnKernel(op="verify_attn", variant="fp32", name="fp32_ffma99", role="fallback",
               serves="GPUs where neither fp32 kernel above runs: A100 (sm_80) and 101,376 B of shared memory a "
                      "block (sm_86, sm_89, sm_120, sm_121); exact fp32 on FFMA at 16-row x 8-key tiles; run on the "
                      "CPU emulator and on an H100 as sm_120 (every fp32 golden, results/h100/s16/)",
               rows=16, keys=8, threads=256, smem=79104, min_sm=80, split_min_tiles=8),
    AttnKernel(op="verify_attn", variant="bf16_paged", name="bf16_wgmma2", role="default",
               serves="sm_90 (H100, H200: wgmma is sm_90a code), every shape",
               rows=64, keys=64, threads=256, smem=223768, arch_feature="a", split_min_tiles=2,
               rebalance=True, only_sm=90, balance_knob="WG2_LPT", pdl_knob="WG2_PDL",
               hint_knob="WG2_KV_HINT",
               launch_knobs=(SPLITS_KNOB, CHUNK_KNOB, "WG2_LPT", "WG2_PDL"),
               wave=WaveCost(launch_us=4.0, block_us=5.0, tile_us=1.8, merge_us=1.0, partial_row_us=0.0005)),
    AttnKernel(op="verify_attn", variant="bf16_paged", name="bf16_mma", role="fallback",
               serves="GPUs other than sm_90 with 166,208 B of shared memory a block (sm_80, sm_100)",
               rows=64, keys=32, threads=256, smem=166144, min_sm=80),
    AttnKernel(op="verify_attn", variant="bf16_paged", name="bf16_mma99", role="fallback",
               serves="GPUs where bf16_mma does not fit: 101,376 B of shared memory a block (sm_86, sm_89, sm_120, "
                      "sm_121); 48-row (32 where they pad a request's Q·H rows less) x 16-key tiles, Q in "
                      "registers, 4 warps a row group, a 4-stage K/V ring; run on the CPU emulator and on an H100 "
                      "as sm_120 (results/h100/s16/bench-mma99-rows.json: with the row choice 0.62-1.20x bf16_mma's "
                      "time on 29 serving cases)",
               rows=48, keys=16, threads=384, smem=mma99_smem(48, 4), min_sm=80, split_min_tiles=8,
               launch_knobs=(SPLITS_KNOB, M99_ROWS),
               # modeled, not fitted (kernels/NOTES.md, "bf16_mma99"): a 16-key step 0.65 us (shared
               # memory-bound on an H100 as sm_120, tensor-bound on an RTX PRO 6000), a block's ring
               # fill and epilogue 2.5 us; launch, merge and partial rows as bf16_wgmma2's
               wave=WaveCost(launch_us=4.0, block_us=2.5, tile_us=0.65, merge_us=1.0, partial_row_us=0.0005)),
)


def mma99_rows(rows_per_request: int) -> int:
    """bf16_mma99's row tile where no M99_ROWS is given: 32 where 32-row tiles pad a request's
    (token, head) rows less than 48-row ones (Q·H = 32 or 64 in the serving suite), else 48. On the
    H100 run as sm_120 (results/h100/s16/bench-mma99-rows.json) 32 rows took 0.77-0.89x the 48-row
    time on all 8 cases where they pad less, and up to 1.91x where they do not (Q·H = 520)."""
    return 32 if -(-rows_per_request // 32) * 32 < -(-rows_per_request // 48) * 48 else 48


def launched_build(k: AttnKernel, variant: str, inputs, defines) -> tuple[AttnKernel, dict]:
    """The build of k a launch on these inputs runs, and its defines: the caller's, with the
    launch's shape-dependent choices added where the caller gave none (bf16_mma99's M99_ROWS by
    mma99_rows, left out at the default 48 so that build is the plain one; k's hint_knob 1 where a
    call reads at most KV_HINT_MAX_BYTES of keys), then as_built."""
    defines = dict(defines or {})
    if k.hint_knob and k.hint_knob not in defines:
        batch = LAYOUTS[variant].dims(inputs)[0]
        if batch * LAYOUTS[variant].request_keys(inputs) * ROW * 2 <= KV_HINT_MAX_BYTES:
            defines[k.hint_knob] = "1"
    if k.name == "bf16_mma99" and M99_ROWS not in defines:
        _, q_len, heads, _ = LAYOUTS[variant].dims(inputs)
        rows = mma99_rows(q_len * heads)
        if rows != M99_DEFAULTS[M99_ROWS]:
            defines[M99_ROWS] = str(rows)
    return as_built(k, defines), defines


def as_built(k: AttnKernel, defines) -> AttnKernel:
    """k as a build with these `--define` knobs launches it: bf16_mma99's M99_ROWS and M99_STAGES
    set its rows, block and shared memory; ValueError for a value it has no tiling for. Other
    kernels' knobs leave their launch as registered."""
    if k.name != "bf16_mma99":
        return k
    knobs = dict(M99_DEFAULTS)
    for name in M99_CHOICES:
        if name in defines:
            value = str(defines[name])
            if not value.isdigit() or int(value) not in M99_CHOICES[name]:
                raise ValueError(f"{name}={value}: bf16_mma99 takes {name} in "
                                 f"{', '.join(map(str, M99_CHOICES[name]))}")
            knobs[name] = int(value)
    rows = knobs[M99_ROWS]
    return replace(k, rows=rows, threads=8 * rows, smem=mma99_smem(rows, knobs[M99_STAGES]))


WAVE_MARGIN = 0.03      # the wave model's choice: the fewest splits within 3% of its best time
WAVE_OVERRIDE = 0.10    # ... and it replaces the fill rule's only where it prices it 10% faster


def _splits_for_speed(k: AttnKernel, ctas: int, kv_len: int, sms: int, rows: int) -> int:
    """KV splits per (row tile, request). Fewer tiles than SMs: as many splits as fill the SMs (the
    fill rule), each split at least k.split_min_tiles key tiles; with k.wave, the fewest splits
    whose modeled time (WaveCost) is within WAVE_MARGIN of the best instead, where the model prices
    that WAVE_OVERRIDE faster than the fill rule's (its figures are within a few percent of the bench
    medians: a smaller difference is not a prediction). One or more waves: with k.rebalance, split
    in two when that evens out a ragged last wave by more than 3%."""
    if ctas >= sms:
        if k.rebalance and kv_len >= 16 * k.keys:
            one, two = math.ceil(ctas / sms), math.ceil(2 * ctas / sms) / 2
            return 2 if two < 0.97 * one else 1
        return 1
    most = max(1, math.ceil(kv_len / (k.split_min_tiles * k.keys)))
    fill = min(sms // ctas, most)
    if k.wave is None:
        return fill
    kv_tiles = math.ceil(kv_len / k.keys)
    times = [k.wave.time_us(ctas, rows, kv_tiles, s, sms) for s in range(1, most + 1)]
    best = min(times)
    modeled = next(s for s, t in enumerate(times, start=1) if t <= best * (1 + WAVE_MARGIN))
    return modeled if times[modeled - 1] * (1 + WAVE_OVERRIDE) <= times[fill - 1] else fill


def splits_for(k: AttnKernel, ctas: int, kv_len: int, sms: int, rows: int) -> int:
    """KV splits per (row tile, request): the split count for speed (_splits_for_speed), raised
    where a split would hold more than about k.max_split_keys keys (its accuracy; a split's range
    is then rounded up to whole key tiles)."""
    splits = _splits_for_speed(k, ctas, kv_len, sms, rows)
    return max(splits, math.ceil(kv_len / k.max_split_keys)) if k.max_split_keys else splits


def grid(k: AttnKernel, inputs, sms: int) -> tuple[int, int, int, int, int]:
    """(B, Q, H, row tiles per request, KV splits) of the grid k is launched with on `sms` SMs."""
    layout = LAYOUTS[k.variant]
    batch, q_len, heads, _ = layout.dims(inputs)
    tiles = math.ceil(q_len * heads / k.rows)
    return batch, q_len, heads, tiles, splits_for(k, tiles * batch, layout.request_keys(inputs), sms,
                                                  batch * q_len * heads)


def choose(variant, inputs, gpu: Gpu | None) -> str:
    """The first kernel of the variant in KERNELS that runs on `gpu` and whose grid fills its
    min_fill of the SMs (H200: fp32_bf16x3 when its split grid fills 3/4 of them, else fp32_dmma;
    bf16_wgmma2)."""
    gpu = gpu or Gpu.here()
    for k in KERNELS:
        if k.variant != variant or not k.runs_on(gpu):
            continue
        if k.min_fill:
            batch, _, _, tiles, splits = grid(k, inputs, gpu.sms)
            if tiles * batch * splits / gpu.sms < k.min_fill:
                continue
        return k.name
    raise DeviceError(f"no verify_attn/{variant} kernel runs on sm_{gpu.arch} with {gpu.smem_optin} B of "
                      f"shared memory a block (kernels/README.md lists what each needs; docs/gpus.md)")


def serving(variant, gpu: Gpu) -> tuple[str, ...]:
    """The kernels `choose` picks for some shape on `gpu`: in KERNELS order, those that run there
    up to and including the first without a min_fill (a kernel with one is passed over for a grid
    that does not fill it, so the next may serve)."""
    out = []
    for k in KERNELS:
        if k.variant != variant or not k.runs_on(gpu):
            continue
        out.append(k.name)
        if not k.min_fill:
            break
    return tuple(out)


def knob_value(k: AttnKernel, defines, name: str) -> int:
    """A define that the kernel's build and its launch both read: the build's value, or the default
    the kernel's source gives it (so the two cannot disagree; bf16_wgmma2's: WG2_PDL 1, WG2_LPT 0,
    the measured trade-offs in kernels/NOTES.md, sessions 16-19); 0 where neither gives one."""
    value = defines.get(name, source_default(k.source, name))
    return 0 if value is None else int(value)


def knob_on(k: AttnKernel, defines, name: str) -> bool:
    """A switch knob (knob_value) not 0."""
    return knob_value(k, defines, name) != 0


def balanced(k: AttnKernel, batch: int, tiles: int, kv_mean: int, splits: int, sms: int) -> bool:
    """Whether the launch runs k's balanced schedule (k.balance_knob on) rather than the uniform
    grid: for 2 to LPT_MAX_BATCH requests, where the uniform grid would split the keys (and so
    launch a merge anyway) or the work is at least LPT_MIN_SHARE key tiles an SM. Below that a
    batch is a few microseconds, and the schedule's merge, launched whether or not a request was
    split (the host cannot see the lengths), would cost more than the balance could gain."""
    work = tiles * batch * math.ceil(kv_mean / k.keys)
    return 2 <= batch <= LPT_MAX_BATCH and (splits > 1 or work >= LPT_MIN_SHARE * sms)


def segment_blocks(sms: int, tiles: int) -> int:
    """The segment schedule's blocks a row tile (WG2_LPT=2, kernels/attn_schedule.cuh): about one
    block an SM, each taking an equal share of the batch's key tiles."""
    return max(1, sms // tiles)


def balanced_chunk(k: AttnKernel, kv_mean: int, splits: int) -> int:
    """The balanced schedule's least chunk, in keys: the uniform grid's split of the mean request
    (so a batch of equal requests runs the very splits the uniform grid would)."""
    return k.keys * math.ceil(math.ceil(kv_mean / splits) / k.keys)


def balanced_jobs(batch: int, kv_mean: int, chunk: int) -> int:
    """An upper bound, from shapes, on the schedule's jobs sum_b ceil(kvlen_b / c) for any chunk
    c >= `chunk` (the kernel may take a larger one): sum_b kvlen_b <= batch * kv_mean."""
    return (batch * kv_mean + batch * (chunk - 1)) // chunk


def _partials(jobs: int, rows: int, device):
    """The split-KV workspace (attn_common.cuh): o [jobs, rows, 512], m and l [jobs, rows], fp32."""
    import torch

    return [torch.empty((jobs, rows, LATENT), dtype=torch.float32, device=device),
            torch.empty((jobs, rows), dtype=torch.float32, device=device),
            torch.empty((jobs, rows), dtype=torch.float32, device=device)]


def run_cuda(op, variant, inputs, params, outputs, kernel=None, splits=None, defines=None) -> None:
    """One block per (row tile, request, KV split), a merge kernel when the keys are split; with a
    balanced kernel and 2 to LPT_MAX_BATCH requests, one block per (row tile, job) of the balanced
    schedule (kernels/attn_schedule.cuh) and its merge, which finishes the requests it split."""
    from ctypes import c_int, c_void_p

    k, defines = launched_build(op.cuda_kernel(kernel or op.kernel_choice(variant, inputs, params), variant),
                                variant, inputs, defines)
    layout = LAYOUTS[variant]
    sms = multiprocessor_count()
    batch, q_len, heads, tiles, auto_splits = grid(k, inputs, sms)
    kv_bound = layout.dims(inputs)[3]
    kv_tiles = math.ceil(kv_bound / k.keys)
    rows = batch * q_len * heads
    forced = defines.pop(SPLITS_KNOB, None)           # launch knobs, not compile-time defines
    forced_chunk = defines.pop(CHUNK_KNOB, None)
    uniform = forced is not None or splits is not None
    splits = int(forced) if forced is not None else auto_splits if splits is None else splits
    if forced is not None and not 1 <= splits <= kv_tiles:
        raise ValueError(f"{SPLITS_KNOB}={forced}: this case takes 1 to {kv_tiles} KV splits "
                         f"(its key tiles of {k.keys})")
    kv_mean = layout.request_keys(inputs)
    lpt = (bool(k.balance_knob) and knob_on(k, defines, k.balance_knob) and not uniform
           and (balanced(k, batch, tiles, kv_mean, splits, sms)
                or (forced_chunk is not None and 2 <= batch <= LPT_MAX_BATCH)))
    segments = lpt and knob_value(k, defines, k.balance_knob) == 2
    if forced_chunk is not None:
        if segments:
            raise ValueError(f"{CHUNK_KNOB}={forced_chunk}: the segment schedule ({k.balance_knob}=2) cuts the "
                             f"batch's key tiles in equal shares and takes no chunk")
        if not lpt:
            raise ValueError(f"{CHUNK_KNOB}={forced_chunk}: forces the balanced schedule's chunk, and this launch "
                             f"runs the uniform grid (the schedule serves {k.name} batches of 2 to "
                             f"{LPT_MAX_BATCH} requests, without {SPLITS_KNOB})")
        if int(forced_chunk) < k.keys or int(forced_chunk) % k.keys:
            raise ValueError(f"{CHUNK_KNOB}={forced_chunk}: a chunk is a positive multiple of {k.keys} keys")
    dependent = k.dependent or (bool(k.pdl_knob) and knob_on(k, defines, k.pdl_knob) and batch <= PDL_MAX_BATCH)
    k.require_present()                               # KDTREE_GPU may pick what this GPU cannot run
    arch = device_arch() + k.arch_feature if k.arch_feature else None
    main = get_kernel(k.source, k.entry, arch=arch, defines=defines)
    device = outputs["out"].device
    operands = layout.kernel_operands(inputs)
    if k.pieces:
        import torch

        pieces = torch.empty(batch * (kv_tiles + tiles) * k.pieces, dtype=torch.uint8, device=device)
        get_kernel(k.source, k.entry + "_pieces", arch=arch).launch(
            (PIECES_SPLIT * (kv_tiles + tiles), batch), PIECES_BLOCK,
            operands + [inputs["prefix_len"], c_int(q_len), c_int(heads), c_int(kv_bound), pieces],
            dependent=k.dependent)
        operands = [pieces]
    sm_scale = float(params["sm_scale"])
    out = [outputs["out"], outputs["lse"]]
    if lpt:
        import torch

        merger = get_kernel(k.source, k.merge + "_lpt", arch=arch, defines=defines)
        if segments:                                  # blocks of equal shares; slots y + b: G + B - 1 at most
            blocks = segment_blocks(sms, tiles)
            jobs, chunk, fair = blocks, 0, 0
            workspace = _partials(blocks + batch, q_len * heads, device)
        else:
            chunk = int(forced_chunk) if forced_chunk is not None else balanced_chunk(k, kv_mean, auto_splits)
            jobs = balanced_jobs(batch, kv_mean, chunk)
            fair = 0 if forced_chunk is not None else sms
            workspace = _partials(jobs, q_len * heads, device)
        meta = torch.empty(2 * batch, dtype=torch.int32, device=device)     # (first slot, chunks) a request
        args = operands + layout.kernel_tail(inputs, batch, q_len, heads, kv_bound, sm_scale, 0)
        main.launch((tiles, jobs, 1), k.threads, args + out + workspace + [c_int(chunk), c_int(fair), meta],
                    shared_mem=k.smem, dependent=dependent)
        merger.launch((q_len * heads, batch), 128,
                      workspace + [meta, c_int(q_len * heads)] + out, dependent=dependent)
        return
    merger = get_kernel(k.source, k.merge, arch=arch, defines=defines) if splits > 1 else None
    workspace = _partials(splits, rows, device) if splits > 1 else [c_void_p(0)] * 3
    args = operands + layout.kernel_tail(inputs, batch, q_len, heads, kv_bound, sm_scale, splits)
    tail = [c_int(0), c_int(0), c_void_p(0)] if k.balance_knob else []     # no balanced schedule
    main.launch((tiles, batch, splits), k.threads, args + out + workspace + tail, shared_mem=k.smem,
                dependent=dependent)
    if merger is not None:
        merger.launch(rows, 128, workspace + [c_int(splits), c_int(rows)] + out, dependent=dependent)
