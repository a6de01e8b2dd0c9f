"""The case layer below verify and bench: a bundle read and checked against its op (`load_case`),
a case's inputs checked against its op (`input_fault`: what a bundle read from disk and a capture
from an engine both must pass), and the expected outputs of a case that stores none
(`reference_outputs`: fresh-input trials, bundles without a golden)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..dtypes import NUMPY_DTYPES
from ..errors import BundleError
from .format import Bundle, read_bundle
from ..ops import get_op
from ..ops.base import Op

GOLDEN = "golden"                 # the expected outputs are the bundle's stored golden
EXPECTED_REFERENCE = "reference"  # meta.expected of a bundle with inputs only (kdtr.bundle.capture)
EXPECTED_CAPTURED = "captured"    # meta.expected of a bundle storing an engine's outputs (kdtr.bundle.capture)


@dataclass(frozen=True)
class LoadedCase:
    """A bundle whose meta, inputs and outputs were checked against its op: safe to run."""

    bundle: Bundle
    op: Op
    variant: str
    params: dict[str, Any]
    case: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]   # the stored outputs: the golden, the captured ones, or none
    source: str = GOLDEN              # golden | reference (inputs only) | captured (kdtr.bundle.capture)
    captured_by: str | None = None    # who produced the captured outputs


def bundle_case(bundle: Bundle) -> tuple[Op, str, dict[str, Any], str]:
    """The op, variant, params and case name a bundle declares, checked against the registry."""
    meta = bundle.meta
    op_name = meta.get("op")
    try:
        op = get_op(op_name) if isinstance(op_name, str) else None
    except KeyError:
        op = None
    if op is None:
        raise BundleError(f"meta.op {op_name!r} is not a known op", file=bundle.path)
    variant = meta.get("variant", "default")
    if variant not in op.variants:
        raise BundleError(f"meta.variant {variant!r} is not one of {op.name}'s {list(op.variants)}",
                        file=bundle.path)
    params = meta.get("params", {})
    if not isinstance(params, dict):
        raise BundleError("meta.params must be an object", file=bundle.path)
    missing = [k for k in op.kernel_params if k not in params]
    if missing:
        raise BundleError(f"meta.params lacks {missing} ({op.name} needs them)", file=bundle.path)
    case = meta.get("case", bundle.path.stem)
    if not isinstance(case, str):
        raise BundleError("meta.case must be a string", file=bundle.path)
    return op, variant, params, case


def load_case(path: str | Path) -> LoadedCase:
    """Read a bundle and check it fits its op (names, dtypes, shapes, indices) before any backend runs.
    A bundle of kdtr.bundle.capture (meta.expected) may store no outputs ("reference") or captured ones."""
    bundle = read_bundle(path)
    op, variant, params, case = bundle_case(bundle)
    inputs, expected = bundle.arrays("input"), bundle.arrays("output")
    source = bundle.meta.get("expected", GOLDEN)
    fault = None
    if source not in (GOLDEN, EXPECTED_REFERENCE, EXPECTED_CAPTURED):
        fault = f"meta.expected {source!r} is not one of {EXPECTED_REFERENCE!r}, {EXPECTED_CAPTURED!r}"
    elif source == EXPECTED_REFERENCE and expected:
        fault = f"meta.expected is {EXPECTED_REFERENCE!r} but the bundle stores outputs {sorted(expected)}"
    elif source != EXPECTED_REFERENCE and sorted(expected) != sorted(op.outputs):
        fault = f"outputs {sorted(expected)} do not match {op.name}'s {sorted(op.outputs)}"
    fault = fault or input_fault(op, variant, inputs, params)
    if fault:
        raise BundleError(fault, file=path)
    captured_by = str(bundle.meta.get("captured_by", "unknown")) if source == EXPECTED_CAPTURED else None
    return LoadedCase(bundle, op, variant, params, case, inputs, expected, source, captured_by)


def input_fault(op: Op, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> str | None:
    """Why these inputs cannot be the variant's (names and dtypes, then the op's own shape and index
    checks), or None: what a bundle read from disk and a capture from an engine both must pass."""
    fault = expected_dtype_check(op, variant, inputs)
    if fault is None:
        try:
            op.check_inputs(variant, inputs, params)
        except ValueError as err:
            fault = str(err)
    return fault


def expected_dtype_check(op: Op, variant: str, inputs: Mapping[str, np.ndarray]) -> str | None:
    """Why the inputs don't fit the variant (missing / unexpected names, wrong dtypes), or None."""
    specs = op.input_specs(variant)
    missing = [n for n in specs if n not in inputs]
    extra = [n for n in inputs if n not in specs]
    if missing or extra:
        return (f"inputs {sorted(inputs)} do not match {op.name}/{variant}'s {sorted(specs)}"
                + (f" (missing {missing})" if missing else "") + (f" (unexpected {extra})" if extra else ""))
    for name, kind in specs.items():
        if inputs[name].dtype != NUMPY_DTYPES[kind]:
            return f"input {name!r} has dtype {inputs[name].dtype}, {op.name}/{variant} takes {kind}"
    return None


def reference_outputs(op, variant: str, inputs, params) -> tuple[dict, bool]:
    """Expected outputs for fresh-input trials and bundles without a golden, as numpy arrays, and
    whether they came from the device: the op's float64 device reference (`op.bench_reference`,
    torch on the GPU, independent of our kernels; the numpy reference runs on the host and takes
    minutes at serving sizes) when a GPU is present and the op has one, else the numpy reference."""
    from ..impl.backends import torch_device, upload
    from ..dtypes import to_numpy

    if torch_device() == "cuda":
        import torch

        with torch.no_grad():
            got = op.bench_reference(variant, upload(inputs, "cuda"), params)
        if got is not None:
            return {name: to_numpy(t) for name, t in got.items()}, True
    return op.reference(variant, inputs, params), False
