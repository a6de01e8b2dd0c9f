"""Small helpers shared by the op modules (naming, seeding, inline inputs)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def rng_for(seed: int, stream: int = 0) -> np.random.Generator:
    """numpy's PCG64 Generator: the same bytes on every machine, no global state."""
    return np.random.default_rng([int(seed), int(stream)])


def name_from(params: Mapping[str, Any], always: Sequence[tuple[str, str]],
              optional: Sequence[tuple[str, str]], defaults: Mapping[str, Any]) -> str:
    """`b2_h16_p2048_n16`-style names: the `always` fields, then the others that differ from
    their defaults."""
    parts = []
    for index, (key, prefix) in enumerate([*always, *optional]):
        value = params.get(key)
        if index >= len(always) and value == defaults.get(key):
            continue
        if isinstance(value, bool):
            if value:
                parts.append(prefix)
            continue
        if isinstance(value, float):
            value = f"{value:g}".replace("-", "m").replace("+", "")
        parts.append(f"{prefix}{value}")
    return "_".join(parts)


def inline_array(inline: Mapping[str, Any], name: str, dtype, ndim: int, batch: int | None = None):
    """An inline input as an array of `ndim` dims; a missing leading batch dim is broadcast."""
    if name not in inline:
        return None
    array = np.asarray(inline[name], dtype=np.float64 if np.dtype(dtype).kind == "f" else np.int64)
    if array.ndim == ndim - 1 and batch is not None:
        array = np.broadcast_to(array, (batch,) + array.shape)
    if array.ndim != ndim:
        raise ValueError(f"inline input {name!r} must have {ndim} (or {ndim - 1}) dimensions, "
                         f"got shape {list(array.shape)}")
    return np.ascontiguousarray(array.astype(dtype))
