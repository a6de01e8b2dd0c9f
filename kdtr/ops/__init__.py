"""The op registry: name -> module. Modules are imported on first use."""

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
