"""Metrics and verdicts: one result against one expected output, under one tolerance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import FLOAT_DTYPES, kdtr_dtype
from .base import Tolerance
from ..scaleout.parallel import cpu_count, threaded_map
from ..records.report import drop_defaults

WORST_ELEMENTS = 5


@dataclass(frozen=True)
class Element:
    """One element of an output: where, what the backend gave, what the golden holds."""

    index: tuple[int, ...]
    got: float
    expected: float


@dataclass(frozen=True)
class Gate:
    """The gate for one output of an implementation that sums in its own order (kdtr.ops.numerics;
    docs/numerics.md): `honest` is the largest |c_i - r_i| of the op's same-precision controls,
    `honest_l2` their largest ||c - r|| / ||r||, `unit` the unit roundoffs of the output's dtype and
    of the stored golden's, added (the two roundings every honest result carries). Element i
    passes within a_i = min(atol + rtol·|r_i|, max(factor·honest, 2·unit·|r_i|)), the norm within
    min(l2, max(factor·honest_l2, unit)). Where two controls differ from each other by more than
    the tolerance allows elementwise (`ceiling` False) or in norm (`l2_ceiling` False), that min
    becomes a max: no honest reordering of this case is bound to meet the tolerance, and the record
    says the gate went beyond it."""

    honest: float
    honest_l2: float
    factor: float
    unit: float
    ceiling: bool = True
    l2_ceiling: bool = True

    def l2(self, tolerance_l2: float | None) -> float | None:
        """The norm-wise bound under this gate (None: none)."""
        gate = max(self.factor * self.honest_l2, self.unit)
        if tolerance_l2 is None:
            return gate
        return min(tolerance_l2, gate) if self.l2_ceiling else max(tolerance_l2, gate)

    def allowance(self, tolerance_bound: np.ndarray, expected: np.ndarray) -> np.ndarray:
        """a_i from the tolerance's atol + rtol·|r_i| and the expected values (float64)."""
        gate = np.maximum(self.factor * self.honest, 2 * self.unit * np.abs(expected))
        return np.minimum(tolerance_bound, gate) if self.ceiling else np.maximum(tolerance_bound, gate)


@dataclass(frozen=True)
class GateCheck:
    """How tight the gate was for one output (the record keeps it beside the figures): the honest
    error (`honest`, `honest_l2`), the largest allowance any element had (`allowance`), its ratio to
    the honest error (`ratio`), the norm-wise bound applied (`l2`), and `beyond_tolerance` where two
    controls differed by more than the tolerance and the gate was allowed past it."""

    honest: float
    honest_l2: float
    allowance: float
    l2: float | None
    beyond_tolerance: bool = False

    @property
    def ratio(self) -> float:
        return _ratio(self.allowance, self.honest)

    def to_plain(self) -> dict[str, Any]:
        return drop_defaults({"honest": _num(self.honest), "honest_l2": _num(self.honest_l2),
                              "allowance": _num(self.allowance), "ratio": _num(self.ratio),
                              "l2": None if self.l2 is None else _num(self.l2),
                              "beyond_tolerance": self.beyond_tolerance}, {"l2": None, "beyond_tolerance": False})

    @staticmethod
    def from_plain(data: dict[str, Any]) -> "GateCheck":
        return GateCheck(float(data["honest"]), float(data["honest_l2"]), float(data["allowance"]),
                         None if data.get("l2") is None else float(data["l2"]),
                         bool(data.get("beyond_tolerance", False)))


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
    # how much of the tolerance the worst element uses: max |x-r| / (atol + rtol·|r|) (and
    # rel_l2 / l2 where an l2 bound is set); <= 1 passes. Exact outputs: 0 equal, inf otherwise;
    # a NaN/Inf where the bound is finite is inf.
    tol_share: float = 0.0
    gate: GateCheck | None = None   # compared under a gate (see compare_output)

    def to_plain(self) -> dict[str, Any]:
        """JSON form; a field at its default (no reason, no worst elements, zero metrics) is left
        out, so a record of a thousand passing rows stays small."""
        full = {"name": self.name, "passed": self.passed, "reason": self.reason,
                "tolerance": self.tolerance.to_json(), "count": self.count, "mismatches": self.mismatches,
                "max_abs": _num(self.max_abs), "max_rel": _num(self.max_rel), "rel_l2": _num(self.rel_l2),
                "tol_share": _num(self.tol_share),
                "worst": [[list(e.index), _num(e.got), _num(e.expected)] for e in self.worst],
                "gate": None if self.gate is None else self.gate.to_plain()}
        return drop_defaults(full, {"reason": None, "count": 0, "mismatches": 0, "max_abs": 0.0,
                                    "max_rel": 0.0, "rel_l2": 0.0, "tol_share": 0.0, "worst": [],
                                    "gate": None})

    @staticmethod
    def from_plain(data: dict[str, Any]) -> "OutputCheck":
        """The inverse of to_plain (a record read back); KeyError/TypeError/ValueError if malformed.
        A record of the derived-bound rule (its `derived` figures) reads back without them."""
        worst = tuple(Element(tuple(int(i) for i in index), float(got), float(expected))
                      for index, got, expected in data.get("worst", ()))
        return OutputCheck(str(data["name"]), bool(data["passed"]), data.get("reason"),
                           Tolerance.parse(data["tolerance"]), int(data.get("count", 0)),
                           int(data.get("mismatches", 0)), float(data.get("max_abs", 0.0)),
                           float(data.get("max_rel", 0.0)), float(data.get("rel_l2", 0.0)), worst,
                           float(data.get("tol_share", 0.0)),
                           None if data.get("gate") is None else GateCheck.from_plain(data["gate"]))


