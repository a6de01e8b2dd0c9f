"""The KDTR dtype names and their numpy / torch counterparts (bf16 through ml_dtypes).

ml_dtypes is imported the first time a bf16 dtype is asked for: its start-up (half a second on a
loaded CI core) would otherwise be paid by every command, bf16 or not."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


class _Dtypes(Mapping):
    """name -> numpy dtype, with bf16 resolved on first use."""

    def __init__(self, plain: dict[str, np.dtype | None]):
        self._plain = plain

    def __getitem__(self, name: str) -> np.dtype:
        dtype = self._plain[name]
        return _bf16() if dtype is None else dtype

    def __iter__(self) -> Iterator[str]:
        return iter(self._plain)

    def __len__(self) -> int:
        return len(self._plain)


# name -> numpy dtype (little-endian); order is the one docs/format.md lists; None: bf16, lazily
NUMPY_DTYPES: Mapping[str, np.dtype] = _Dtypes({
    "f64": np.dtype("<f8"),
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "bf16": None,
    "i64": np.dtype("<i8"),
    "i32": np.dtype("<i4"),
    "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"),
    "u64": np.dtype("<u8"),
    "u32": np.dtype("<u4"),
    "u16": np.dtype("<u2"),
    "u8": np.dtype("u1"),
    "bool": np.dtype("?"),
})

FLOAT_DTYPES = frozenset({"f64", "f32", "f16", "bf16"})


def kdtr_dtype(dtype: np.dtype) -> str:
    """The KDTR name of a numpy dtype; ValueError for one KDTR cannot hold."""
    dtype = np.dtype(dtype)
    if is_bf16(dtype):
        return "bf16"
    for name, candidate in NUMPY_DTYPES._plain.items():
        if candidate is not None and dtype == candidate:
            return name
    raise ValueError(f"numpy dtype {dtype} has no KDTR equivalent")


def is_bf16(dtype: np.dtype) -> bool:
    """Whether `dtype` is ml_dtypes' bfloat16, without importing ml_dtypes for any other dtype."""
    return dtype.name == "bfloat16" and dtype == _bf16()


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
    if is_bf16(array.dtype):
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(array.copy()).to(device)


def to_numpy(tensor) -> np.ndarray:
    """A numpy array with the same bytes as a torch tensor (any device)."""
    import torch

    tensor = tensor.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(NUMPY_DTYPES["bf16"])
    return tensor.numpy()


def spacing(x, dtype) -> np.ndarray:
    """The spacing of `dtype`'s floats at |x| (float64): 2^(e - m) for |x| in [2^e, 2^(e+1)), where m
    is the dtype's stored fraction bits (bf16 7, f32 23); below its smallest normal number, the
    subnormal spacing. One ulp of the dtype at x."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        info = np.finfo(dtype)
    else:
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    x = np.abs(np.asarray(x, dtype=np.float64))
    _, exp = np.frexp(x)                              # x = f * 2^exp, f in [0.5, 1): e = exp - 1
    e = np.where(x < 2.0 ** info.minexp, info.minexp, exp.astype(np.int64) - 1)   # frexp(0) is (0, 0)
    return np.ldexp(1.0, e - info.nmant)
