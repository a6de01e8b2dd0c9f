"""Small helpers shared by the op modules (naming, seeding, inline inputs)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def take_leading(inputs: Mapping[str, np.ndarray], params: Mapping[str, Any],
                 indices: Sequence[int]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The requests `indices` of inputs whose every tensor has one leading request axis; params'
    `batch` (where it has one) follows."""
    taken = {name: np.ascontiguousarray(array[np.asarray(indices, np.int64)]) for name, array in inputs.items()}
    return taken, dict(params) | ({"batch": len(indices)} if "batch" in params else {})


def rng_for(seed: int, stream: int = 0) -> np.random.Generator:
    """numpy's PCG64 Generator: the same bytes on every machine, no global state."""
    return np.random.default_rng([int(seed), int(stream)])


NORMAL_CHUNK = 1 << 20          # float32 draws per chunk of fill_normal (4 MB: stays in cache)


def fill_normal(rng: np.random.Generator, out: np.ndarray, scale: np.float32) -> np.ndarray:
    """`out` (C-contiguous, any float dtype) filled with `rng.standard_normal(out.shape,
    dtype=np.float32) * scale` cast to its dtype, bit for bit (one stream, drawn in order), in
    chunks: without the full float32 draw and scaled copy that expression makes. Faulting in fresh
    pages cost about as much as the draw itself on our hosts, and a bf16 result is half the draw."""
    flat = np.reshape(out, -1, copy=False)          # a view, or ValueError
    scratch = None if out.dtype == np.float32 else np.empty(min(NORMAL_CHUNK, flat.size), np.float32)
    for lo in range(0, flat.size, NORMAL_CHUNK):
        hi = min(flat.size, lo + NORMAL_CHUNK)
        part = flat[lo:hi] if scratch is None else scratch[:hi - lo]
        rng.standard_normal(dtype=np.float32, out=part)
        part *= scale
        if scratch is not None:
            flat[lo:hi] = part
    return out


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


class LeadingRequests:
    """Op mixin for the request hooks (kdtr.ops.base.Op.request_count ...) of an op whose every
    input and output has one leading request axis; `request_input` names the input that counts them."""

    request_input = ""

    def request_count(self, variant, inputs) -> int:
        return int(inputs[self.request_input].shape[0])

    def take_requests(self, variant, inputs, params, indices):
        return take_leading(inputs, params, indices)

    def by_request(self, variant, outputs, batch):
        return dict(outputs)