def _num(value: float) -> float | str:
    """JSON has no NaN or Inf: those are written as the strings float() reads back."""
    return value if math.isfinite(value) else str(value)


CHUNK = 1 << 20                # elements compared at a time: memory stays bounded for any output
COMPARE_THREADS = 8            # chunks compared at once (numpy frees the GIL): ~80 MB of temporaries each


def compare_output(name: str, got: np.ndarray | None, expected: np.ndarray,
                   tolerance: Tolerance, gate: Gate | None = None) -> OutputCheck:
    """Exact outputs must match bit for bit in their dtype; toleranced ones elementwise
    (|x - r| <= atol + rtol·|r|, NaN/Inf never pass) and, if set, in relative L2 norm.

    `gate`: the gate for an implementation that sums in its own order (kdtr.ops.numerics): element i
    then passes within the allowance Gate.allowance gives, the norm within Gate.l2 (the tolerance
    their ceiling unless the gate says it cannot be)."""
    if got is None:
        return OutputCheck(name, False, "the backend produced no such output", tolerance)
    if tuple(got.shape) != tuple(expected.shape):
        return OutputCheck(name, False, f"shape {list(got.shape)} != expected {list(expected.shape)}",
                           tolerance)
    got_dtype, exp_dtype = kdtr_dtype(got.dtype), kdtr_dtype(expected.dtype)
    floats = got_dtype in FLOAT_DTYPES and exp_dtype in FLOAT_DTYPES
    if got_dtype != exp_dtype and (tolerance.exact or not floats):
        return OutputCheck(name, False, f"dtype {got_dtype} != expected {exp_dtype}", tolerance)
    flat_got = np.ascontiguousarray(got).reshape(-1)
    flat_exp = np.ascontiguousarray(expected).reshape(-1)
    if tolerance.exact:
        gate = None                               # bitwise equality admits no gate

    def chunk(lo: int) -> _Totals:
        part = _Totals()
        part.add(lo, flat_got[lo:lo + CHUNK], flat_exp[lo:lo + CHUNK], tolerance, gate)
        return part

    starts = range(0, flat_exp.size, CHUNK)
    totals = _Totals()
    for part in threaded_map(chunk, starts, window=min(COMPARE_THREADS, cpu_count(), len(starts))):
        totals.merge(part)                    # in chunk order: the sums are the sequential ones
    count = int(expected.size)
    rule = ("bitwise equality" if tolerance.exact
            else f"|x-r| <= {tolerance.atol:g} + {tolerance.rtol:g}·|r|")
    rel_l2, l2, checked = totals.rel_l2(), tolerance.l2, None
    if gate is not None:
        l2 = gate.l2(l2)
        checked = GateCheck(gate.honest, gate.honest_l2, _largest_allowance(gate, tolerance, flat_exp), l2,
                            not (gate.ceiling and gate.l2_ceiling))
        rule = (f"min({rule}, the gate {gate.factor:g}·{gate.honest:.3g} or 2·{gate.unit:.3g}·|r|)" if gate.ceiling else
                f"the gate {gate.factor:g}·{gate.honest:.3g} (beyond the tolerance: honest orders differ by more)")
    reasons = []
    if totals.mismatches:
        reasons.append(f"{totals.mismatches} of {count} elements fail {rule}"
                       + (f" ({totals.nonfinite} NaN/Inf)" if totals.nonfinite else ""))
    if l2 is not None and not tolerance.exact and not rel_l2 <= l2:
        reasons.append(f"||x-r||/||r|| = {rel_l2:.3g} > {l2:.3g}")
    worst = tuple(Element(tuple(int(i) for i in np.unravel_index(flat, expected.shape)),
                          float(flat_got[flat]), float(flat_exp[flat])) for flat in totals.worst())
    share = totals.share
    if l2 is not None and not tolerance.exact:
        share = max(share, _ratio(rel_l2, l2))
    return OutputCheck(name, not reasons, "; ".join(reasons) or None, tolerance, count, totals.mismatches,
                       totals.max_abs, totals.max_rel, rel_l2, worst, share, checked)


