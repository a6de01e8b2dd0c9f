"""Bundles from live tensors: what an engine holds at a verify_attn / tree_* call, saved as a KDTR
bundle that `kdtree verify` runs with nothing but the file.

    from kdtr.bundle.capture import save_bundle
    save_bundle("cases/step1234.kdtr", "verify_attn", "bf16_paged",
                {"q": q, "kv_buffer": pool, ...}, params={"sm_scale": layer.scaling})

Tensors may be torch tensors on any device or numpy arrays. Names, dtypes and shapes are checked
against the op (docs/ops/<op>.md) before anything is written; the write is atomic (kdtr.bundle.format.write_bundle).
Without `outputs` the bundle carries inputs only and `meta.expected = "reference"`: verify computes
the expected outputs with the reference (`kdtr.bundle.case.reference_outputs`). With `outputs`
(all of the op's, as the capturing implementation produced them) they are stored and
`meta.expected = "captured"`, `meta.captured_by` names who produced them: verify reports them as
that implementation's outputs, compared with the reference, beside its own run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..atomic import check_writable
from .case import EXPECTED_CAPTURED, EXPECTED_REFERENCE, input_fault
from ..dtypes import FLOAT_DTYPES, NUMPY_DTYPES, kdtr_dtype, to_numpy
from ..errors import BundleError, UsageError
from .format import write_bundle
from ..ops import get_op, op_names
from .spec import NAME_RULE, is_safe_name

RESERVED_META = ("op", "variant", "params", "expected", "captured_by")


def _host(name: str, value: Any, path) -> np.ndarray:
    """A numpy array with the tensor's bytes (torch on any device, or numpy)."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value)
    try:
        import torch
    except ImportError:                      # numpy only: anything else is not a tensor
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        return to_numpy(value)
    raise BundleError(f"{name!r} is a {type(value).__name__}, not a torch tensor or numpy array", file=path)


def save_bundle(path: str | Path, op: str, variant: str, inputs: Mapping[str, Any],
                outputs: Mapping[str, Any] | None = None, *, params: Mapping[str, Any],
                captured_by: str | None = None, case: str | None = None,
                meta: Mapping[str, Any] | None = None, overwrite: bool = False) -> Path:
    """Validate and write one bundle (see the module docstring); BundleError names what is wrong.

    `params` are the kernel params (`sm_scale` for verify_attn, `budget` for tree_build) plus any
    informational ones; numpy scalars among them are stored as the Python numbers they hold.
    `meta` adds free-form keys (not the reserved op/variant/params/expected/captured_by); `case`
    names it in reports (default: the file's stem), a safe file stem like a suite's case names. An
    existing file is replaced only with `overwrite=True`. Inputs holding NaN or Inf where the op
    reads them are refused (verify would fail every row of the bundle)."""
    path = _target(path, overwrite)
    if case is not None and not (isinstance(case, str) and is_safe_name(case)):
        raise BundleError(f"case {case!r}: a case name is {NAME_RULE}", file=path)
    if op not in op_names():
        raise BundleError(f"unknown op {op!r}; ops: {', '.join(op_names())}", file=path)
    the_op = get_op(op)
    if variant not in the_op.variants:
        raise BundleError(f"{op} has no variant {variant!r}; its variants: {', '.join(the_op.variants)}", file=path)
    params = {key: value.item() if isinstance(value, np.generic) else value for key, value in params.items()}
    missing = [k for k in the_op.kernel_params if k not in params]
    if missing:
        raise BundleError(f"params lacks {missing} ({op} needs them)", file=path)
    arrays = {name: _host(name, value, path) for name, value in inputs.items()}
    fault = input_fault(the_op, variant, arrays, params)
    if fault:
        raise BundleError(fault, file=path)
    tensors = [(name, "input", arrays[name]) for name in the_op.input_specs(variant)]
    extra = dict(meta or {})
    clash = [k for k in extra if k in RESERVED_META]
    if clash:
        raise BundleError(f"meta may not set {clash}: save_bundle writes them", file=path)
    head: dict[str, Any] = {"op": op, "variant": variant, "params": params}
    if case is not None:
        head["case"] = case
    if outputs is None:
        if captured_by is not None:
            raise BundleError("captured_by names who produced the outputs; no outputs were given", file=path)
        head["expected"] = EXPECTED_REFERENCE
    else:
        tensors += _outputs(the_op, variant, arrays, params, outputs, path)
        head["expected"] = EXPECTED_CAPTURED
        head["captured_by"] = captured_by or "unknown"
    write_bundle(path, {**head, **extra}, tensors)
    return path


def _target(path: Any, overwrite: bool) -> Path:
    """The bundle's path, or one BundleError for one that cannot be (empty, a folder, not writable,
    already there without `overwrite`)."""
    if not isinstance(path, (str, Path)) or not str(path).strip() or "\0" in str(path):
        raise BundleError(f"save_bundle needs a file path for the bundle, got {path!r}")
    path = Path(path)
    try:
        check_writable(path, "save_bundle path")
    except UsageError as err:
        raise BundleError(str(err)) from None
    if path.exists() and not overwrite:
        raise BundleError("already exists; pass overwrite=True to replace it", file=path)
    return path


def _outputs(op, variant, inputs, params, outputs, path) -> list[tuple[str, str, np.ndarray]]:
    """Every output of the op, in the spec's shape, in its dtype or (a toleranced float output) any
    float dtype: goldens keep bf16 results at f32, an engine's are bf16."""
    specs = op.output_specs(variant, inputs, params)
    names = sorted(outputs)
    if names != sorted(specs):
        raise BundleError(f"outputs {names} do not match {op.name}/{variant}'s {sorted(specs)}", file=path)
    tolerances = op.tolerances(variant)
    out = []
    for name, (kind, shape) in specs.items():
        array = _host(name, outputs[name], path)
        if array.shape != tuple(shape):
            raise BundleError(f"output {name!r} has shape {list(array.shape)}, expected {list(shape)}", file=path)
        got = kdtr_dtype(array.dtype) if array.dtype in NUMPY_DTYPES.values() else str(array.dtype)
        if got != kind and not (got in FLOAT_DTYPES and kind in FLOAT_DTYPES and not tolerances[name].exact):
            raise BundleError(f"output {name!r} has dtype {got}, expected {kind}", file=path)
        out.append((name, "output", array))
    return out
