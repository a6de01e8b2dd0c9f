"""The op registry: name -> module. Modules are imported on first use."""

from __future__ import annotations

import importlib
from functools import lru_cache

from .base import Op

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
