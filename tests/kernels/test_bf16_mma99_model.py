"""A CPU model of bf16_mma99's index arithmetic (kernels/verify_attn_bf16_mma99.cu) at each of its
tilings (M99_ROWS 32 / 48, M99_STAGES 2 to 4), so that a tiling bug shows without a GPU: the source,
the registry and the launch agree on rows, threads and shared memory; the warps' roles; Q's register
fragments; the S-partial exchange; the copy of a K/V tile; the output lanes; and the two rings (K/V
stages, slot-index buffers) hand each step its own tile. The emulator runs the code itself
(test_emulated_kernels.py); this says why each index is right."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kdtr.ops.verify_attn import OP
from kdtr.ops.verify_attn import cuda
from kdtr.runtime.nvrtc import source_default

SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "verify_attn_bf16_mma99.cu"
D, DV, STR, KEYS = 576, 512, 584, 16
TILINGS = [(rows, stages) for rows in cuda.M99_CHOICES[cuda.M99_ROWS] for stages in cuda.M99_CHOICES[cuda.M99_STAGES]]


def test_the_source_the_registry_and_the_launch_agree():
    text = SOURCE.read_text()
    macro = re.search(r"#define M99_SMEM_BYTES\(rows, stages\) \\\n\s*(.+)\n", text).group(1)
    for rows, stages in TILINGS:
        formula = eval(macro.replace("M99_KEYS", str(KEYS)).replace("M99_STR", str(STR)),
                       {"rows": rows, "stages": stages})
        assert formula == cuda.mma99_smem(rows, stages) <= 101376 - 64
    defaults = {knob: int(source_default(SOURCE.name, knob)) for knob in cuda.M99_DEFAULTS}
    assert defaults == cuda.M99_DEFAULTS
    k = OP.cuda_kernel("bf16_mma99", "bf16_paged")
    rows = defaults[cuda.M99_ROWS]
    assert (k.rows, k.keys, k.threads, k.smem) == (rows, KEYS, 8 * rows, cuda.mma99_smem(rows, defaults[cuda.M99_STAGES]))
    assert f"{k.smem:,} B" in text and cuda.M99_ROWS in k.launch_knobs and cuda.M99_STAGES not in k.launch_knobs
    built = cuda.as_built(k, {cuda.M99_ROWS: "32", cuda.M99_STAGES: "2"})
    assert (built.rows, built.threads, built.smem) == (32, 256, cuda.mma99_smem(32, 2))
    assert cuda.as_built(k, {"M99_SKIP_RESCALE": "0"}) == k
    for bad in ({cuda.M99_ROWS: "64"}, {cuda.M99_STAGES: "5"}, {cuda.M99_ROWS: "x"}):
        with pytest.raises(ValueError, match="bf16_mma99 takes"):
            cuda.as_built(k, bad)


def roles(rows: int):
    """(rg, qd) per warp, as the kernel computes them: warp >> 2, warp & 3."""
    return [(w >> 2, w & 3) for w in range(rows // 4)]


@pytest.mark.parametrize("rows", cuda.M99_CHOICES[cuda.M99_ROWS])
def test_four_warps_a_row_group_one_on_each_sub_partition(rows):
    r = roles(rows)
    assert sorted(r) == [(g, q) for g in range(rows // 16) for q in range(4)]
    for g in range(rows // 16):
        warps = [w for w, (rg, _) in enumerate(r) if rg == g]
        assert sorted(w % 4 for w in warps) == [0, 1, 2, 3]          # sub-partitions 0..3
        assert warps == list(range(4 * g, 4 * g + 4))                # the 128 threads of named barrier 1 + g
        assert 1 <= 1 + g <= 15


@pytest.mark.parametrize("rows", cuda.M99_CHOICES[cuda.M99_ROWS])
def test_q_fragments_cover_each_row_and_dim_once(rows):
    """qf[ks][0..3] of lane (g, t) in warp (rg, qd): rows 16 rg + g (+8), dims 144 qd + 16 ks + 2t (+1)
    (+8): the m16n8k16 A layout; every (row, dim) of the tile in exactly one register half."""
    seen = {}
    for w, (rg, qd) in enumerate(roles(rows)):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for ks in range(9):
                for reg, (dr, dd) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                    for h in (0, 1):
                        key = (rg * 16 + g + dr, qd * 144 + ks * 16 + 2 * t + dd + h)
                        assert key not in seen, (w, lane, ks, reg)
                        seen[key] = (w, lane)
    assert set(seen) == {(r, d) for r in range(rows) for d in range(D)}


@pytest.mark.parametrize("rows", cuda.M99_CHOICES[cuda.M99_ROWS])
def test_each_warp_adds_its_row_groups_four_partials(rows):
    nt = KEYS // 8
    written = {w: {(w * nt + n) * 32 + lane for n in range(nt) for lane in range(32)} for w in range(rows // 4)}
    assert sorted(x for s in written.values() for x in s) == list(range(rows // 4 * nt * 32))
    for w, (rg, _) in enumerate(roles(rows)):
        read = {(rg * 4 * nt + n) * 32 + lane + q * nt * 32 for q in range(4) for n in range(nt) for lane in range(32)}
        assert read == set().union(*(written[4 * rg + q] for q in range(4)))


@pytest.mark.parametrize("rows", cuda.M99_CHOICES[cuda.M99_ROWS])
def test_with_sum_scatter_each_warp_sums_one_quarter_and_reads_all_four(rows):
    """M99_SUM_SCATTER: sQ = (float2*)sX + rg * 16 * 32, [quarter k][writer][lane]. Warp qd writes
    quarter k of its partial to sQ[k][qd]; after the barrier it reads column qd (the four warps'
    quarter qd) and writes their sum over sQ[qd][qd]; after the second, every warp reads the four
    sums sQ[k][k]. Each row group's part is its own 4,096 B of sX's."""
    groups = rows // 16
    assert groups * 16 * 32 * 8 == rows // 4 * (KEYS // 8) * 32 * 16     # sQ fits sX exactly
    for rg in range(groups):
        base = rg * 16 * 32
        written = {(base + (k * 4 + qd) * 32 + lane): qd for qd in range(4) for k in range(4) for lane in range(32)}
        assert len(written) == 16 * 32 and min(written) == base and max(written) == base + 16 * 32 - 1
        for qd in range(4):
            column = {base + (qd * 4 + i) * 32 + lane for i in range(4) for lane in range(32)}
            assert sorted(written[x] for x in column) == sorted(list(range(4)) * 32)     # one partial a warp
        sums = {base + (k * 4 + k) * 32 + lane for k in range(4) for lane in range(32)}
        assert {written[x] == (x - base) // 32 // 4 for x in sums} == {True}    # [k][k]: warp k's own slot


@pytest.mark.parametrize("rows", cuda.M99_CHOICES[cuda.M99_ROWS])
def test_a_tile_copy_covers_each_chunk_once(rows):
    threads = 8 * rows
    tpk = threads // KEYS
    cpt = -(-(D // 8) // tpk)
    copies = [(tid // tpk, tid % tpk + i * tpk) for tid in range(threads) for i in range(cpt)
              if (D // 8) % tpk == 0 or tid % tpk + i * tpk < D // 8]
    assert sorted(copies) == [(k, c) for k in range(KEYS) for c in range(D // 8)]
    assert all((k * STR + c * 8) * 2 % 16 == 0 for k, c in copies)   # 16-byte aligned destinations


@pytest.mark.parametrize("rows", cuda.M99_CHOICES[cuda.M99_ROWS])
def test_each_output_element_has_one_writer(rows):
    seen = {}
    for tid in range(8 * rows):
        lane, (rg, qd) = tid % 32, roles(rows)[tid // 32]
        g, t = lane >> 2, lane & 3
        for r in (rg * 16 + g, rg * 16 + g + 8):
            for n in range(16):
                for e in (0, 1):
                    col = qd * 128 + n * 8 + 2 * t + e
                    assert (r, col) not in seen
                    seen[(r, col)] = tid
    assert len(seen) == rows * DV
    lse = sorted(rg * 16 + (tid % 32 >> 2) + d for tid in range(8 * rows) for rg, qd in [roles(rows)[tid // 32]]
                 if qd == 0 and tid % 4 == 0 for d in (0, 8))
    assert lse == list(range(rows))


@pytest.mark.parametrize("stages, skew", [(s, 0) for s in cuda.M99_CHOICES[cuda.M99_STAGES]] + [(3, 1), (4, 1)])
@pytest.mark.parametrize("ntiles", [0, 1, 2, 3, 4, 5, 9, 16])
def test_the_rings_hand_each_step_its_own_tile(stages, skew, ntiles):
    """With lead = stages - skew (M99_SKEW: the late row groups read tile it-1 at step it too):
    commit group s (s < lead - 1) of the prologue holds tile s; group g = it + lead - 1 of step it
    holds tile it + lead - 1 and the slots of tile it + 2 lead - 2. Step it waits until groups 0..it
    landed (cp.async.wait_group lead - 2), then a barrier. Each copy must read its own tile's slots
    (landed), each stage must hold the tile its step reads (landed), and nothing may be overwritten
    that a later step still reads, or before the barrier after its last read."""
    lead = stages - skew
    slots_n = 2 * lead - 2
    slot_buf = {b: (b, -1) for b in range(slots_n)}        # buffer -> (tile, group it lands in); -1: plain load
    stage = {}                                             # stage -> (tile, group)
    last_read_slot, last_read_stage = {}, {}               # buffer / stage -> step of the last read
    copied = set()

    def copy(tile, group, step):
        held, landed = slot_buf[tile % slots_n]
        assert held == tile and landed < group             # its slots landed in an earlier group (or the prologue)
        last_read_slot[tile % slots_n] = step
        copied.add(tile)
        s = tile % stages
        assert last_read_stage.get(s, -2) < step           # its last reader passed a barrier since
        stage[s] = (tile, group)

    for s in range(lead - 1):                              # prologue (step -1)
        if s < ntiles:
            copy(s, s, -1)
    for it in range(ntiles):
        tile, group = stage[it % stages]
        assert tile == it and group <= it                  # waited: groups 0..it landed
        if skew and it > 0:                                # the late P.V of tile it-1
            assert stage[(it - 1) % stages][0] == it - 1
            last_read_stage[(it - 1) % stages] = it
        nxt, ahead, g = it + lead - 1, it + 2 * lead - 2, it + lead - 1
        if nxt < ntiles:
            copy(nxt, g, it)
        if ahead < ntiles:
            b = ahead % slots_n
            held, _ = slot_buf[b]
            assert (held in copied or held >= ntiles) and last_read_slot.get(b, -2) < it   # read before this step
            slot_buf[b] = (ahead, g)
        last_read_stage[it % stages] = it
    if skew and ntiles:                                    # after the loop: the last late P.V
        assert stage[(ntiles - 1) % stages][0] == ntiles - 1


@pytest.mark.parametrize("rows, tile", [(32, 32), (64, 32), (8, 32), (72, 48), (136, 48), (144, 48),
                                        (272, 48), (520, 48), (96, 48)])
def test_the_row_tile_pads_a_request_least(rows, tile):
    """32-row tiles where they leave fewer padded rows than 48-row ones (64 rows: 64 against 96),
    48 on a tie (72 rows: 96 either way) or where 48 pads less (136 rows: 160 against 144)."""
    assert cuda.mma99_rows(rows) == tile


@pytest.mark.parametrize("heads, budget, threads", [(16, 3, 256), (8, 3, 256), (8, 16, 384)])
def test_the_launch_builds_and_launches_the_chosen_tile(heads, budget, threads):
    """On a stand-in 99 KB GPU the launch compiles M99_ROWS=32 and launches 256 threads for Q·H = 64
    or 32; for Q·H = 136 the plain build (no define) at 384 threads; a given M99_ROWS stays."""
    from kdtr.dtypes import to_torch
    from kdtr.runtime import device

    from .test_attn_launch import RecordingGpu
    from .test_cuda_kernels import FRESH_SEED, generated, poisoned_outputs

    def launch(defines=None):
        gen = generated(OP, "bf16_paged", FRESH_SEED, batch=2, heads=heads, prefix=300, budget=budget,
                        tree="chain")
        inputs = {name: to_torch(a, "cpu") for name, a in gen.inputs.items()}
        outputs = poisoned_outputs(OP, "bf16_paged", gen.inputs, gen.params, device="cpu")
        log = []
        with device.stand_in(RecordingGpu(120, 188, 101376, log)):
            OP.run_cuda("bf16_paged", inputs, gen.params, outputs, kernel="bf16_mma99", defines=defines)
        return log[0]

    main = launch()
    assert main["block"] == threads
    assert main["defines"] == ({} if threads == 384 else {cuda.M99_ROWS: "32"})
    assert launch({cuda.M99_ROWS: "48"})["block"] == 384
