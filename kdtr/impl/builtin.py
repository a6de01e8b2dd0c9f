"""The built-in implementations that come with kdtree: `cuda` (our kernels), `torch` (the torch
backend), `numpy` (the reference). They serve every op and variant, with all outputs."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Mapping

from ..ops import op_names
from .base import HOST, Implementation, Serves

EVERY_OP = tuple(Serves(name) for name in op_names())


def _cuda_prepare(op, variant, inputs, params, kernel: str | None = None, defines: Mapping[str, Any] | None = None):
    """Poisoned outputs, allocated once (what an unwritten element holds is never a correct value;
    bench times the launch alone), then the call: the launch, writing them. `kernel` and `defines`
    force one of our kernels and its compile-time knobs (None: the launch's own choice). The
    buffers sit on the inputs' device."""
    from .backends import poisoned

    device = next(iter(inputs.values())).device
    outputs = {name: poisoned(kind, shape, device) for name, (kind, shape) in op.output_specs(variant, inputs, params).items()}
    forced: dict[str, Any] = {"kernel": kernel} if kernel is not None else {}
    if defines:
        forced["defines"] = dict(defines)

    def call():
        op.run_cuda(variant, inputs, params, outputs, **forced)
        return outputs
    call.outputs = outputs          # the buffers it writes: bench re-reads them after timing
    return call


def _cuda_probe() -> str | None:
    from ..runtime.device import gpu_available, require_gpu
    from ..errors import DeviceError

    if gpu_available():
        return None
    try:
        require_gpu()
    except DeviceError as err:
        return str(err)
    return "no CUDA GPU"


def _torch_prepare(op, variant, inputs, params):
    return functools.partial(op.run_torch, variant, inputs, params)


def _numpy_prepare(op, variant, inputs: Mapping[str, Any], params):
    """The reference on the host, numpy in and out (at the reference's precision: bf16 outputs come
    as f32, the way goldens store them)."""
    return functools.partial(op.reference, variant, inputs, params)


def _torch_versions() -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda}


CUDA = Implementation("cuda", EVERY_OP, _cuda_prepare, probe=_cuda_probe, version_info=_torch_versions,
                      device="cuda", doc="our kernels (kernels/*.cu through NVRTC), launched by op.run_cuda")
TORCH = Implementation("torch", EVERY_OP, _torch_prepare, version_info=_torch_versions,
                       doc="the torch backend (op.run_torch), on the GPU when there is one")
NUMPY = Implementation("numpy", EVERY_OP, _numpy_prepare, device=HOST,
                       doc="the numpy reference (op.reference), float64 math; re-derives a golden")

BUILTINS = {impl.name: impl for impl in (CUDA, TORCH, NUMPY)}


def cuda_build(name: str = "cuda", kernel: str | None = None,
               defines: Mapping[str, Any] | None = None) -> Implementation:
    """Our kernels with one kernel forced by name (and its compile-time knobs), named `name`
    (bench: the build's label); no kernel: the launch's own choice."""
    if kernel is None and not defines:
        return BUILTINS["cuda"] if name == "cuda" else replace(BUILTINS["cuda"], name=name)
    return replace(BUILTINS["cuda"], name=name,
                   prepare=functools.partial(_cuda_prepare, kernel=kernel, defines=defines))


def builtin(name: str) -> Implementation:
    """The built-in implementation `--backend NAME` runs (looked up when used, so a test may swap it)."""
    return BUILTINS[name]


def baselines(op, variant: str, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> tuple[Implementation, ...]:
    """The op's bench baselines for this case (`Op.baselines`) as Implementations serving exactly
    this op and variant, each with its BenchRole; a built-in backend's is that backend under the
    baseline's name."""
    out = []
    for b in op.baselines(variant, inputs, params):
        serves = (Serves(op.name, variant, b.outputs),)
        if b.prepare is None:
            impl = replace(builtin(b.role.backend), name=b.name, serves_=serves, doc=b.doc, bench=b.role)
        else:
            impl = Implementation(b.name, serves, b.prepare, doc=b.doc, bench=b.role)
        out.append(impl if b.probe is None else replace(impl, probe=b.probe))
    return tuple(out)
