"""Metrics and verdicts of one output against its golden."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from kdtr.ops import compare
from kdtr.ops.compare import compare_output
from kdtr.ops.base import Tolerance

EXACT = Tolerance(exact=True)
LOOSE = Tolerance(atol=1e-3, rtol=1e-2)


def test_exact_integers_and_infinite_padding():
    ref = np.array([1, 2, -1, -1], np.int32)
    assert compare_output("x", ref.copy(), ref, EXACT).passed
    bad = ref.copy()
    bad[1] = 3
    check = compare_output("x", bad, ref, EXACT)
    assert not check.passed and check.mismatches == 1 and check.worst[0].index == (1,)
    scores = np.array([0.0, -0.5, -np.inf])
    check = compare_output("s", scores.copy(), scores, EXACT)
    assert check.passed and check.max_abs == 0.0          # equal infinities are no difference


def test_exact_is_bitwise():
    ref = np.array([0.0, 1.0])
    assert not compare_output("s", np.array([-0.0, 1.0]), ref, EXACT).passed
    nan = np.array([np.nan])
    assert compare_output("s", nan.copy(), nan, EXACT).passed   # same bits


def test_tolerance_rule_nan_and_l2():
    ref = np.array([1.0, 2.0, 0.0], np.float32)
    assert compare_output("o", ref + np.float32(5e-4), ref, LOOSE).passed
    assert not compare_output("o", ref + np.float32(0.1), ref, LOOSE).passed
    nan = ref.copy()
    nan[2] = np.nan
    check = compare_output("o", nan, ref, LOOSE)
    assert not check.passed and "NaN/Inf" in check.reason
    tight_norm = Tolerance(atol=1, rtol=1, l2=1e-6)
    check = compare_output("o", ref + np.float32(1e-3), ref, tight_norm)
    assert not check.passed and "||x-r||/||r||" in check.reason


def test_shape_and_dtype_faults():
    ref = np.zeros((2, 3), np.float32)
    assert "shape" in compare_output("o", np.zeros((3, 2), np.float32), ref, LOOSE).reason
    assert "dtype" in compare_output("i", np.zeros(3, np.int64), np.zeros(3, np.int32), EXACT).reason
    assert "no such output" in compare_output("o", None, ref, LOOSE).reason
    # a bf16 result is compared with its f32 golden as a float
    half = np.array([1.0, 2.0], np.float32)
    assert compare_output("o", half.astype(ml_dtypes.bfloat16), half, LOOSE).passed


def test_chunks_find_the_worst_elements_anywhere():
    size = compare.CHUNK * 2 + 17
    ref = np.arange(size, dtype=np.float64)
    got = ref.copy()
    got[compare.CHUNK + 5] += 10           # in the second chunk
    got[size - 1] += 3                     # in the last, partial chunk
    check = compare_output("o", got, ref, Tolerance(atol=0.5, rtol=0))
    assert check.mismatches == 2 and check.max_abs == 10
    assert [e.index[0] for e in check.worst[:2]] == [compare.CHUNK + 5, size - 1]
    norm = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert check.rel_l2 == pytest.approx(norm, rel=1e-12)


def peak_bytes(work) -> int:
    """The most memory `work()` held at once, as tracemalloc (which sees numpy's buffers) counts it."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_bounded_by_the_chunk():
    ref = np.arange(8 * compare.CHUNK, dtype=np.int32)            # 32 MiB
    got = ref.copy()
    assert peak_bytes(lambda: compare_output("i", got, ref, EXACT)) < 64 * compare.CHUNK   # a chunk or two's copies


# -- tol_share: how much of its tolerance an output uses -------------------------------------------

def test_tol_share_of_hand_computed_cases():
    expected = np.array([1.0, 2.0], np.float32)
    near = np.array([1.0, 2.25], np.float32)
    assert compare_output("x", near, expected, Tolerance(atol=0.5)).tol_share == 0.5
    assert compare_output("x", near, expected, Tolerance(rtol=0.25)).tol_share == 0.5   # 0.25 / (0.25·2)
    over = compare_output("x", near, expected, Tolerance(atol=0.125))
    assert over.tol_share == 2.0 and not over.passed
    assert compare_output("x", expected.copy(), expected, Tolerance()).tol_share == 0.0
    assert compare_output("x", near, expected, Tolerance()).tol_share == np.inf        # 0 bound, a difference


def test_tol_share_counts_an_l2_bound():
    expected, got = np.array([3.0, 4.0]), np.array([3.0, 4.5])       # ||x-r|| / ||r|| = 0.5 / 5
    check = compare_output("x", got, expected, Tolerance(atol=1.0, l2=0.05))
    assert check.tol_share == pytest.approx(2.0) and not check.passed
    assert compare_output("x", got, expected, Tolerance(atol=1.0, l2=0.2)).tol_share == pytest.approx(0.5)


def test_tol_share_of_exact_outputs_and_non_finite_values():
    ref = np.array([1, 2, 3], np.int32)
    assert compare_output("x", ref.copy(), ref, EXACT).tol_share == 0.0
    assert compare_output("x", ref + np.array([0, 1, 0], np.int32), ref, EXACT).tol_share == np.inf
    floats = np.array([1.0, 2.0], np.float32)
    for bad in (np.nan, np.inf):
        got = np.array([1.0, bad], np.float32)
        assert compare_output("x", got, floats, Tolerance(atol=1e9)).tol_share == np.inf


@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=40),
       st.lists(st.floats(-1.0, 1.0, width=32), min_size=40, max_size=40),
       st.floats(0, 1.0), st.floats(0, 0.5))