def _largest_allowance(gate: Gate, tolerance: Tolerance, expected: np.ndarray) -> float:
    """The largest a_i: Gate.allowance grows with |r_i|, so it is the allowance at the largest finite |r|."""
    magnitude = np.abs(expected.astype(np.float64, copy=False))
    top = np.array([float(magnitude.max(where=np.isfinite(magnitude), initial=0.0))])
    return float(gate.allowance(tolerance.atol + tolerance.rtol * top, top)[0])


def _ratio(value: float, bound: float) -> float:
    """value / bound, with 0 / 0 = 0 and anything else over a zero bound (or NaN) = inf."""
    if not value <= math.inf:                       # NaN
        return math.inf
    if bound > 0:
        return value / bound
    return 0.0 if value == 0 else math.inf


LARGEST_BLOCK = 1024        # largest(): elements per block maximum


def largest(score: np.ndarray, count: int) -> np.ndarray:
    """Indices of the `count` largest of `score` (no NaN), largest first, ties by the lowest index:
    `np.argsort(-score, kind="stable")[:count]` without sorting the chunk. The count-th largest
    of the maxima of LARGEST_BLOCK-element blocks is a floor under the count-th largest element
    (count blocks reach it), so only the elements at or above it are sorted. Where ties at the
    floor make those many (a chunk of mostly equal values), the count-th largest is found by
    stepping down the few distinct values from the top instead. np.partition degrades on a passing
    chunk's differences, mostly zeros and a few distinct others: 25 ms a million elements, against
    about 1 this way."""
    if score.size <= count:
        return np.argsort(-score, kind="stable")
    maxima = np.maximum.reduceat(score, np.arange(0, score.size, LARGEST_BLOCK))
    floor = np.partition(maxima, maxima.size - count)[maxima.size - count] if maxima.size >= count else -np.inf
    at_or_above = score >= floor
    if np.count_nonzero(at_or_above) <= 8 * LARGEST_BLOCK:
        picked = np.flatnonzero(at_or_above)
        return picked[np.argsort(-score[picked], kind="stable")[:count]]
    kth = score.max()                         # many ties: step down the distinct values from the top
    while np.count_nonzero(score >= kth) < count:
        kth = score.max(where=score < kth, initial=-np.inf)
    above = np.flatnonzero(score > kth)                                   # fewer than count
    ties = np.flatnonzero(score == kth)[:count - above.size]
    picked = np.concatenate([above, ties])
    return picked[np.argsort(-score[picked], kind="stable")]


