"""kdtr.impl.parity with constructed differences: the numbers it reports are the ones built in."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from kdtr.impl import bf16_ulp, parity
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case

BF16 = ml_dtypes.bfloat16


def steps_up(x: np.ndarray, n: int) -> np.ndarray:
    """x moved n bf16 representable numbers up (through the bit pattern: independent of bf16_ulp)."""
    bits = x.astype(BF16).view(np.uint16).astype(np.int32)
    return (bits + np.where(x >= 0, n, -n)).astype(np.uint16).view(BF16)


@pytest.mark.parametrize("value, ulp", [(1.0, 2.0 ** -7), (1.5, 2.0 ** -7), (0.75, 2.0 ** -8),
                                        (-3.0, 2.0 ** -6), (0.0, 2.0 ** -133), (2.0 ** -130, 2.0 ** -133)])
def test_bf16_ulp_is_the_spacing_at_the_value(value, ulp):
    assert bf16_ulp(np.array([value]))[0] == ulp


def test_one_element_two_ulps_off_reads_two_at_its_position():
    op, inputs, params = small_case("verify_attn", "bf16_paged", **VERIFY_SMALL)
    reference = op.reference("bf16_paged", inputs, params)
    ours = {"out": reference["out"].astype(BF16), "lse": reference["lse"]}
    theirs = {"out": ours["out"].copy(), "lse": reference["lse"].copy()}
    q_len = VERIFY_SMALL["budget"] + 1
    row = 2 * q_len + 3                                   # request 2, tree node 3
    col = int(np.abs(ours["out"][row, 1].astype(np.float64)).argmax())     # above the output's rms
    theirs["out"][row, 1, col] = steps_up(ours["out"][row, 1, col:col + 1], 2)[0]
    report = parity(op, "bf16_paged", ours, theirs, inputs=inputs, params=params)
    out = report.output("out")
    assert out.max_ulps == 2.0
    assert out.worst_index == (row, 1, col)
    assert out.worst_position == {"batch": 2, "node": 3, "head": 1, "rest": [col]}
    delta = abs(float(theirs["out"][row, 1, col]) - float(ours["out"][row, 1, col]))
    assert out.max_abs == delta and out.mean_abs == pytest.approx(delta / out.count)
    assert report.output("lse").max_ulps == 0.0 and report.output("lse").rel_l2 == 0.0
    json.dumps(report.to_json(), allow_nan=False)        # JSON-ready


def test_an_element_near_zero_is_measured_in_ulps_of_the_outputs_rms():
    """Cancellation leaves a few elements near 0, where two correct kernels differ by their fp32
    summation order: against the element's own ulp that read as 10^5 ulps on the H200."""
    op, inputs, params = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    r = {"out": np.array([[4.0, -4.0], [4.0, 2.0 ** -20]], np.float32), "lse": np.ones(3, np.float32)}
    b = {"out": r["out"] + np.array([[0, 0], [0, 2.0 ** -6]], np.float32), "lse": r["lse"]}
    report = parity(op, "fp32", r, b, reference=r)
    rms = math.sqrt((3 * 16 + 2.0 ** -40) / 4)            # 3.46: bf16 spacing 2^-6 there
    assert rms < 4 and report.output("out").max_ulps == 1.0
    assert report.output("out").worst_index == (1, 1)


def test_rel_l2_and_the_reference_magnitude():
    """Against a reference: ulps are of |r|; rel L2 = ||a - b|| / ||r||."""
    op, inputs, params = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    r = {"out": np.full((2, 2), 4.0, np.float32), "lse": np.ones(3, np.float32)}
    a = {"out": np.full((2, 2), 4.0, np.float32), "lse": np.ones(3, np.float32)}
    b = {"out": a["out"] + np.float32(2.0 ** -5 * 3), "lse": a["lse"]}     # 3 bf16 ulps at 4 (2^-5)
    report = parity(op, "fp32", a, b, reference=r)
    assert report.output("out").max_ulps == 3.0
    assert report.output("out").rel_l2 == pytest.approx(3 * 2.0 ** -5 / 4.0)
    assert report.output("out").worst_reference == 4.0


def test_nonfinite_differences_are_counted_not_averaged():
    op, *_ = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    a = {"out": np.array([1.0, np.nan, np.inf, 2.0], np.float32)}
    b = {"out": np.array([1.0, np.nan, 5.0, np.nan], np.float32)}
    report = parity(op, "fp32", a, b)
    assert report.output("out").nonfinite == 2 and report.output("out").max_abs == 0.0
    assert report.not_compared == ("lse",)


def test_exact_outputs_count_mismatches():
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    ours = op.reference("default", inputs, params)
    theirs = {k: v.copy() for k, v in ours.items()}
    theirs["bonus"][4] += 1
    report = parity(op, "default", ours, theirs, inputs=inputs, params=params)
    bonus = report.output("bonus")
    assert bonus.exact and bonus.mismatches == 1 and bonus.worst_position == {"batch": 4}
    assert report.output("accept_nodes").mismatches == 0


def test_different_shapes_are_reported_not_compared():
    op, *_ = small_case("tree_accept", **ACCEPT_SMALL)
    report = parity(op, "default", {"bonus": np.zeros(3, np.int32)}, {"bonus": np.zeros(4, np.int32)})
    assert "shapes differ" in report.output("bonus").reason
