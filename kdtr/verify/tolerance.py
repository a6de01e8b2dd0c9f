"""The tolerance policy: which bound each output of a case is held to, and whether it was loosened."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import BundleError
from ..ops.base import Op, Tolerance
from .options import Options


def default_tolerances(op: Op, variant: str, options: Options, ours: bool = True) -> dict[str, Tolerance]:
    """The op's contract for our kernels, the reference and other implementations (`ours` False:
    rows of implementations given to verify, by --impl or verify_item); for the torch
    backend the bound bench holds it to (`baseline_tolerances`): it is a second, independent fp32
    implementation whose summation order is its BLAS's (on a 2-core CPU with two threads, about one
    run in five put half of one case's rows up to 4.4e-5 off in lse, none with one thread: over the
    kernels' 1e-5, inside the baseline's 1e-4, whose reason is beside it in the op)."""
    if options.backend == "torch" and ours and not options.impls:
        return dict(op.baseline_tolerances(variant))
    return dict(op.tolerances(variant))


def tolerances(op: Op, variant: str, meta_tolerance: Any, options: Options, file=None,
               ours: bool = True) -> dict[str, Tolerance]:
    """default_tolerances < the bundle's meta.tolerance < command-line overrides."""
    merged = default_tolerances(op, variant, options, ours)
    if meta_tolerance is not None:
        if not isinstance(meta_tolerance, dict):
            raise BundleError("meta.tolerance must be an object", file=file)
        for name, value in meta_tolerance.items():
            if name not in op.outputs:
                raise BundleError(f"meta.tolerance names {name!r}, not an output of {op.name}", file=file)
            try:
                merged[name] = Tolerance.parse(value)
            except ValueError as err:
                raise BundleError(f"meta.tolerance.{name}: {err}", file=file) from None
    for name, tol in merged.items():
        if not tol.exact and (options.atol is not None or options.rtol is not None):
            merged[name] = Tolerance(atol=tol.atol if options.atol is None else options.atol,
                                     rtol=tol.rtol if options.rtol is None else options.rtol, l2=tol.l2)
    return merged


def looser(tol: Tolerance, default: Tolerance) -> bool:
    """Whether `tol` lets through something `default` refuses (exact < any bound; larger atol, rtol
    or l2; dropping an l2 bound)."""
    if default.exact:
        return not tol.exact
    if tol.exact:
        return False
    l2 = default.l2 is not None and (tol.l2 is None or tol.l2 > default.l2)
    return tol.atol > default.atol or tol.rtol > default.rtol or l2


def loosened(op: Op, variant: str, tols: Mapping[str, Tolerance], options: Options, ours: bool = True) -> bool:
    """A bundle's or the command line's tolerance is looser than the default for some output."""
    defaults = default_tolerances(op, variant, options, ours)
    return any(looser(tol, defaults[name]) for name, tol in tols.items() if name in defaults)
