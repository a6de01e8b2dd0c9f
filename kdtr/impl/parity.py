"""Parity between two implementations' outputs for one case: how far apart, in bf16 ulps and in norm.

For each output both sides give: the largest difference in bf16 ulps of the reference magnitude,
max_ulps = max_i |a_i - b_i| / ulp(max(|r_i|, rms(r))), where r is the reference output when one is
given, else `ours`, and ulp(x) is the spacing of bf16 numbers at x: 2^(e-7) for x in [2^e, 2^(e+1)),
e >= -126 (bf16 keeps 8 significant bits), and 2^-133 below 2^-126 (the subnormal spacing). So an
element one bf16 rounding step away from the other reads 1, two steps 2. The floor rms(r) (the
output's root mean square) keeps elements that cancel to near zero from reading as 10^5 ulps: two
correct bf16 kernels differ there by their fp32 accumulation order, which is small against the
output's scale, not against the element's own.
Also: mean and max absolute difference, rel L2 = ||a - b|| / ||r||, and the worst element (by ulps)
with its position in the case (batch, tree node, head where the output has those axes). Exact
(integer) outputs count their unequal elements. Elements where one side is NaN/Inf and the other not
(or both non-finite but different) are counted in `nonfinite` and left out of the metrics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from ..dtypes import NUMPY_DTYPES, spacing
from ..ops.base import Op

CHUNK = 1 << 20                  # elements per step: memory stays bounded for any output


def bf16_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of bf16 numbers at |x| (float64), see the module docstring."""
    return spacing(x, NUMPY_DTYPES["bf16"])


@dataclass(frozen=True)
class OutputParity:
    name: str
    count: int
    exact: bool                       # an integer output: compared by equality
    mismatches: int = 0               # exact outputs: unequal elements
    nonfinite: int = 0                # float outputs: elements whose NaN/Inf pattern differs
    max_ulps: float = 0.0
    mean_abs: float = 0.0
    max_abs: float = 0.0
    rel_l2: float = 0.0
    worst_index: tuple[int, ...] = ()
    worst_position: dict[str, Any] = field(default_factory=dict)
    worst_ours: float | None = None
    worst_theirs: float | None = None
    worst_reference: float | None = None
    reason: str | None = None         # why it was not compared (shapes differ)


@dataclass(frozen=True)
class ParityReport:
    op: str
    variant: str
    ours: str
    theirs: str
    outputs: tuple[OutputParity, ...]
    not_compared: tuple[str, ...] = ()    # outputs one side does not give

    def output(self, name: str) -> OutputParity:
        return next(o for o in self.outputs if o.name == name)

    def to_json(self) -> dict:
        out = asdict(self)
        out["outputs"] = [{**o, "worst_index": list(o["worst_index"])} for o in out["outputs"]]
        out["not_compared"] = list(self.not_compared)
        return out


