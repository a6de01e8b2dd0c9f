"""What the built-in implementations share (kdtr.impl.builtin runs them; `--backend NAME` is the
implementation named NAME): the backend names, the device, poisoned output buffers, uploads."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..dtypes import to_torch, torch_dtype
from ..errors import UsageError

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
    from ..runtime.device import gpu_available

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
