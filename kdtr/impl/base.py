"""The implementation contract: `fn(inputs, params) -> outputs` with docs/ops/'s names, torch tensors.

An `Implementation` is a name, the (op, variant) pairs it serves (each with the outputs it returns:
all of the op's, or a declared subset such as a peer without `lse`), and `prepare`, which does the
once-per-case work (layout conversion, planning) and returns the zero-argument call that computes
the outputs. `impl(op, variant, inputs, params)` is prepare-then-call; `kdtree bench` times only
the call. `check_outputs` is the output contract; `kdtr.impl.evaluate` runs an implementation and
judges it (an implementation that raises, or returns a missing name, a wrong shape or dtype, a
non-tensor, a sparse or meta tensor, or a NaN where the reference has none, fails with that reason;
the run goes on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..dtypes import FLOAT_DTYPES, NUMPY_DTYPES
from ..errors import KdtreeError
from ..ops.base import BenchRole, Op

Outputs = Mapping[str, Any]
HOST = "numpy"             # the device of an implementation that takes and returns numpy arrays
Prepare = Callable[[Op, str, Mapping[str, Any], Mapping[str, Any]], Callable[[], Outputs]]
ALL_VARIANTS = None


class ImplUnavailable(KdtreeError):
    """An implementation cannot run this case here (not importable, no GPU, a configuration it
    refuses); the case is listed as not run with this reason, it does not fail."""


@dataclass(frozen=True)
class Serves:
    """One op (all its variants when `variant` is None) and the outputs returned for it (None: all)."""

    op: str
    variant: str | None = ALL_VARIANTS
    outputs: tuple[str, ...] | None = None

    def covers(self, op: str, variant: str) -> bool:
        return self.op == op and self.variant in (None, variant)


def _available() -> str | None:
    return None


@dataclass(frozen=True)
class Implementation:
    """One implementation of one or more ops (see the module docstring).

    `probe()` says why it cannot run on this machine (None: it can); it is called on first use, never
    at import, and may import heavy packages. `version_info()` names the packages that ran (JSON-ready).
    `device` is where its inputs live: "cuda", "cpu", "auto" (the GPU when there is one), or
    HOST: numpy arrays in and out, no torch at all (the numpy reference: `verify -b numpy` never
    imports torch). `bench` is set on an op's baselines only (BenchRole: how bench times it);
    kdtr.impl.baselines builds those per case, so their `probe` may also give a reason of the
    case's (SDPA that would not fit in device memory), which bench shows as the row's skip.
    `worker`: None runs it in the calling process; else a picklable zero-argument callable that
    builds it again (with no `worker`) in a worker process of its own, where `evaluate` runs it
    (kdtr.impl.isolation: a crash, a signal or a hang there is its case's error, and the run goes on).
    """

    name: str
    serves_: tuple[Serves, ...]
    prepare: Prepare
    probe: Callable[[], str | None] = _available
    version_info: Callable[[], dict] = dict
    device: str = "auto"
    doc: str = ""
    bench: BenchRole | None = None
    worker: Callable[[], "Implementation"] | None = None

    def serves(self, op: str, variant: str) -> bool:
        return any(s.covers(op, variant) for s in self.serves_)

    def provides(self, op: Op, variant: str) -> tuple[str, ...]:
        """The outputs it returns for op/variant, in the op's order (a declared subset or all)."""
        for s in self.serves_:
            if s.covers(op.name, variant):
                return tuple(n for n in op.outputs if s.outputs is None or n in s.outputs)
        return ()

    def unavailable(self) -> str | None:
        return self.probe()

    def versions(self) -> dict:
        return dict(self.version_info())

    def __call__(self, op: Op, variant: str, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> Outputs:
        return self.prepare(op, variant, inputs, params)()


@dataclass(frozen=True)
class CaseData:
    """One case as the evaluator takes it: the op, the variant, numpy inputs and the params."""

    op: Op
    variant: str
    inputs: Mapping[str, np.ndarray]
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Produced:
    """What running an implementation on a case gave, before any comparison: its numpy outputs
    (those it provides), or the contract they broke (`fault`), or the error it raised (`error`, one
    line, and `error_type`, the exception's class name). `call` and `raw` as in evaluation's
    Outcome; an isolated implementation's come back from its worker process without them
    (kdtr.impl.isolation). Here, below both, so the evaluator and the isolation share them."""

    outputs: dict[str, np.ndarray] | None = None
    fault: str | None = None
    error: str | None = None
    error_type: str | None = None
    deterministic: bool | None = None
    call: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


def _torch_kind(tensor) -> str | None:
    from ..dtypes import torch_dtype

    for name in NUMPY_DTYPES:
        if torch_dtype(name) == tensor.dtype:
            return name
    return None


def check_outputs(op: Op, variant: str, outputs: Any, expected_specs: Mapping[str, tuple[str, tuple[int, ...]]],
                  provides: tuple[str, ...] | None = None,
                  reference: Mapping[str, np.ndarray] | None = None, *, host: bool = False) -> str | None:
    """Why `outputs` break the contract (None: they keep it).

    Every name of `provides` (default: all the op's outputs) must be there and nothing else; each a
    torch tensor (a numpy array with `host`: a HOST implementation's) of the spec's shape and dtype, except that a toleranced float output may come in
    any float dtype (the numpy reference gives bf16 outputs at f32, as goldens store them; the
    comparison casts). Where `reference` is given, a float output must be NaN only where the
    reference is (the first such element is named).
    """
    if not isinstance(outputs, Mapping):
        return f"returned a {type(outputs).__name__}, not a mapping of output names to tensors"
    wanted = tuple(op.outputs) if provides is None else tuple(provides)
    missing = [n for n in wanted if n not in outputs]
    if missing:
        return f"returned no {', '.join(map(repr, missing))} (it declares {list(wanted)})"
    extra = [n for n in outputs if n not in wanted]
    if extra:
        return f"returned {', '.join(map(repr, extra))}, not among its declared outputs {list(wanted)}"
    tolerances = op.tolerances(variant)
    for name in wanted:
        value, (kind, shape) = outputs[name], expected_specs[name]
        fault = _array_fault(name, value, host)
        if fault:
            return fault
        if tuple(value.shape) != tuple(shape):
            return f"output {name!r} has shape {list(value.shape)}, expected {list(shape)}"
        got = _numpy_kind(value.dtype) if host else _torch_kind(value)
        loose = kind in FLOAT_DTYPES and got in FLOAT_DTYPES and not tolerances[name].exact
        if got != kind and not loose:
            return f"output {name!r} has dtype {got or value.dtype}, expected {kind}"
        if reference is not None and got in FLOAT_DTYPES and name in reference:
            fault = _new_nan(name, value, reference[name])
            if fault:
                return fault
    return None


def _array_fault(name: str, value: Any, host: bool) -> str | None:
    """Why `value` is not an array the contract takes: a numpy array (host) or a dense torch tensor
    holding values (not sparse, not on the meta device)."""
    if host:
        return None if isinstance(value, np.ndarray) else f"output {name!r} is a {type(value).__name__}, not a numpy array"
    import torch

    if not isinstance(value, torch.Tensor):
        return f"output {name!r} is a {type(value).__name__}, not a torch tensor"
    if value.layout != torch.strided:
        return f"output {name!r} is a {str(value.layout).replace('torch.', '')} tensor, not a dense one"
    if value.device.type == "meta":
        return f"output {name!r} is on the meta device: it holds no values"
    return None


def _numpy_kind(dtype) -> str | None:
    from ..dtypes import kdtr_dtype

    try:
        return kdtr_dtype(dtype)
    except ValueError:
        return None


def _new_nan(name: str, value, reference: np.ndarray) -> str | None:
    if isinstance(value, np.ndarray):
        got_nan = np.isnan(value.astype(np.float32)).reshape(-1)
    else:
        import torch

        got_nan = torch.isnan(value).reshape(-1).cpu().numpy()
    if not got_nan.any():
        return None
    ref = np.asarray(reference).reshape(-1)
    ref_nan = np.isnan(ref.astype(np.float32)) if ref.dtype.kind == "f" or ref.dtype == NUMPY_DTYPES["bf16"] \
        else np.zeros(ref.shape, bool)
    new = np.flatnonzero(got_nan & ~ref_nan)
    if not new.size:
        return None
    index = tuple(int(i) for i in np.unravel_index(int(new[0]), tuple(value.shape)))
    return f"output {name!r} is NaN at {list(index)} ({new.size} element(s)) where the reference is not"


def device_for(impl: Implementation) -> str:
    """Where its inputs go: its own device, or (auto) the GPU when there is one, else the CPU."""
    if impl.device != "auto":
        return impl.device
    from .backends import torch_device

    return torch_device()
