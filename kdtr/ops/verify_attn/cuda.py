"""verify_attn's CUDA binding: the kernel registry (kernels/README.md is its table), the launch's
choice of kernel and its grid (row tiles x requests x KV splits, a merge when the keys are split)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import DeviceError
from ...runtime.device import device_arch, get_kernel, multiprocessor_count
from ..base import CudaKernel, Gpu
from .layouts import LATENT, LAYOUTS

PIECES_SPLIT, PIECES_BLOCK = 4, 144     # a `pieces` kernel's blocks per tile and threads per block


SPLITS_KNOB = "SPLITS"    # the launch knob (--define NAME:SPLITS=N) that forces the KV split count


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
               serves="GPUs where neither fp32 kernel above runs: A100 (sm_80) and 101,376 B of shared "
                      "memory a block (sm_86, sm_89, sm_120, sm_121); exact fp32 on FFMA at 16-row x 8-key "
                      "tiles, run on the CPU emulator, not yet on a GPU",
               rows=16, keys=8, threads=256, smem=79104, min_sm=80, split_min_tiles=8),
    AttnKernel(op="verify_attn", variant="bf16_paged", name="bf16_wgmma2", role="default",
               serves="sm_90 (H100, H200: wgmma is sm_90a code), every shape",
               rows=64, keys=64, threads=256, smem=223768, arch_feature="a", split_min_tiles=2,
               rebalance=True, only_sm=90,
               wave=WaveCost(launch_us=4.0, block_us=5.0, tile_us=1.8, merge_us=1.0, partial_row_us=0.0005)),
    AttnKernel(op="verify_attn", variant="bf16_paged", name="bf16_mma", role="fallback",
               serves="GPUs other than sm_90 with 166,208 B of shared memory a block (sm_80, sm_100)",
               rows=64, keys=32, threads=256, smem=166144, min_sm=80),
    AttnKernel(op="verify_attn", variant="bf16_paged", name="bf16_mma99", role="fallback",
               serves="GPUs where bf16_mma does not fit: 101,376 B of shared memory a block (sm_86, sm_89, "
                      "sm_120, sm_121); bf16_mma's block at 48-row x 16-key tiles, run on the CPU emulator, not "
                      "yet on a GPU",
               rows=48, keys=16, threads=192, smem=99712, min_sm=80, split_min_tiles=8),
)


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


def run_cuda(op, variant, inputs, params, outputs, kernel=None, splits=None, defines=None) -> None:
    """One block per (row tile, request, KV split); a merge kernel when the keys are split."""
    import torch

    k = op.cuda_kernel(kernel or op.kernel_choice(variant, inputs, params), variant)
    layout = LAYOUTS[variant]
    batch, q_len, heads, tiles, auto_splits = grid(k, inputs, multiprocessor_count())
    kv_bound = layout.dims(inputs)[3]
    kv_tiles = math.ceil(kv_bound / k.keys)
    rows = batch * q_len * heads
    defines = dict(defines or {})
    forced = defines.pop(SPLITS_KNOB, None)           # a launch knob, not a compile-time define
    splits = int(forced) if forced is not None else auto_splits if splits is None else splits
    if forced is not None and not 1 <= splits <= kv_tiles:
        raise ValueError(f"{SPLITS_KNOB}={forced}: this case takes 1 to {kv_tiles} KV splits "
                         f"(its key tiles of {k.keys})")
    k.require_present()                               # KDTREE_GPU may pick what this GPU cannot run
    arch = device_arch() + k.arch_feature if k.arch_feature else None
    main = get_kernel(k.source, k.entry, arch=arch, defines=defines)
    merger = get_kernel(k.source, k.merge, arch=arch, defines=defines) if splits > 1 else None
    device = outputs["out"].device
    if splits > 1:
        workspace = [torch.empty((splits, rows, LATENT), dtype=torch.float32, device=device),
                     torch.empty((splits, rows), dtype=torch.float32, device=device),
                     torch.empty((splits, rows), dtype=torch.float32, device=device)]
    else:
        from ctypes import c_void_p

        workspace = [c_void_p(0)] * 3
    operands = layout.kernel_operands(inputs)
    if k.pieces:
        from ctypes import c_int

        pieces = torch.empty(batch * (kv_tiles + tiles) * k.pieces, dtype=torch.uint8, device=device)
        get_kernel(k.source, k.entry + "_pieces", arch=arch).launch(
            (PIECES_SPLIT * (kv_tiles + tiles), batch), PIECES_BLOCK,
            operands + [inputs["prefix_len"], c_int(q_len), c_int(heads), c_int(kv_bound), pieces],
            dependent=k.dependent)
        operands = [pieces]
    args = operands + layout.kernel_tail(inputs, batch, q_len, heads, kv_bound, float(params["sm_scale"]), splits)
    main.launch((tiles, batch, splits), k.threads, args + [outputs["out"], outputs["lse"], *workspace],
                shared_mem=k.smem, dependent=k.dependent)
    if merger is not None:
        from ctypes import c_int

        merger.launch(rows, 128, [*workspace, c_int(splits), c_int(rows), outputs["out"], outputs["lse"]],
                      dependent=k.dependent)
