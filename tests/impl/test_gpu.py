"""The implementations on the GPU: ours and each peer that is importable here, against the reference,
and their parity. A peer that is not importable (or refuses this configuration) skips with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from kdtr.config import REPO_ROOT
from kdtr.impl import CaseData, Status, evaluate, parity, resolve
from kdtr.ops import get_op
from kdtr.bundle.spec import load_suites
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case

SERVING = dict(batch=4, heads=16, prefix=2048, budget=16)      # Kimi K2 at TP8-like shapes

PEER_CASES = [("sglang_triton", "verify_attn", "bf16_paged", VERIFY_SMALL),
              ("sglang_triton", "verify_attn", "bf16_paged", SERVING),
              ("flashinfer_fa2", "verify_attn", "bf16_paged", VERIFY_SMALL),
              ("flashinfer_fa2", "verify_attn", "bf16_paged", SERVING),
              ("sgl_kernel", "tree_accept", "default", ACCEPT_SMALL),
              ("cuda", "verify_attn", "bf16_paged", SERVING),
              ("cuda", "tree_accept", "default", ACCEPT_SMALL)]


def _run_or_skip(name, op, variant, inputs, params, reference):
    impl = resolve(name)
    result = evaluate(impl, CaseData(op, variant, inputs, params), reference)
    if result.status is Status.SKIPPED:
        pytest.skip(result.reason)
    return impl, result


@pytest.mark.gpu
@pytest.mark.parametrize("name, op_name, variant, size", PEER_CASES)
def test_an_implementation_meets_the_op_tolerance(name, op_name, variant, size):
    """The op's tolerances hold for the peers too: they were derived for a bf16 kernel with fp32
    scores and P rounded to bf16 (see VerifyAttn.tolerances), which is what these peers compute."""
    op, inputs, params = small_case(op_name, variant, **size)
    reference = op.reference(variant, inputs, params)
    impl, result = _run_or_skip(name, op, variant, inputs, params, reference)
    assert result.passed, result.reason
    assert set(result.outputs) == set(impl.provides(op, variant))
    for out in result.outputs:
        tol = op.tolerances(variant)[out]
        got, ref = result.outputs[out], reference[out]
        if tol.exact:
            np.testing.assert_array_equal(got, ref, err_msg=out)
        else:
            got, ref = got.astype(np.float64), ref.astype(np.float64)
            assert np.all(np.abs(got - ref) <= tol.atol + tol.rtol * np.abs(ref)), out
    print(name, impl.versions())


@pytest.mark.gpu
@pytest.mark.parametrize("peer", ["sglang_triton", "flashinfer_fa2"])
def test_parity_of_our_kernel_and_a_peer_is_reported(peer):
    op, inputs, params = small_case("verify_attn", "bf16_paged", **SERVING)
    reference = op.reference("bf16_paged", inputs, params)
    _, theirs = _run_or_skip(peer, op, "bf16_paged", inputs, params, reference)
    _, ours = _run_or_skip("cuda", op, "bf16_paged", inputs, params, reference)
    report = parity(op, "bf16_paged", ours.outputs, theirs.outputs, ours_name="cuda", theirs_name=peer,
                    reference=reference, inputs=inputs, params=params)
    out = report.output("out")
    assert out.nonfinite == 0 and out.worst_position["batch"] < SERVING["batch"]
    print(report.to_json())


def _agree_to_an_f32_rounding(got, want, what):
    """Both are float64 math stored as f32: where the two float64 results (summed in different
    orders, some 1e-15 apart) straddle an f32 rounding boundary they round one f32 ulp apart
    (2^-23 relative at most); rtol gives 2 ulps of room. atol 1e-12: an element near zero (out
    cancels) carries the float64 sums' absolute error, ~1e-16 of the magnitudes summed."""
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2 * 2.0 ** -23, atol=1e-12, err_msg=f"{what} {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
def test_the_device_reference_serves_trials_at_serving_sizes(variant):
    from kdtr.bundle.case import reference_outputs

    op, inputs, params = small_case("verify_attn", variant, **SERVING)
    got, on_device = reference_outputs(op, variant, inputs, params)
    assert on_device
    _agree_to_an_f32_rounding(got, op.reference(variant, inputs, params), variant)


DEFAULT_CASES = [c for s in load_suites([REPO_ROOT / "specs"]) for c in s.cases if c.op == "verify_attn"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=[c.name for c in DEFAULT_CASES])
def test_the_device_reference_matches_every_default_golden(case):
    """Every default-suite bundle of verify_attn, both variants (what gen-refs writes: the numpy
    reference on the generated inputs), is what the device reference gives on those inputs."""
    from kdtr.bundle.case import reference_outputs

    op = get_op(case.op)
    generated = op.generate(case)
    got, on_device = reference_outputs(op, case.variant, generated.inputs, generated.params)
    assert on_device
    _agree_to_an_f32_rounding(got, op.reference(case.variant, generated.inputs, generated.params), case.name)


def test_the_default_suites_hold_both_verify_attn_variants():
    assert {c.variant for c in DEFAULT_CASES} == {"fp32", "bf16_paged"}