class _Totals:
    """Running metrics over chunks: maxima, squared norms, mismatch counts, worst candidates."""

    def __init__(self):
        self.max_abs = self.max_rel = self.err_sq = self.ref_sq = 0.0
        self.mismatches = self.nonfinite = 0
        self.share = 0.0                                        # see OutputCheck.tol_share
        self.candidates: list[tuple[float, int]] = []          # (-score, flat index)

    def add(self, lo: int, got: np.ndarray, expected: np.ndarray, tolerance: Tolerance,
            gate: Gate | None = None) -> None:
        if self._add_equal(lo, got, expected):
            return
        g64, e64 = got.astype(np.float64), expected.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            gap = np.abs(g64 - e64)
            diff = np.where(g64 == e64, 0.0, gap)                 # equal infinities: 0
            finite = np.isfinite(diff)
            all_finite = bool(finite.all())
            if all_finite or finite.any():
                self.max_abs = max(self.max_abs, float(diff.max(where=finite, initial=0.0)))
            if not all_finite:
                self.max_abs = float("inf")
            nonzero = finite & (e64 != 0)
            if nonzero.any():
                rel = np.divide(diff, np.abs(e64), out=np.zeros_like(diff), where=nonzero)
                self.max_rel = max(self.max_rel, float(rel.max()))
            self.ref_sq += float(np.square(e64[np.isfinite(e64)]).sum())
            self.err_sq += float(np.square(diff).sum()) if all_finite else float("inf")
            if tolerance.exact:
                width = got.dtype.itemsize
                bad = got.view(f"V{width}") != expected.view(f"V{width}")
                share = np.where(bad, np.inf, 0.0)
            else:
                bound = tolerance.atol + tolerance.rtol * np.abs(e64)
                if gate is not None:
                    bound = gate.allowance(bound, e64)
                bad = ~(gap <= bound)
                bad |= ~np.isfinite(g64)
                share = np.divide(diff, bound, out=np.where(diff == 0, 0.0, np.inf), where=bound > 0)
                share = np.where(bad & ~(share > 1), np.inf, share)     # NaN/Inf: never within
            if share.size:
                top = float(share.max())                        # NaN (propagated by max): inf
                self.share = max(self.share, top if top == top else math.inf)
            self.nonfinite += int((~np.isfinite(g64)).sum()) if g64.dtype.kind == "f" else 0
            # the ranking of the worst elements: failing, NaN and infinite differences share the
            # top (the largest finite float, so that ties go to the lowest index), then by size
            score = np.where(bad | ~finite, np.finfo(np.float64).max, diff)
        self.mismatches += int(bad.sum())
        self.candidates += [(-float(score[i]), lo + int(i)) for i in largest(score, WORST_ELEMENTS)]

    def _add_equal(self, lo: int, got: np.ndarray, expected: np.ndarray) -> bool:
        """A chunk equal bit for bit and free of NaN/Inf (every passing exact output, most chunks of
        a passing run): what `add` would find (no difference, no mismatch, the lowest indices as the
        worst elements at 0) in a few passes instead of some twenty. False: not such a chunk."""
        if got.dtype != expected.dtype or not np.array_equal(got.view(np.uint8), expected.view(np.uint8)):
            return False
        e64 = expected.astype(np.float64)
        if kdtr_dtype(expected.dtype) in FLOAT_DTYPES and not np.isfinite(e64).all():
            return False
        self.ref_sq += float(np.square(e64).sum())
        self.candidates += [(-0.0, lo + i) for i in range(min(WORST_ELEMENTS, expected.size))]
        return True

    def merge(self, part: "_Totals") -> None:
        """Fold in the totals of the next chunk: what `add` on it would have left here."""
        self.max_abs, self.max_rel = max(self.max_abs, part.max_abs), max(self.max_rel, part.max_rel)
        self.err_sq += part.err_sq
        self.ref_sq += part.ref_sq
        self.mismatches += part.mismatches
        self.nonfinite += part.nonfinite
        self.share = max(self.share, part.share)
        self.candidates += part.candidates

    def rel_l2(self, err_sq: float | None = None) -> float:
        """||x - r|| / ||r|| (or, given another sum of squares, its norm over ||r||)."""
        ref_norm = np.sqrt(self.ref_sq)
        err_norm = np.sqrt(self.err_sq if err_sq is None else err_sq)
        return float(err_norm / ref_norm if ref_norm > 0 else err_norm)

    def worst(self) -> list[int]:
        """The WORST_ELEMENTS largest differences (failing ones first); ties: the lowest index."""
        return [index for _, index in sorted(self.candidates)[:WORST_ELEMENTS]]
