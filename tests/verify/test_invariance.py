"""verify --invariance (kdtr.verify.invariance) on the CPU: the numpy and torch backends, a user's file
implementation that is deliberately batch-variant, the ulp scale, and the ops' request slicing."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from kdtr.dtypes import NUMPY_DTYPES
from kdtr.verify.invariance import fixed_permutation, ordered_bits, probe, worst_difference
from kdtr.ops import get_op
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case
from tests.helpers import run_kdtree as kdtree


def test_ulps_count_adjacent_floats_and_meet_at_zero():
    one = np.array([1.0], np.float32)
    assert (ordered_bits(np.nextafter(one, np.float32(2))) - ordered_bits(one))[0] == 1
    assert ordered_bits(np.array([-0.0], np.float32))[0] == ordered_bits(np.array([0.0], np.float32))[0]
    tiny = np.array([np.float32(1e-45)])
    assert (ordered_bits(tiny) - ordered_bits(-tiny))[0] == 2          # across zero
    bf16 = NUMPY_DTYPES["bf16"]
    a = np.array([1.0], np.float32).astype(bf16)
    b = np.array([1.0 + 2.0 ** -7], np.float32).astype(bf16)          # one bf16 ulp above 1
    assert (ordered_bits(b) - ordered_bits(a))[0] == 1


def test_worst_difference_names_the_request_and_the_element():
    batched = {"out": np.zeros((3, 2, 4), np.float32)}
    probed = {"out": np.zeros((2, 2, 4), np.float32)}
    probed["out"][1, 1, 3] = np.nextafter(np.float32(0), np.float32(1)) * 5          # 5 ulps
    worst = worst_difference(probed, batched, [2, 0])
    assert (worst.output, worst.request, worst.index, worst.ulps) == ("out", 0, (1, 3), 5.0)
    assert worst_difference({"out": batched["out"][[1]]}, batched, [1]) is None


def test_ulps_are_floored_at_the_outputs_scale():
    """Issue 35: 7e-10 on an element of 1.1e-7, in an output of RMS 0.062, read 98304 ulps (the f32
    spacing at the element); at the output's scale it is a fifth of an ulp, as --against's parity
    counts it. An element at the scale keeps its own ulps; a NaN against a number is inf."""
    batched = {"out": np.full((2, 4), 0.062, np.float32)}
    batched["out"][1, 2] = 1.1e-7
    probed = {"out": batched["out"][[1]].copy()}
    probed["out"][0, 2] += np.float32(7e-10)
    worst = worst_difference(probed, batched, [1])
    assert worst.index == (2,) and 0.1 < worst.ulps < 0.3, worst
    probed["out"][0, 0] = np.nextafter(np.float32(0.062), np.float32(1))          # one ulp at the scale
    assert worst_difference(probed, batched, [1]).ulps == 1.0
    probed["out"][0, 3] = np.nan
    assert worst_difference(probed, batched, [1]).ulps == float("inf")


def test_the_fixed_permutation_moves_every_request():
    for count in (2, 3, 5, 16):
        order = fixed_permutation(count)
        assert sorted(order) == list(range(count)) and all(order[i] != i for i in range(count))
    assert fixed_permutation(7) == fixed_permutation(7)


@pytest.mark.parametrize("op_name, variant, params", [("verify_attn", "fp32", VERIFY_SMALL),
                                                      ("verify_attn", "bf16_paged", VERIFY_SMALL),
                                                      ("tree_accept", "default", ACCEPT_SMALL)])
def test_taking_requests_gives_the_batched_references_rows(op_name, variant, params):
    """The reference of a batch of some requests, in another order, equals those requests' rows of
    the whole batch's reference: the op's slicing is right (the reference is batch-invariant)."""
    op, inputs, full_params = small_case(op_name, variant, **params)
    count = op.request_count(variant, inputs)
    order = fixed_permutation(count)[:2]
    whole = op.by_request(variant, op.reference(variant, inputs, full_params), count)
    taken, taken_params = op.take_requests(variant, inputs, full_params, order)
    op.check_inputs(variant, taken, taken_params)
    part = op.by_request(variant, op.reference(variant, taken, taken_params), len(order))
    assert worst_difference(part, whole, order) is None


def test_a_batch_variant_runner_is_caught_with_its_worst_element():
    op, inputs, params = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    reference = op.reference("fp32", inputs, params)

    def variant_by_batch(sub_inputs, sub_params, splits=None):
        got = op.reference("fp32", sub_inputs, sub_params)
        return {"out": got["out"] * np.float32(1 + 1e-6 * len(sub_inputs["prefix_len"])), "lse": got["lse"]}

    verdicts = {v.name: v for v in probe(op, "fp32", inputs, params, variant_by_batch(inputs, params), variant_by_batch,
                                         split_reason="no split knob")}
    assert verdicts["batch"].holds is False and verdicts["batch"].worst.output == "out"
    assert verdicts["batch"].worst.ulps >= 1
    assert verdicts["order"].holds is True
    assert verdicts["split"].holds is None and verdicts["split"].reason == "no split knob"
    honest = probe(op, "fp32", inputs, params, reference, lambda i, p, s=None: op.reference("fp32", i, p), None)
    assert all(v.holds for v in honest)


BATCH_VARIANT = """
    from kdtr.ops import get_op

    def honest(inputs, params):
        return get_op("verify_attn").run_torch("fp32", inputs, params)

    def batch_variant(inputs, params):
        '''Adds 2e-7 relative per request in the batch: within the gate (docs/numerics.md), not
        batch-invariant.'''
        got = honest(inputs, params)
        return {"out": got["out"] * (1 + 2e-7 * inputs["q"].shape[0]), "lse": got["lse"]}
"""


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_backends_report_per_case_in_the_table_and_the_record(goldens, tmp_path, backend):  # noqa: F811
    record = tmp_path / "r.json"
    result = kdtree("verify", goldens, "--backend", backend, "--invariance", "--json", record, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "invariance" in result.stdout and "n/a" in result.stdout
    rows = json.loads(record.read_text())["rows"]
    assert rows and all(set(r["invariance"]) == {"batch", "order", "split"} for r in rows)
    for row in rows:
        found = row["invariance"]
        assert found["split"]["holds"] is None and "only our CUDA kernels run as the backend" in found["split"]["reason"]
        assert found["batch"]["holds"] is not None
        if backend == "numpy":        # the reference computes each request on its own
            assert found["batch"]["holds"] and found["order"]["holds"], row


def test_a_batch_variant_file_implementation_is_caught(goldens, tmp_path):  # noqa: F811
    path = tmp_path / "variant.py"
    path.write_text(textwrap.dedent(BATCH_VARIANT))
    record = tmp_path / "v.json"
    result = kdtree("verify", goldens, "--impl", f"verify_attn/fp32={path}:batch_variant", "--invariance",
                    "--json", record, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr     # it passes: invariance is a report
    (row,) = json.loads(record.read_text())["rows"]
    batch = row["invariance"]["batch"]
    assert batch["holds"] is False and batch["worst"]["output"] == "out" and batch["worst"]["ulps"] >= 1
    assert len(batch["worst"]["index"]) == 3                        # row, head, element in the request
    assert row["invariance"]["order"]["holds"] is True
    assert "no: " in result.stdout and "ulp in out" in result.stdout
