"""The ops and their registry (name -> package, each imported on first use): each op a package of
the same shape (its contract in `__init__`, `reference`, `torch_impl`, `cuda`), the contract they
share (`base`: Op, its tolerances, kernels and baselines), the comparison that judges an output
against a tolerance (`compare`) and the derived error bounds (`numerics`), where each kernel runs
(`placement`) and our kernels as torch custom ops (`custom_ops`). It may import the root modules,
`kdtr.runtime`, `kdtr.scaleout` and `kdtr.records`, and nothing else of kdtr."""

from __future__ import annotations

import importlib
from functools import lru_cache

from .base import CudaKernel, Op

OP_MODULES = {
    "tree_build": "kdtr.ops.tree_build",
    "verify_attn": "kdtr.ops.verify_attn",
    "tree_accept": "kdtr.ops.tree_accept",
}


def op_names() -> tuple[str, ...]:
    return tuple(OP_MODULES)


@lru_cache(maxsize=None)
def get_op(name: str) -> Op:
    """The op's singleton; KeyError for an unknown name (callers turn it into their error kind)."""
    return importlib.import_module(OP_MODULES[name]).OP


def cuda_kernels() -> tuple[CudaKernel, ...]:
    """Every op's CUDA kernels, in op order. Names are unique across ops (`--kernel NAME` and
    kernels/README.md name a kernel by its name alone): a clash is a ValueError."""
    out = tuple(k for name in op_names() for k in get_op(name).kernels)
    seen: dict[str, str] = {}
    for k in out:
        if k.name in seen:
            raise ValueError(f"kernel name {k.name!r} is registered by {seen[k.name]} and {k.op}")
        seen[k.name] = k.op
    return out
