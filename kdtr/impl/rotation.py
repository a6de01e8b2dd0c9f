"""A prepared call made ready to time by its case's plan: the implementation's own prepare makes the
other input sets the plan rotates through, and the timer prepares them with the plan's calls a sample
(kdtr/bench/plan.py). One code path for bench's own process (kdtr.bench.runner) and for an isolated
implementation's worker process (kdtr.impl.worker), so a row timed in either way is timed the same way.
"""

from __future__ import annotations

import gc
import sys
from typing import Any, Callable, Mapping

from ..errors import reason
from ..ops.base import Op
from .base import Implementation


def _cleanup() -> None:
    """What a failed set leaves: collected, and the allocator's cache handed back where CUDA is up."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def input_sets(impl: Implementation, op: Op, variant: str, device_inputs: Mapping[str, Any] | None,
               params: Mapping[str, Any], call: Callable[[], Any], count: int,
               cleanup: Callable[[], None] = _cleanup) -> tuple[list, str]:
    """`call` and, where `count` > 1, one more call per other input set: `impl`'s own prepare over
    copies of `device_inputs` (the inputs `call` was prepared on). Returns the calls and why they
    fall short of `count` ("" where they do not: then `call` alone)."""
    calls = [call]
    try:
        for _ in range(count - 1):
            calls.append(impl.prepare(op, variant, {n: t.clone() for n, t in device_inputs.items()}, dict(params)))
    except Exception as err:  # noqa: BLE001 - timed on one set, labelled, no ratio
        del calls[1:]
        cleanup()
        return calls, f"its {count} input sets could not be made ({reason(err)}): not timed by the case's method"
    return calls, ""


def prepare_sets(timer: Any, impl: Implementation, op: Op, variant: str, device_inputs: Mapping[str, Any] | None,
                 params: Mapping[str, Any], call: Callable[[], Any], *, sets: int,
                 calls_per_sample: int | None = None, cleanup: Callable[[], None] = _cleanup,
                 **prepare: Any) -> tuple[list, Any, str]:
    """`call` and its other input sets (`input_sets`, `sets` in all) made ready by
    `timer.prepare(calls, **prepare)`: with the plan's `calls_per_sample` where every set was made,
    else with a count of its own (None: the timer sizes it; such a row gets no ratio, `same_method`).
    Returns the calls, the sampler and why the sets fall short ("" where they do not)."""
    calls, short = input_sets(impl, op, variant, device_inputs, params, call, sets, cleanup)
    fixed = calls_per_sample if len(calls) == sets else None
    return calls, timer.prepare(calls, calls_per_sample=fixed, **prepare), short
