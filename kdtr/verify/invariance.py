"""The invariance probe (`verify --invariance`): does an implementation give every request the same
bits whatever else is in its batch?

Three properties, each compared bitwise with the batched run's rows of the same requests:
`batch` (each request run alone, a batch of one), `order` (the batch in a fixed other order) and
`split` (the split count forced to 1 against the launch's own choice: only where the launch has a
split knob, our CUDA kernels). Slicing a batch by request is the op's (Op.request_count,
take_requests, by_request); running is the caller's (a `Runner`), so this works for any
implementation. Where a property does not hold, the worst difference is given in ulps of the
output's dtype (integers: in units) and where: output, request, index within the request's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..dtypes import FLOAT_DTYPES, kdtr_dtype, spacing
from ..ops.base import Op

PROPERTIES = ("batch", "order", "split")
SPLIT_KNOB = "SPLITS"        # the launch knob (CudaKernel.launch_knobs) that forces a kernel's split count
ORDER_SEED = 20261204        # the fixed permutation of the `order` probe

# Runs the implementation on (inputs, params); `splits` forces the split count (None: the launch's
# choice). Returns numpy outputs, or raises (the property then says why it was not probed).
Runner = Callable[[Mapping[str, np.ndarray], Mapping[str, Any], "int | None"], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Difference:
    """The worst difference between the probed rows and the batched run's."""

    output: str
    request: int                  # the request's index in the batched run
    index: tuple[int, ...]        # within the request's rows of that output (row first)
    ulps: float                   # of the output's dtype (inf: a NaN against a number)

    def to_plain(self) -> dict[str, Any]:
        return {"output": self.output, "request": self.request, "index": list(self.index),
                "ulps": self.ulps if np.isfinite(self.ulps) else str(self.ulps)}


@dataclass(frozen=True)
class Verdict:
    """One property: holds (True/False), or None with the reason it was not probed (n/a)."""

    name: str
    holds: bool | None
    reason: str | None = None
    worst: Difference | None = None

    def to_plain(self) -> dict[str, Any]:
        out: dict[str, Any] = {"holds": self.holds}
        if self.reason:
            out["reason"] = self.reason
        if self.worst is not None:
            out["worst"] = self.worst.to_plain()
        return out

    @property
    def label(self) -> str:
        """For tables: yes, n/a, or the worst difference."""
        if self.holds is None:
            return "n/a"
        if self.holds:
            return "yes"
        if self.worst is None:
            return "no"
        w = self.worst
        return f"no ({ulps_text(w.ulps)} ulp, {w.output} req {w.request} at {list(w.index)})"


def ulps_text(value: float) -> str:
    """Whole ulps from 10 on; below, two digits (floored at the output's scale, a difference may be
    a fraction of an ulp)."""
    if not np.isfinite(value):
        return "inf"
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def ordered_bits(array: np.ndarray) -> np.ndarray:
    """Floats as int64 on a scale where adjacent floats differ by 1 (so a difference is in ulps);
    integers as themselves."""
    if array.dtype.kind in "iub":
        return array.astype(np.int64)
    width = array.dtype.itemsize
    raw = array.view({2: np.int16, 4: np.int32, 8: np.int64}[width]).astype(np.int64)
    sign = np.int64(1) << (8 * width - 1)
    return np.where(raw < 0, -(raw & (sign - 1)), raw)   # -0.0 and 0.0 meet at 0


def worst_difference(probed: Mapping[str, np.ndarray], batched: Mapping[str, np.ndarray],
                     requests: Sequence[int]) -> Difference | None:
    """Compare request i of `probed` (leading request axis) with request requests[i] of `batched`,
    bitwise; None where every output is equal, else the largest difference in ulps (see `gaps`)."""
    worst = None
    for name, got in probed.items():
        if name not in batched:
            continue
        want = batched[name][np.asarray(requests, np.int64)]
        if got.shape != want.shape:
            return Difference(name, int(requests[0]), (), float("inf"))
        if np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            continue
        gap = gaps(got, want, batched[name])
        flat = int(np.argmax(gap))
        where = np.unravel_index(flat, got.shape)
        found = Difference(name, int(requests[where[0]]), tuple(int(i) for i in where[1:]), float(gap.flat[flat]))
        if worst is None or found.ulps > worst.ulps:
            worst = found
    return worst


