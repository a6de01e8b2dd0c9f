"""The KDTR dtype names and their numpy / torch counterparts (bf16 through ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# name -> numpy dtype (little-endian); order is the one kdtr-format.md lists
NUMPY_DTYPES: dict[str, np.dtype] = {
    "f64": np.dtype("<f8"),
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i64": np.dtype("<i8"),
    "i32": np.dtype("<i4"),
    "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"),
    "u64": np.dtype("<u8"),
    "u32": np.dtype("<u4"),
    "u16": np.dtype("<u2"),
    "u8": np.dtype("u1"),
    "bool": np.dtype("?"),
}

FLOAT_DTYPES = frozenset({"f64", "f32", "f16", "bf16"})


def kdtr_dtype(dtype: np.dtype) -> str:
    """The KDTR name of a numpy dtype; ValueError for one KDTR cannot hold."""
    dtype = np.dtype(dtype)
    for name, candidate in NUMPY_DTYPES.items():
        if dtype == candidate:
            return name
    raise ValueError(f"numpy dtype {dtype} has no KDTR equivalent")


def torch_dtype(name: str):
    import torch

    return {
        "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
        "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
        "u64": torch.uint64, "u32": torch.uint32, "u16": torch.uint16, "u8": torch.uint8,
        "bool": torch.bool,
    }[name]


def to_torch(array: np.ndarray, device="cpu"):
    """A torch tensor with the same bytes (bf16 goes through an int16 view)."""
    import torch

    array = np.ascontiguousarray(array)
    if array.dtype == NUMPY_DTYPES["bf16"]:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(array.copy()).to(device)


def to_numpy(tensor) -> np.ndarray:
    """A numpy array with the same bytes as a torch tensor (any device)."""
    import torch

    tensor = tensor.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(NUMPY_DTYPES["bf16"])
    return tensor.numpy()
