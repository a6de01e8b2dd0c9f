"""kdtr.reports.roofline: floors from a cost and a GPU's ceilings, the GPU rows' ceilings against their
sources, and which bench cases the roofline prices (docs/measuring.md, "Floors and targets")."""

from __future__ import annotations

import json

import pytest

from kdtr.config import REPO_ROOT
from kdtr.gpus import GPU_MODELS, Rates
from kdtr.ops.base import Cost
from kdtr.reports.roofline import Floor, floor, rated_gpus, roofline
from kdtr.bundle.spec import load_suites

BENCH_SUITES = REPO_ROOT / "specs" / "bench"
GPU = Rates("test GPU", bf16_flops=500e12, dram_bytes=2e12)         # ridge 250 FLOP/byte


@pytest.mark.parametrize("cost,expected", [
    (Cost(flops=1e12, bytes=1e9), Floor("test GPU", 2e-3, "compute")),     # 2 ms of FLOPs, 0.5 ms of bytes
    (Cost(flops=1e9, bytes=1e9), Floor("test GPU", 0.5e-3, "memory")),     # 2 µs of FLOPs, 0.5 ms of bytes
    (Cost(flops=0.0, bytes=4e3), Floor("test GPU", 2e-9, "memory")),       # a latency-bound op's bytes
])
def test_the_floor_is_the_longer_ceiling(cost, expected):
    got = floor(cost, GPU)
    assert (got.gpu, got.bound) == (expected.gpu, expected.bound)
    assert got.seconds == pytest.approx(expected.seconds, rel=1e-12)    # float division's rounding


def test_the_h200_ceilings_are_the_ones_results_bench_json_measured():
    """Stated to 3 significant digits (787 TFLOP/s, 4.40 TB/s): within half a unit of the last."""
    ceilings = json.loads((REPO_ROOT / "results" / "bench.json").read_text(encoding="utf-8"))["ceilings"]
    measured = GPU_MODELS[90].measured
    assert abs(measured.bf16_flops - ceilings["bf16_mma_tflops"] * 1e12) <= 0.5e12
    assert abs(measured.dram_bytes - ceilings["hbm_read_gbps"] * 1e9) <= 0.005e12


def test_rated_rows_name_the_gpu_their_ceilings_are_of():
    """An architecture's row may name several GPUs (H100 / H200): its rates name the one they are of."""
    rated = rated_gpus()
    assert {m.arch for m in rated} >= {90, 120}
    for model in rated:
        for rates in (model.spec_sheet, model.measured):
            assert rates is None or rates.gpu in model.name
        assert model.ceilings == (model.measured or model.spec_sheet)


def test_the_roofline_prices_every_bf16_verify_case_of_the_bench_suites():
    """The bf16 matrix rate prices bf16_paged cases only: not the fp32 variant, not tree_build or
    tree_accept, whose units the GPU rows give no ceiling for."""
    expected = [(str(s.path), c.name) for s in load_suites([BENCH_SUITES]) for c in s.cases
                if c.variant == "bf16_paged"]
    rows = roofline([BENCH_SUITES])
    assert [(r.suite, r.case) for r in rows] == expected
    assert len(expected) >= 40 and all(len(r.floors) == len(rated_gpus()) for r in rows)


def test_the_large_cases_agree_with_the_floor_table_worked_by_hand():
    """docs/measuring.md's 'Floors and targets' table gives these FLOPs to 3 significant digits,
    worked from the shapes by hand (Σ_b H·(Q·P_b + the tree's visible pairs)·2176): within 0.5% of them."""
    by_hand = {"b8_h64_q33_p8192": 301e9, "b64_h16_q65_p32768": 4.75e12, "b1_h128_q65_p131072": 2.37e12}
    rows = {r.case: r for r in roofline([BENCH_SUITES / "verify_attn.yaml"])}
    for name, flops in by_hand.items():
        assert rows[name].cost.flops == pytest.approx(flops, rel=5e-3)
