"""Peers: other projects' kernels for our ops, run when importable, skipped with the reason when not.

One module per peer; each builds its `IMPL` (an Implementation that declares the op/variant it serves
and the outputs it returns) without importing the peer: the import happens in the probe, on first
use. A peer module is two parts: pure conversions between docs/ops/'s tensors and the peer's arguments
and outputs (tested on the CPU against a reference model of the peer's documented semantics), and
the call itself (tested on the GPU).
"""

from __future__ import annotations

import importlib

PEER_MODULES = {
    "sglang_triton": "kdtr.impl.peers.sglang_triton",
    "sgl_kernel": "kdtr.impl.peers.sgl_kernel",
    "flashinfer_fa2": "kdtr.impl.peers.flashinfer_fa2",
    "flashmla": "kdtr.impl.peers.flashmla",
}


def peer(name: str):
    """The peer's Implementation; KeyError for an unknown name."""
    return importlib.import_module(PEER_MODULES[name]).IMPL


def missing_module(name: str) -> str | None:
    """Why `import name` fails (its first line), or None when it imports."""
    from ...errors import reason

    try:
        importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - any import failure is the reason itself
        return f"{name} is not importable ({reason(err)})"
    return None


def package_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
