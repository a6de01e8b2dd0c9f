"""The gate: what verify holds an implementation that sums in its own order to (docs/numerics.md).

The tolerances (kdtr.ops) were measured on the reference and on our kernels, whose summation order is
fixed. Any other implementation (the torch backend, whose BLAS sums in its own order; every --impl
but `numpy` and `cuda`; captured outputs) is held to a gate measured on the case itself: the op's
same-precision control (Op.control) is computed in CONTROL_ORDERS other orders, and how far the
controls land from the expected output is the honest error of reordering this case (per output: the
largest |c_i - r_i|, and the largest ||c - r|| / ||r||). Twice that (FACTOR, flash-attention's rule),
floored at twice the roundings of the output and of the stored golden, capped by the tolerance unless the controls differ from each other
by more than the tolerance (kdtr.compare.Gate).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import numpy as np

from ..dtypes import kdtr_dtype
from .base import Op, Tolerance
from .compare import Gate

FIXED_ORDER = ("numpy", "cuda")     # the reference itself, and our kernels (the tolerances' order)
CONTROL_ORDERS = (1, 2, 3)          # the controls' orders (seeds): the honest error is their worst
FACTOR = 2.0                        # gate = FACTOR x the honest error
UNIT_ROUNDOFF = {"f64": 2.0 ** -53, "f32": 2.0 ** -24, "bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def takes_gate(implementation: str | None) -> bool:
    """Whether the outputs of `implementation` (a backend or --impl name) are held to the gate; the
    reference and our kernels keep their measured tolerances alone."""
    return implementation not in FIXED_ORDER


def gates(op: Op, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any],
          expected: Mapping[str, np.ndarray], tolerances: Mapping[str, Tolerance]) -> dict[str, Gate]:
    """Per toleranced output, the gate on this case ({} where the op has no control). An output
    whose expected values are not all finite gets none (its tolerance alone).

    The tolerance is the gate's ceiling unless two controls differ from each other by more than it
    allows (elementwise, or in norm): then no honest order is bound to meet it, and the gate may go
    past it. The controls' distance from the golden never lifts it: a wrong golden would."""
    controls = [op.control(variant, inputs, params, order) for order in CONTROL_ORDERS]
    specs = op.output_specs(variant, inputs, params) if controls[0] else {}
    found = {}
    for name in controls[0]:
        tolerance = tolerances[name]
        reference = np.asarray(expected[name]).astype(np.float64)
        if tolerance.exact or not np.isfinite(reference).all():
            continue
        values = [np.asarray(control[name]) for control in controls]       # as computed: f32 or bf16
        norm = float(np.linalg.norm(reference.reshape(-1))) or 1.0
        bound = tolerance.atol + tolerance.rtol * np.abs(reference)
        honest = honest_l2 = 0.0
        for value in values:
            gap = np.abs(value.astype(np.float64) - reference)
            honest = max(honest, float(gap.max(initial=0.0)))
            honest_l2 = max(honest_l2, float(np.linalg.norm(gap.reshape(-1))) / norm)
        apart = apart_l2 = False
        for a, b in itertools.combinations(values, 2):
            gap = np.abs(a.astype(np.float64) - b.astype(np.float64))
            apart |= not bool(np.all(gap <= bound))
            apart_l2 |= tolerance.l2 is not None and float(np.linalg.norm(gap.reshape(-1))) / norm > tolerance.l2
        unit = UNIT_ROUNDOFF[specs[name][0]] + UNIT_ROUNDOFF[kdtr_dtype(np.asarray(expected[name]).dtype)]
        found[name] = Gate(honest, honest_l2, FACTOR, unit, ceiling=not apart, l2_ceiling=not apart_l2)
    return found