def test_a_toleranced_output_passes_exactly_when_tol_share_is_at_most_one(values, noise, atol, rtol):
    expected = np.array(values, np.float32)
    got = expected + np.array(noise[:len(values)], np.float32)
    check = compare_output("x", got, expected, Tolerance(atol=atol, rtol=rtol))
    assert check.passed == (check.tol_share <= 1.0)


def test_the_torch_backend_is_held_to_the_baseline_bound_and_kernels_to_the_contract():
    """verify's torch backend is an independent fp32 implementation (bench's `torch_fp32` baseline);
    its summation order is its BLAS's, so it meets the bound bench holds it to, not the kernels'."""
    from kdtr.ops import get_op
    from kdtr.verify import Options, default_tolerances, loosened

    op = get_op("verify_attn")
    for variant in op.variants:
        torch_tols = default_tolerances(op, variant, Options(backend="torch"))
        assert torch_tols == op.baseline_tolerances(variant)
        assert default_tolerances(op, variant, Options(backend="cuda")) == op.tolerances(variant)
        assert default_tolerances(op, variant, Options(backend="numpy")) == op.tolerances(variant)
        assert not loosened(op, variant, torch_tols, Options(backend="torch"))
        assert loosened(op, variant, torch_tols, Options(backend="cuda")) == (torch_tols != op.tolerances(variant))
    assert op.baseline_tolerances("bf16_paged")["lse"].atol > op.tolerances("bf16_paged")["lse"].atol


def test_an_implementation_given_to_verify_item_is_held_as_impl_holds_it(tmp_path):
    """verify_item with an implementation compares as `kdtree verify --impl` does: where the bundle
    names no tolerance, the op's own, not the torch backend's baseline ones (it used to take those:
    Options' backend is torch by default, and verify_item's implementation is not in Options.impls)."""
    from kdtr.bundle.format import read_bundle, write_bundle
    from kdtr.impl import resolve_refs
    from kdtr.ops import get_op
    from kdtr.verify import Options, verify_item
    from tests.helpers import make_goldens

    goldens = make_goldens(tmp_path)
    (torch,) = resolve_refs(["torch"])
    op = get_op("verify_attn")
    for path in sorted((goldens / "verify_attn").glob("*.kdtr")):
        bundle = read_bundle(path)
        bare = tmp_path / path.name                       # the same case, no meta.tolerance
        write_bundle(bare, {k: v for k, v in bundle.meta.items() if k != "tolerance"},
                     [(e.name, e.role, bundle.array(e.name)) for e in bundle.entries])
        (given,) = verify_item(bare, torch, Options())
        (backend,) = verify_item(bare, None, Options())
        assert {o.name: o.tolerance for o in given.outputs} == op.tolerances(given.variant)
        assert {o.name: o.tolerance for o in backend.outputs} == op.baseline_tolerances(backend.variant)
        assert not given.loosened and not backend.loosened