def gaps(got: np.ndarray, want: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """Per element, how far `got` is from `want`: integers in units; floats in ulps of their dtype
    at max(|want|, rms(whole)), the output's root mean square as a floor (as --against's parity
    does), so an element that cancels to near zero does not read as 10^5 ulps for a difference
    that is tiny at the output's scale; inf where one side is NaN and the other not."""
    if kdtr_dtype(got.dtype) not in FLOAT_DTYPES:
        with np.errstate(over="ignore"):
            return np.abs(ordered_bits(got) - ordered_bits(want)).astype(np.float64)
    a, b = got.astype(np.float64), want.astype(np.float64)
    scale = np.maximum(np.abs(np.where(np.isfinite(b), b, 0.0)), _rms(whole))
    with np.errstate(invalid="ignore"):
        gap = np.abs(a - b) / spacing(scale, got.dtype)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return np.where(same, 0.0, np.where(np.isnan(gap), np.inf, gap))


def _rms(values: np.ndarray) -> float:
    """Root mean square of the finite elements (0 for none)."""
    z = values.astype(np.float64)
    z = z[np.isfinite(z)]
    return float(np.sqrt(np.mean(np.square(z)))) if z.size else 0.0


def fixed_permutation(count: int) -> list[int]:
    """A fixed permutation of range(count) that moves every request where count > 1 (a shuffle by
    ORDER_SEED, turned by one place where it left a request in place)."""
    order = np.random.default_rng(ORDER_SEED).permutation(count)
    if count > 1 and np.any(order == np.arange(count)):
        order = np.roll(np.arange(count), 1)
    return [int(i) for i in order]


def _run(run: Runner, op: Op, variant: str, inputs, params, requests: Sequence[int], splits: int | None = None):
    """The outputs of a batch of `requests`, each with a leading request axis."""
    sub_inputs, sub_params = op.take_requests(variant, inputs, params, list(requests))
    return op.by_request(variant, dict(run(sub_inputs, sub_params, splits)), len(requests))


def _verdict(name: str, attempt: Callable[[], Difference | None]) -> Verdict:
    try:
        worst = attempt()
    except Exception as err:        # noqa: BLE001 - the implementation failed on the probe's batch
        return Verdict(name, False, f"the run failed: {type(err).__name__}: {err}")
    return Verdict(name, worst is None, None, worst)


def probe(op: Op, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any],
          batched: Mapping[str, np.ndarray], run: Runner, split_reason: str | None) -> tuple[Verdict, ...]:
    """The three verdicts for one case; `batched` is the implementation's own batched run, `run`
    runs it again; `split_reason` is why the split count cannot be forced (None: it can)."""
    count = op.request_count(variant, inputs)
    if count is None:
        why = f"{op.name}: {op.unbatched_reason}"
        return tuple(Verdict(name, None, why) for name in PROPERTIES)
    everyone = list(range(count))
    whole = op.by_request(variant, dict(batched), count)

    def alone() -> Difference | None:
        found = [worst_difference(_run(run, op, variant, inputs, params, [b]), whole, [b]) for b in everyone]
        return max((d for d in found if d is not None), key=lambda d: d.ulps, default=None)

    def reordered() -> Difference | None:
        order = fixed_permutation(count)
        return worst_difference(_run(run, op, variant, inputs, params, order), whole, order)

    def unsplit() -> Difference | None:
        return worst_difference(_run(run, op, variant, inputs, params, everyone, splits=1), whole, everyone)

    verdicts = [_verdict("batch", alone)]
    verdicts.append(_verdict("order", reordered) if count > 1
                    else Verdict("order", None, "one request: no other order"))
    verdicts.append(_verdict("split", unsplit) if split_reason is None else Verdict("split", None, split_reason))
    return tuple(verdicts)


def split_knob_reason(op: Op, variant: str, inputs, params, implementation: str, ours: bool) -> str | None:
    """Why the split count cannot be forced for this run (None: it can): only our CUDA kernels
    have the knob, and only those whose registry entry lists it."""
    if not ours or implementation != "cuda":
        return (f"{implementation}: only our CUDA kernels run as the backend (--backend cuda) take a "
                f"forced split count ({SPLIT_KNOB})")
    try:
        kernel = op.kernel_choice(variant, inputs, params)
        knobs = op.cuda_kernel(kernel, variant).launch_knobs
    except Exception as err:        # noqa: BLE001 - an op without a choosable kernel here
        return f"no kernel choice: {err}"
    return None if SPLIT_KNOB in knobs else f"{op.name}/{variant} kernel {kernel} has no {SPLIT_KNOB} knob"


def to_plain(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    return {v.name: v.to_plain() for v in verdicts}


def with_invariance(row, outputs: Mapping[str, np.ndarray] | None, op: Op, variant: str, inputs, params,
                    options, impl=None):
    """A kdtr.verify.VerifyRow with the probe of its implementation (`options.invariance`: the
    backend's, or `impl`'s), given its batched `outputs` (None: it gave none, nothing to probe)."""
    if not options.invariance or outputs is None:
        return row
    if impl is None:
        kernel = options.kernel_for(op, variant)
        run = backend_runner(options.backend, op, variant, kernel, options.defines_for(kernel))
    else:
        run = impl_runner(lambda splits: impl, op, variant)
    why = split_knob_reason(op, variant, inputs, params, row.backend, ours=impl is None)
    return replace(row, invariance=to_plain(probe(op, variant, inputs, params, outputs, run, why)))


def backend_runner(backend: str, op: Op, variant: str, kernel: str | None,
                   defines: dict[str, str] | None = None) -> Runner:
    """A Runner of the built-in implementation the backend names (`kernel` and its `defines` as verify
    forced them; a split count forces our kernels' SPLITS knob)."""
    from ..impl.builtin import builtin, cuda_build

    def implementation(splits):
        if backend != "cuda" or (kernel is None and splits is None):
            return builtin(backend)
        knobs = {**(defines or {}), **({SPLIT_KNOB: splits} if splits is not None else {})}
        return cuda_build(kernel=kernel, defines=knobs or None)
    return impl_runner(implementation, op, variant)


def impl_runner(implementation: Callable[[int | None], Any], op: Op, variant: str) -> Runner:
    """A Runner of the implementation `implementation(splits)` gives, through the one evaluator
    (kdtr.impl.evaluate); its failure raises, with the reason."""
    from ..impl import CaseData, Status, evaluate

    def run(inputs, params, splits=None):
        outcome = evaluate(implementation(splits), CaseData(op, variant, inputs, params))
        if outcome.status is not Status.PASSED:
            raise RuntimeError(outcome.reason)
        return outcome.outputs
    return run