def position(op: Op, variant: str, shape: tuple[int, ...], index: tuple[int, ...],
             inputs: Mapping[str, np.ndarray] | None, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where element `index` of an output of `shape` sits in the case, from the op's describe():
    outputs lead with [B, Q, ...] or [B·Q, ...] (batch, then the tree node: a path slot for
    tree_accept's accept_* outputs) or [B, ...]; an axis of size H after that is the head; what is
    left is `rest`. Empty without inputs."""
    if inputs is None:
        return {}
    shape_info = op.describe(variant, inputs, params or {})
    batch, q_len, heads = shape_info.get("B"), shape_info.get("Q"), shape_info.get("H")
    out: dict[str, Any] = {}
    rest = list(index)
    if q_len and batch and len(shape) >= 2 and shape[:2] == (batch, q_len):
        out["batch"], out["node"] = rest.pop(0), rest.pop(0)
    elif q_len and batch and shape and shape[0] == batch * q_len:
        row = rest.pop(0)
        out["batch"], out["node"] = row // q_len, row % q_len
    elif batch and shape and shape[0] == batch:
        out["batch"] = rest.pop(0)
    consumed = len(index) - len(rest)
    if heads and rest and shape[consumed] == heads:
        out["head"] = rest.pop(0)
    if rest:
        out["rest"] = rest
    return out


def _float(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _is_float(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" or array.dtype == NUMPY_DTYPES["bf16"]


def compare_one(name: str, ours: np.ndarray, theirs: np.ndarray, reference: np.ndarray | None) -> OutputParity:
    """One output's parity (positions are filled in by `parity`)."""
    if ours.shape != theirs.shape:
        return OutputParity(name, 0, False, reason=f"shapes differ: {list(ours.shape)} vs {list(theirs.shape)}")
    if reference is not None and reference.shape != ours.shape:
        return OutputParity(name, 0, False, reason=f"reference shape {list(reference.shape)} != {list(ours.shape)}")
    a, b = ours.reshape(-1), theirs.reshape(-1)
    r = a if reference is None else reference.reshape(-1)
    if not (_is_float(ours) and _is_float(theirs)):
        unequal = np.flatnonzero(a != b)
        worst = int(unequal[0]) if unequal.size else None
        return OutputParity(name, int(a.size), True, mismatches=int(unequal.size),
                            worst_index=() if worst is None else _unravel(worst, ours.shape),
                            worst_ours=None if worst is None else float(a[worst]),
                            worst_theirs=None if worst is None else float(b[worst]))
    floor = _rms(r)
    nonfinite = 0
    sum_abs = sum_sq = ref_sq = 0.0
    counted = 0
    max_abs, max_ulps, worst = 0.0, -1.0, None
    for lo in range(0, a.size, CHUNK):
        x, y, z = _float(a[lo:lo + CHUNK]), _float(b[lo:lo + CHUNK]), _float(r[lo:lo + CHUNK])
        finite = np.isfinite(x) & np.isfinite(y)
        same_special = ~finite & ((np.isnan(x) & np.isnan(y)) | (x == y))
        nonfinite += int(np.count_nonzero(~finite & ~same_special))
        diff = np.where(finite, np.abs(x - y), 0.0)
        scale = np.maximum(np.abs(np.where(np.isfinite(z), z, 0.0)), floor)
        ulps = np.where(finite, diff / bf16_ulp(scale), -1.0)
        counted += int(np.count_nonzero(finite))
        sum_abs += float(diff.sum())
        sum_sq += float(np.square(diff).sum())
        ref_sq += float(np.square(np.where(finite & np.isfinite(z), z, 0.0)).sum())
        max_abs = max(max_abs, float(diff.max(initial=0.0)))
        if ulps.size and float(ulps.max()) > max_ulps:
            at = int(ulps.argmax())
            max_ulps, worst = float(ulps[at]), lo + at
    rel_l2 = math.sqrt(sum_sq) / math.sqrt(ref_sq) if ref_sq > 0 else (0.0 if sum_sq == 0 else math.inf)
    return OutputParity(
        name, int(a.size), False, nonfinite=nonfinite, max_ulps=max(max_ulps, 0.0),
        mean_abs=sum_abs / counted if counted else 0.0, max_abs=max_abs, rel_l2=rel_l2,
        worst_index=() if worst is None else _unravel(worst, ours.shape),
        worst_ours=None if worst is None else float(_float(a[worst])),
        worst_theirs=None if worst is None else float(_float(b[worst])),
        worst_reference=None if worst is None or reference is None else float(_float(r[worst])))


def _rms(values: np.ndarray) -> float:
    """Root mean square of the finite elements (0 for none), chunked like the metrics."""
    total, count = 0.0, 0
    for lo in range(0, values.size, CHUNK):
        z = _float(values[lo:lo + CHUNK])
        z = z[np.isfinite(z)]
        total, count = total + float(np.square(z).sum()), count + z.size
    return math.sqrt(total / count) if count else 0.0


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def parity(op: Op, variant: str, ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray], *,
           ours_name: str = "ours", theirs_name: str = "theirs",
           reference: Mapping[str, np.ndarray] | None = None,
           inputs: Mapping[str, np.ndarray] | None = None,
           params: Mapping[str, Any] | None = None) -> ParityReport:
    """Per output of the op that both sides give (numpy arrays, any float dtypes): see the module
    docstring. `inputs`/`params` (the case's) let the worst element be placed in the tree."""
    rows, skipped = [], []
    for name in op.outputs:
        if name not in ours or name not in theirs:
            skipped.append(name)
            continue
        ref = None if reference is None else reference.get(name)
        row = compare_one(name, np.asarray(ours[name]), np.asarray(theirs[name]),
                          None if ref is None else np.asarray(ref))
        if row.worst_index:
            where = position(op, variant, np.asarray(ours[name]).shape, row.worst_index, inputs, params)
            row = OutputParity(**{**asdict(row), "worst_index": row.worst_index, "worst_position": where})
        rows.append(row)
    return ParityReport(op.name, variant, ours_name, theirs_name, tuple(rows), tuple(skipped))