@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, 3.0, np.inf]) | st.floats(0, 10), max_size=60),
       st.integers(1, 8))
def test_largest_is_the_head_of_a_stable_sort(values, count):
    """The worst elements of a chunk without sorting it: what the stable argsort picked, in its
    order (ties to the lowest index), with many ties and infinities."""
    score = np.array(values, np.float64)
    assert compare.largest(score, count).tolist() == np.argsort(-score, kind="stable")[:count].tolist()


EQUAL_CASES = {
    "u8": np.arange(300, dtype=np.int64).astype(np.uint8),
    "i32 with -1 padding": np.where(np.arange(300) % 7 == 0, -1, np.arange(300)).astype(np.int32),
    "f64 with -0.0": np.where(np.arange(300) % 5 == 0, -0.0, np.linspace(-3, 3, 300)),
    "f64 with -inf": np.where(np.arange(300) % 9 == 0, -np.inf, np.linspace(-3, 3, 300)),
    "f32 with NaN": np.where(np.arange(300) == 150, np.nan, np.linspace(0, 1, 300)).astype(np.float32),
    "bf16": np.linspace(-2, 2, 300).astype(ml_dtypes.bfloat16),
}


@pytest.mark.parametrize("tolerance", [EXACT, LOOSE, Tolerance(atol=0.0, rtol=1e-3, l2=1e-4)], ids=str)
@pytest.mark.parametrize("name", EQUAL_CASES)
def test_the_equal_chunk_shortcut_reports_what_the_full_compare_does(monkeypatch, name, tolerance):
    """Chunks of 64: some equal bit for bit (the shortcut), one with a changed element, the rest
    as they fall; the record of the check is the full compare's, field for field."""
    monkeypatch.setattr(compare, "CHUNK", 64)
    expected = EQUAL_CASES[name]
    for got in (expected.copy(), _one_changed(expected)):
        fast = compare_output(name, got, expected, tolerance)
        with monkeypatch.context() as slow:
            slow.setattr(compare._Totals, "_add_equal", lambda self, lo, got, expected: False)
            full = compare_output(name, got, expected, tolerance)
        assert fast.to_plain() == full.to_plain()


def _one_changed(expected: np.ndarray) -> np.ndarray:
    got = expected.copy()
    got[200] = expected[201]                 # a chunk of its own (128..191 and 192..255 around it)
    return got


def test_chunks_compared_in_threads_give_the_sequential_record(monkeypatch):
    """Each chunk's totals folded in chunk order: the sums (rel_l2) keep their sequential bits, the
    worst elements their order, whatever the threads' timing."""
    monkeypatch.setattr(compare, "CHUNK", 1000)
    rng = np.random.default_rng(3)
    expected = rng.standard_normal(9_500).astype(np.float32)
    got = expected * (1 + 1e-4 * rng.standard_normal(9_500)).astype(np.float32)
    got[[17, 4_321, 9_499]] = [np.nan, 7.0, np.inf]
    records = []
    for threads in (1, 4):
        monkeypatch.setattr(compare, "COMPARE_THREADS", threads)
        monkeypatch.setattr(compare, "cpu_count", lambda: 4)
        records.append(compare_output("x", got, expected, LOOSE).to_plain())
    assert records[0] == records[1] and records[0]["mismatches"] == 3


def test_memory_of_a_toleranced_compare_is_bounded_by_its_chunks_in_flight(monkeypatch):
    monkeypatch.setattr(compare, "cpu_count", lambda: 2)
    rng = np.random.default_rng(4)
    expected = rng.standard_normal(8 * compare.CHUNK)                 # 64 MiB of float64
    got = expected + 1e-9
    peak = peak_bytes(lambda: compare_output("f", got, expected, LOOSE))
    assert peak < 2 * 128 * compare.CHUNK                # two chunks' float64 temporaries at most
