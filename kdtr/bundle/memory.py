"""Host memory a case takes to verify or bench, checked against one bound before anything runs.

gen-refs refuses a case whose estimate is over `--mem-limit` (kdtr.bundle.refs.check_memory); verify and
bench do the same with the backend's own estimate (Op.run_bytes) on top of the bundle's arrays, so
a torch run that would take 15 GB is refused with both figures instead of exhausting the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import KdtreeError, LimitError
from ..ops import get_op
from .refs import MEM_FRACTION, size_text


def run_estimate(op_name: str, variant: str, params: Mapping[str, Any], backend: str, held: int = 0) -> int | None:
    """Bytes one run of `backend` takes on a case of these suite params, `held` bytes (its loaded
    arrays) included; None where the op has no estimate for this backend or the params are odd."""
    try:
        need = get_op(op_name).run_bytes(variant, params, backend)
    except (KeyError, TypeError, ValueError):     # odd params: the run itself says why
        return None
    return None if need is None else need + held


def bundle_estimate(path: str | Path, backend: str) -> tuple[str, int | None]:
    """(op/case, bytes) to verify a bundle on `backend`: its arrays (read into memory once, then
    copied for the run: twice the file) and the run's own estimate from the suite params it
    stores. A bundle without suite params (a capture) has no estimate."""
    from .format import read_meta

    meta = read_meta(path)
    name = f"{meta.get('op')}/{meta.get('case', Path(path).stem)}"
    params = meta.get("case_params")
    if not isinstance(params, dict) or not isinstance(meta.get("op"), str):
        return name, None
    held = 2 * Path(path).stat().st_size
    return name, run_estimate(meta["op"], str(meta.get("variant", "default")), params, backend, held)


def check_within(cases: Iterable[tuple[str, int | None]], limit: int | None, what: str) -> None:
    """LimitError naming the first case whose estimate is over `limit` bytes, with both figures."""
    if limit is None:
        return
    for name, need in cases:
        if need is not None and need > limit:
            raise LimitError(f"case {name} needs about {size_text(need)} to {what}, over the memory limit of "
                             f"{size_text(limit)} (--mem-limit; default {MEM_FRACTION:g} of MemAvailable)")


def check_items(items, backend: str, limit: int | None) -> None:
    """Every bench case's estimate within `limit`: the inputs its generator makes (estimate_bytes,
    held while timing) plus one run of `backend`."""
    def estimates():
        for item in items:
            try:
                held = get_op(item.op).estimate_bytes(item.variant, item.params) or 0
            except (KeyError, TypeError, ValueError):
                held = 0
            yield f"{item.op}/{item.name}", run_estimate(item.op, item.variant, item.params, backend, held)
    check_within(estimates(), limit, f"bench on {backend}")


def check_bundles(files: Iterable[str | Path], backend: str, limit: int | None) -> None:
    """Every bundle's estimate for `backend` within `limit`, before any is run (a bad bundle is
    left to the run, which reports it with the others)."""
    def estimates():
        for file in files:
            try:
                yield bundle_estimate(file, backend)
            except KdtreeError:
                continue
    check_within(estimates(), limit, f"verify on {backend}")
