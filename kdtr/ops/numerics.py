"""Which implementations verify holds to an op's derived error bound, and the bound itself.

The tolerances (kdtr.ops) were measured on the reference and on our kernels, whose summation order
is fixed. Any other implementation (the torch backend, whose BLAS sums in an order that changes
with its thread count; every --impl but `numpy` and `cuda`; captured outputs) is compared under
max(tolerance, derived bound) per element, the bound from its reduction (Op.error_bound;
docs/numerics.md), so that a legitimate reordering never fails and the record says how much of
the bound was used.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import Op

FIXED_ORDER = ("numpy", "cuda")     # the reference itself, and our kernels (the tolerances' order)


def takes_derived_bound(implementation: str | None) -> bool:
    """Whether the outputs of `implementation` (a backend or --impl name) are compared under the
    derived bound; the reference and our kernels keep their measured tolerances alone."""
    return implementation not in FIXED_ORDER


def derived_bounds(op: Op, variant: str, inputs: Mapping[str, np.ndarray],
                   params: Mapping[str, Any], implementation: str | None) -> dict[str, np.ndarray]:
    """Per output, the derived bound for `implementation` on these inputs; {} where it keeps its
    tolerances alone (FIXED_ORDER) or the op derives none."""
    if not takes_derived_bound(implementation):
        return {}
    return op.error_bound(variant, inputs, params)
