"""verify_attn's KV split choice for grids under one wave: the wave models (WaveCost) of bf16_wgmma2
and fp32_bf16x3 against the fill rule they replaced (as many splits as fill the SMs), and against
the split counts measured on the H200's 132 SMs."""

import math

import numpy as np
import pytest

from kdtr.ops.base import H200
from kdtr.ops.verify_attn.cuda import KERNELS, WAVE_MARGIN, WAVE_OVERRIDE, splits_for

WGMMA2 = next(k for k in KERNELS if k.name == "bf16_wgmma2")


def shape(batch, heads, q_len, prefix):
    """(ctas, kv_bound, rows) of a dense-prefix shape for bf16_wgmma2."""
    return batch * math.ceil(q_len * heads / WGMMA2.rows), prefix + q_len, batch * q_len * heads


def fill_rule(ctas, kv_bound, k=WGMMA2):
    return min(H200.sms // ctas, math.ceil(kv_bound / (k.split_min_tiles * k.keys)))


# Shapes where the fill rule's choice measured well on the H200 (the model must keep it; at
# B=1 H=8 Q=65 P=2048 the model's own best, 17 splits, is priced under 10% faster than 14).
KEPT = [(1, 16, 17, 2048), (1, 8, 17, 32768), (1, 16, 17, 131072), (8, 8, 33, 8192), (8, 16, 17, 8192),
        (8, 8, 17, 32768), (8, 8, 17, 2048), (8, 16, 5, 8192), (1, 8, 9, 21), (1, 128, 65, 131072),
        (1, 8, 65, 2048), (8, 8, 65, 2048)]


@pytest.mark.parametrize("dims", KEPT, ids=lambda d: "b{}_h{}_q{}_p{}".format(*d))
def test_the_wave_model_keeps_the_fill_rule_where_it_served(dims):
    ctas, kv_bound, rows = shape(*dims)
    assert ctas < H200.sms
    assert splits_for(WGMMA2, ctas, kv_bound, H200.sms, rows) == fill_rule(ctas, kv_bound)


def test_the_wave_model_splits_a_grid_the_fill_rule_left_at_55_percent():
    """B=8 H=16 Q=33 P=8192: 72 blocks on 132 SMs; the fill rule gives 1 split (a second would be
    144 blocks, two waves); the model prices 5 (360 blocks, three waves of a fifth as long each):
    the split-count A/B measured 180.8 us at 5 against 242.5 at 1 (results/ab-splits.json)."""
    ctas, kv_bound, rows = shape(8, 16, 33, 8192)
    assert (ctas, fill_rule(ctas, kv_bound)) == (72, 1)
    assert splits_for(WGMMA2, ctas, kv_bound, H200.sms, rows) == 5


def test_a_paged_batch_is_priced_by_its_mean_request():
    """The paged layout's shapes bound the keys by sum P_b + Q (B times one request's at equal
    prefixes); the split choice takes the mean request instead, ceil(sum P_b / B) + Q."""
    from kdtr.ops.verify_attn.layouts import LAYOUTS

    batch, q_len, prefix = 8, 33, 8192
    inputs = {"kv_indptr": np.zeros(batch + 1), "tree_slots": np.zeros(batch * q_len),
              "kv_indices": np.zeros(batch * prefix), "q": np.zeros((batch * q_len, 16, 576))}
    assert LAYOUTS["bf16_paged"].dims(inputs)[3] == batch * prefix + q_len
    assert LAYOUTS["bf16_paged"].request_keys(inputs) == prefix + q_len
    inputs["kv_indices"] = np.zeros(batch * prefix - 3)                     # mixed: rounds up
    assert LAYOUTS["bf16_paged"].request_keys(inputs) == prefix + q_len


@pytest.mark.parametrize("dims", KEPT + [(8, 16, 33, 8192), (8, 8, 65, 2048), (2, 64, 9, 100)])
def test_the_model_overrides_the_fill_rule_only_by_a_clear_margin(dims):
    """Where the choice differs from the fill rule's, the model prices it WAVE_OVERRIDE faster and
    it is the fewest splits within WAVE_MARGIN of the model's best."""
    ctas, kv_bound, rows = shape(*dims)
    kv_tiles = math.ceil(kv_bound / WGMMA2.keys)
    most = max(1, math.ceil(kv_bound / (WGMMA2.split_min_tiles * WGMMA2.keys)))
    times = {s: WGMMA2.wave.time_us(ctas, rows, kv_tiles, s, H200.sms) for s in range(1, most + 1)}
    chosen, fill = splits_for(WGMMA2, ctas, kv_bound, H200.sms, rows), fill_rule(ctas, kv_bound)
    assert 1 <= chosen <= most
    if chosen != fill:
        assert times[chosen] * (1 + WAVE_OVERRIDE) <= times[fill]
        assert times[chosen] <= min(times.values()) * (1 + WAVE_MARGIN)
        assert all(times[s] > min(times.values()) * (1 + WAVE_MARGIN) for s in range(1, chosen))


def test_kernels_without_a_wave_model_keep_the_fill_rule():
    fp32 = next(k for k in KERNELS if k.name == "fp32_dmma")
    assert fp32.wave is None
    assert splits_for(fp32, 8, 2065, H200.sms, 272) == min(132 // 8, math.ceil(2065 / (fp32.split_min_tiles * 16)))


def test_a_forced_split_count_past_the_key_tiles_fails_before_any_launch():
    """--define bf16_wgmma2:SPLITS=N: N beyond the case's key tiles would only allocate empty
    partials; the launch refuses it, naming the range, before it compiles or allocates anything."""
    from types import SimpleNamespace

    from kdtr.ops import get_op
    from kdtr.ops.base import H200, Case
    from kdtr.runtime.device import stand_in

    op = get_op("verify_attn")
    case = Case("c", "verify_attn", "bf16_paged", 5, dict(op._defaults, batch=2, heads=8, prefix=100, budget=8))
    gen = op.generate(case)
    h200 = SimpleNamespace(arch=H200.arch, sms=H200.sms, smem_optin=H200.smem_optin,
                           get_kernel=lambda *a, **k: pytest.fail("compiled a refused launch"))
    tiles = math.ceil((2 * 100 + 9) / 64)
    with stand_in(h200), pytest.raises(ValueError, match=f"SPLITS=99: this case takes 1 to {tiles} KV splits"):
        op.run_cuda("bf16_paged", gen.inputs, gen.params, {}, kernel="bf16_wgmma2", defines={"SPLITS": "99"})


X3 = next(k for k in KERNELS if k.name == "fp32_bf16x3")


def _fp32_sweep():
    """Per case of results/ab-fp32-sweep.json: (ctas, kv_len, rows), {split count: median ms} of
    fp32_bf16x3 and fp32_dmma's median. Its plain fp32_bf16x3 row ran the fill rule (the code before
    the wave model), each SPLITS=N row N splits."""
    import re

    from kdtr import bench
    from kdtr.config import REPO_ROOT

    record = bench.load_record(REPO_ROOT / "results" / "ab-fp32-sweep.json")
    cases = {}
    for r in record.rows:
        p = r.params
        q_len = p["budget"] + 1
        dims = (p["batch"] * math.ceil(q_len * p["heads"] / X3.rows), p["prefix"] + q_len,
                p["batch"] * q_len * p["heads"])
        times, dmma = cases.setdefault(r.case, (dims, {}, []))[1:]
        if r.kernel == "fp32_dmma":
            dmma.append(r.timing.median)
            continue
        forced = re.search(r"SPLITS=(\d+)", r.impl)
        times[int(forced.group(1)) if forced else fill_rule(*dims[:2], X3)] = r.timing.median
    return cases


def test_fp32_bf16x3s_wave_model_picks_within_3_percent_of_the_measured_best():
    """The model's split count, on each of the 8 swept shapes, is one the sweep timed, and within 3%
    of the fastest count it timed; there fp32_bf16x3 is faster than fp32_dmma."""
    cases = _fp32_sweep()
    assert len(cases) == 8
    for name, ((ctas, kv_len, rows), times, dmma) in cases.items():
        chosen = splits_for(X3, ctas, kv_len, H200.sms, rows)
        assert chosen in times, (name, chosen, sorted(times))
        assert times[chosen] <= 1.03 * min(times.values()), (name, chosen, times)
        assert times[chosen] < dmma[0], name


# -- the split count for accuracy -------------------------------------------------------------------

DMMA = next(k for k in KERNELS if k.name == "fp32_dmma")


@pytest.mark.parametrize("batch,heads,prefix", [(8, 16, 65536), (16, 16, 8192), (1, 16, 100000), (132, 1, 40000)])
def test_no_fp32_split_sums_more_keys_than_its_kernel_keeps_accurate(batch, heads, prefix):
    """A full grid (one split for speed) or a long prefix: bf16x3 and dmma split so that no block
    adds more than max_split_keys keys (plus the rounding to whole tiles) into its plain fp32 O;
    with one split over 8k keys dmma was 1.4e-6 off on the emulator (kernels/NOTES.md)."""
    kv_len = prefix + 17
    for k in (X3, DMMA):
        ctas = batch * math.ceil(17 * heads / k.rows)
        splits = splits_for(k, ctas, kv_len, H200.sms, batch * 17 * heads)
        chunk = math.ceil(math.ceil(kv_len / splits) / k.keys) * k.keys
        assert chunk <= k.max_split_keys + k.keys, (k.name, splits, chunk)


def test_the_accuracy_floor_leaves_the_recorded_shapes_alone():
    """Every fp32 golden and bench shape keeps the kernel and split count it was verified and timed
    with (the floor only adds splits past max_split_keys keys), and so do the 8 shapes of the
    split sweep (results/ab-fp32-sweep.json, up to P = 16384)."""
    from kdtr.ops.verify_attn import cuda

    shapes = [(2, 8, 9, 0), (3, 8, 5, 1), (2, 16, 17, 2048), (1, 16, 17, 2048), (1, 64, 33, 128), (2, 64, 9, 512),
              (1, 128, 17, 256), (4, 16, 17, 1024), (2, 16, 1, 64), (1, 16, 9, 300), (2, 16, 4, 128),
              (4, 16, 17, 8192)]
    for batch, heads, q_len, prefix in shapes:
        inputs = {"q": np.zeros((batch, q_len, heads, 576), np.float32),
                  "kv": np.zeros((batch, prefix + q_len, 576), np.float32)}
        k = next(k for k in KERNELS if k.name == cuda.choose("fp32", inputs, H200))
        ctas, rows = batch * math.ceil(q_len * heads / k.rows), batch * q_len * heads
        assert splits_for(k, ctas, prefix + q_len, H200.sms, rows) == \
            cuda._splits_for_speed(k, ctas, prefix + q_len, H200.sms, rows), (k.name, batch, heads, prefix)
    for (ctas, kv_len, rows), _, _ in _fp32_sweep().values():
        assert splits_for(X3, ctas, kv_len, H200.sms, rows) == cuda._splits_for_speed(X3, ctas, kv_len, H200.sms, rows)
