"""Metrics and verdicts: one result against one expected output, under one tolerance."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dtypes import FLOAT_DTYPES, kdtr_dtype
from .ops.base import Tolerance

WORST_ELEMENTS = 5


@dataclass(frozen=True)
class Element:
    """One element of an output: where, what the backend gave, what the golden holds."""

    index: tuple[int, ...]
    got: float
    expected: float


@dataclass(frozen=True)
class OutputCheck:
    name: str
    passed: bool
    reason: str | None              # why it failed, in words (None when it passed)
    tolerance: Tolerance
    count: int = 0                  # elements compared
    mismatches: int = 0             # elements outside the tolerance (or not bitwise equal)
    max_abs: float = 0.0
    max_rel: float = 0.0            # over elements whose expected value is non-zero
    rel_l2: float = 0.0             # ||x - r|| / ||r||
    worst: tuple[Element, ...] = field(default_factory=tuple)


def _elements(diff_order: np.ndarray, shape, got: np.ndarray, expected: np.ndarray):
    return tuple(Element(tuple(int(i) for i in np.unravel_index(flat, shape)),
                         float(got.flat[flat]), float(expected.flat[flat])) for flat in diff_order)


def _metrics(got64: np.ndarray, exp64: np.ndarray) -> tuple[float, float, float]:
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(got64 == exp64, 0.0, np.abs(got64 - exp64))   # equal infinities: 0
        finite = np.isfinite(diff)
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        if not finite.all():
            max_abs = float("inf")
        nonzero = finite & (exp64 != 0)
        max_rel = float((diff[nonzero] / np.abs(exp64[nonzero])).max()) if nonzero.any() else 0.0
        ref_norm = float(np.linalg.norm(exp64[np.isfinite(exp64)]))
        err_norm = float(np.linalg.norm(diff)) if finite.all() else float("inf")
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else err_norm
    return max_abs, max_rel, rel_l2


def compare_output(name: str, got: np.ndarray | None, expected: np.ndarray,
                   tolerance: Tolerance) -> OutputCheck:
    """Exact outputs must match bit for bit in their dtype; toleranced ones elementwise
    (|x - r| <= atol + rtol·|r|, NaN/Inf never pass) and, if set, in relative L2 norm."""
    if got is None:
        return OutputCheck(name, False, "the backend produced no such output", tolerance)
    if tuple(got.shape) != tuple(expected.shape):
        return OutputCheck(name, False, f"shape {list(got.shape)} != expected {list(expected.shape)}",
                           tolerance)
    got_dtype, exp_dtype = kdtr_dtype(got.dtype), kdtr_dtype(expected.dtype)
    floats = got_dtype in FLOAT_DTYPES and exp_dtype in FLOAT_DTYPES
    if got_dtype != exp_dtype and (tolerance.exact or not floats):
        return OutputCheck(name, False, f"dtype {got_dtype} != expected {exp_dtype}", tolerance)
    count = int(expected.size)
    got64 = got.astype(np.float64)
    exp64 = expected.astype(np.float64)
    max_abs, max_rel, rel_l2 = _metrics(got64, exp64)
    if tolerance.exact:
        width = got.dtype.itemsize
        bad = np.ascontiguousarray(got).view(f"V{width}") != np.ascontiguousarray(expected).view(f"V{width}")
        rule = "bitwise equality"
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            bad = ~(np.abs(got64 - exp64) <= tolerance.atol + tolerance.rtol * np.abs(exp64))
        bad |= ~np.isfinite(got64)
        rule = f"|x-r| <= {tolerance.atol:g} + {tolerance.rtol:g}·|r|"
    mismatches = int(bad.sum())
    reasons = []
    if mismatches:
        nonfinite = int((~np.isfinite(got64)).sum()) if floats else 0
        reasons.append(f"{mismatches} of {count} elements fail {rule}"
                       + (f" ({nonfinite} NaN/Inf)" if nonfinite else ""))
    if tolerance.l2 is not None and not tolerance.exact and not rel_l2 <= tolerance.l2:
        reasons.append(f"||x-r||/||r|| = {rel_l2:.3g} > {tolerance.l2:g}")
    with np.errstate(invalid="ignore"):
        score = np.where(bad, np.inf, np.abs(got64 - exp64)).ravel()
    score = np.nan_to_num(score, nan=np.inf)
    order = np.argsort(-score, kind="stable")[:WORST_ELEMENTS] if count else np.array([], int)
    return OutputCheck(name, not reasons, "; ".join(reasons) or None, tolerance, count, mismatches,
                       max_abs, max_rel, rel_l2, _elements(order, expected.shape, got, expected))
