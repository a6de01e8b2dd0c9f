"""What `kdtree inspect` shows: a bundle's header and per-tensor value statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import FLOAT_DTYPES
from .format import read_bundle

STATS_CHUNK = 1 << 20          # elements per pass: memory stays bounded for any tensor size


def tensor_stats(array: np.ndarray, dtype: str) -> dict[str, Any]:
    """min / max / mean over finite values, and NaN / Inf counts, in bounded memory."""
    flat = array.reshape(-1)
    lo, hi, total, finite_count, nan, inf = np.inf, -np.inf, 0.0, 0, 0, 0
    for start in range(0, flat.size, STATS_CHUNK):
        chunk = flat[start:start + STATS_CHUNK].astype(np.float64)
        if dtype in FLOAT_DTYPES:
            nan += int(np.isnan(chunk).sum())
            inf += int(np.isinf(chunk).sum())
            chunk = chunk[np.isfinite(chunk)]
        if chunk.size:
            lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
            total += float(chunk.sum())
            finite_count += chunk.size
    if not finite_count:
        return {"min": None, "max": None, "mean": None, "nan": nan, "inf": inf}
    return {"min": lo, "max": hi, "mean": total / finite_count, "nan": nan, "inf": inf}


def summarize(path: str | Path) -> dict[str, Any]:
    bundle = read_bundle(path)
    tensors = []
    for entry in bundle.entries:
        tensors.append({"name": entry.name, "role": entry.role, "dtype": entry.dtype,
                        "shape": list(entry.shape), "nbytes": entry.nbytes, "crc32": entry.crc32,
                        **tensor_stats(bundle.array(entry.name), entry.dtype)})
    return {"file": str(path), "version": list(bundle.version), "size": Path(path).stat().st_size,
            "meta": bundle.meta, "tensors": tensors}
