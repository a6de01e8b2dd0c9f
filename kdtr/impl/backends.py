"""What the built-in implementations share (kdtr.impl.builtin runs them; `--backend NAME` is the
implementation named NAME): the backend names, the device, poisoned output buffers, uploads."""

from __future__ import annotations

import functools
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


# The elementwise functions torch computes with MKL's VML on the CPU (ATen/cpu/vml.h, torch 2.11-2.13).
MKL_VML_FUNCTIONS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "sin",
                     "sqrt", "tan", "tanh", "trunc")


@functools.cache
def settle_cpu_math() -> None:
    """Call each of torch's MKL VML functions once, on one element in this thread, before any
    implementation runs on the CPU. The first call from two OpenMP threads at once races MKL's
    initialisation: in about one fresh process in ten on a loaded 2-core machine, one thread's half
    of the first parallel `torch.exp` came out up to 1.5e-4 off (relative), which put the torch
    backend's lse 4e-5 off for half the rows of the first verify_attn case (issue 30's flake;
    docs/numerics.md). Called once in one thread first, every later call is right."""
    import torch

    one = torch.full((1,), 0.5)
    for name in MKL_VML_FUNCTIONS:
        getattr(torch, name)(one)


def upload(inputs: Mapping[str, np.ndarray], device: str) -> dict[str, Any]:
    """The inputs as torch tensors on `device` (on the CPU, after settle_cpu_math)."""
    if device == "cpu":
        settle_cpu_math()
    return {name: to_torch(array, device) for name, array in inputs.items()}
