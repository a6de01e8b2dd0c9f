"""Run one op on one backend: `numpy` (the reference), `torch` (CPU or GPU) or `cuda` (our kernels)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import numpy as np

from .dtypes import NUMPY_DTYPES, to_numpy, to_torch, torch_dtype
from .errors import DeviceError, UsageError
from .ops.base import Op

BACKENDS = ("numpy", "torch", "cuda", "auto")
POISON_INT = -0x21524111          # 0xDEADBEEF as int32: what an unwritten integer element holds
POISON_U8 = 0xCD
POISON_SMALL_INT = -43            # 0xD5 as int8: the int8/int16 sentinel (0xDEADBEEF does not fit)


def resolve_backend(name: str) -> str:
    """`auto` is cuda where a GPU exists, else torch."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    from .device import gpu_available

    return "cuda" if gpu_available() else "torch"


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def poisoned(kind: str, shape: tuple[int, ...], device: str):
    """An output buffer filled with a value no correct kernel writes where it should write."""
    import torch

    dtype = torch_dtype(kind)
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype, device=device)
    fill = {torch.uint8: POISON_U8, torch.int8: POISON_SMALL_INT, torch.int16: POISON_SMALL_INT}.get(dtype, POISON_INT)
    return torch.full(shape, fill, dtype=dtype, device=device)


def upload(inputs: Mapping[str, np.ndarray], device: str) -> dict[str, Any]:
    return {name: to_torch(array, device) for name, array in inputs.items()}


def prepare(backend: str, op: Op, variant: str, inputs: Mapping[str, np.ndarray],
            device_inputs: Mapping[str, Any], params: Mapping[str, Any], device: str,
            kernel: str | None = None, defines: Mapping[str, Any] | None = None,
            ) -> tuple[Callable[[], Mapping[str, Any]], dict[str, Any] | None]:
    """The one dispatch onto an implementation: a zero-argument call computing `op`'s outputs from
    `device_inputs` (torch tensors on `device`; `inputs` are their numpy originals, for shapes), and
    the poisoned output buffers it writes into (cuda), or None where the call returns the outputs
    (torch). `kernel` and `defines` force one of our kernels and its compile-time knobs (cuda).
    verify and e2e run it once (`run`); bench times it."""
    if backend == "torch":
        return functools.partial(op.run_torch, variant, device_inputs, params), None
    if backend == "cuda":
        outputs = {name: poisoned(kind, shape, device)
                   for name, (kind, shape) in op.output_specs(variant, inputs, params).items()}
        forced = {"kernel": kernel} if kernel is not None else {}     # the launch's own choice
        if defines:
            forced["defines"] = dict(defines)
        return functools.partial(op.run_cuda, variant, device_inputs, params, outputs, **forced), outputs
    raise UsageError(f"unknown backend {backend!r} (numpy runs the reference, not a prepared call)")


def run(backend: str, op: Op, variant: str, inputs: Mapping[str, np.ndarray],
        params: Mapping[str, Any], kernel: str | None = None,
        defines: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Outputs of `op` on `inputs` as numpy arrays, computed by `backend` (already resolved);
    `kernel` forces one of the op's CUDA kernels and `defines` its knobs (cuda backend only)."""
    if backend == "numpy":
        return op.reference(variant, inputs, params)
    if backend not in ("torch", "cuda"):
        raise UsageError(f"unknown backend {backend!r}")
    import torch

    if backend == "cuda":
        from .device import require_gpu

        require_gpu()
    device = "cuda" if backend == "cuda" else torch_device()
    with torch.no_grad():
        call, outputs = prepare(backend, op, variant, inputs, upload(inputs, device), params, device, kernel,
                                defines)
        result = call()
    if backend == "cuda":
        try:
            torch.cuda.synchronize()
        except RuntimeError as err:
            raise DeviceError(f"{op.name}/{variant}: the kernel failed on the device: {err}") from err
    return {name: to_numpy(t) for name, t in (outputs if outputs is not None else result).items()}


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
