"""kdtree's comparison, cases and timing as a small API for people who write kernels in Python, in
the style of `torch.testing.assert_close` and `triton.testing.do_bench` (docs/testing.md):

- `assert_op_close(op, variant, inputs, outputs, params=...)`: your outputs of an op on these inputs
  against the op's reference, through verify's own check (`kdtr.verify.check_case`: the output
  contract, the op's tolerances, the derived error bound an implementation of another summation
  order is held to, docs/numerics.md). A miss raises `OpMismatch` (an AssertionError) naming, per
  failing output, the worst element, where it sits in the tree and its share of the tolerance;
  a pass returns verify's row;
- `make_case(op, variant, seed=..., **params)` and `op_cases(op, suite=...)`: cases (inputs drawn
  by the op's generator, and the params its reference takes) from keyword parameters, checked as a
  suite's are, or from kdtree's own suites (the shapes `kdtree verify` and `kdtree bench` run);
- `time_gpu(fn, *others, mode=...)`: bench's timing method (kdtr.bench: CUDA events around CUDA
  graph replays, the L2 flushed in cold mode, several functions timed in interleaved balanced
  rounds; perf_counter on a machine without a GPU, labelled `host`), one `Timing` per function.

The pytest plugin's `kdtree_case` fixture is built on it (kdtr.pytest_plugin). Importing it does
not import torch; a call that needs torch imports it. It may import the root modules,
`kdtr.runtime`, `kdtr.scaleout`, `kdtr.records`, `kdtr.ops`, `kdtr.impl`, `kdtr.bundle`,
`kdtr.verify` and `kdtr.bench`, and nothing else of kdtr; no package of kdtr imports it (the pytest
plugin, above every package, does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..bench.schedule import interleave
from ..bench.settings import TimingOptions
from ..bench.timers import DEFAULT_L2_BYTES, DeviceTimer, HostTimer
from ..bundle.case import GOLDEN, reference_outputs
from ..bundle.spec import load_suites, select, suite_from_text
from ..config import config
from ..dtypes import to_numpy
from ..errors import UsageError
from ..impl import Implementation, Serves
from ..impl.base import HOST
from ..impl.parity import position
from ..ops import get_op
from ..runtime import device
from ..verify import DEVICE_REFERENCE, REFERENCE, Options, check_case

__all__ = ["OpCase", "OpMismatch", "assert_op_close", "failure_text", "make_case", "op_cases", "time_gpu"]

SUITES = ("verify", "bench")


class OpMismatch(AssertionError):
    """Outputs that miss the op's tolerances or break its output contract; `row` is verify's row."""

    def __init__(self, message: str, row: Any):
        super().__init__(message)
        self.row = row


@dataclass(frozen=True)
class OpCase:
    """One case of an op: its inputs (numpy, as the op's input specs name them) and the params its
    reference and kernels take; `spec` the suite params it was drawn from (shape, seed included)."""

    op: str
    variant: str
    name: str
    inputs: Mapping[str, np.ndarray] = field(repr=False)
    params: Mapping[str, Any]
    spec: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def assert_close(self, outputs: Mapping[str, Any], **kw: Any):
        """`assert_op_close` on this case's inputs and params."""
        return assert_op_close(self.op, self.variant, self.inputs, outputs, params=self.params,
                               **{"case": self.name, **kw})


def _op(op: Any):
    return get_op(op) if isinstance(op, str) else op


def _numpy(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """numpy arrays from numpy arrays or torch tensors (any device; bf16 as ml_dtypes' bfloat16)."""
    out = {}
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            out[name] = value
        else:
            out[name] = to_numpy(value)
    return out


def assert_op_close(op: Any, variant: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any], *,
                    params: Mapping[str, Any], expected: Mapping[str, Any] | None = None,
                    name: str = "yours", case: str = ""):
    """Check `outputs` (numpy arrays or torch tensors, a subset of the op's outputs) of `op`
    (a name or an Op) / `variant` on `inputs` as `kdtree verify --impl` checks an implementation's:
    against `expected` (default: the op's reference on these inputs, float64 on a GPU where the op
    has one), under the op's tolerances widened per element by the derived bound of the op's
    reduction (`name`, the implementation's, is held to the tolerances alone where it is "cuda" or
    "numpy", as verify holds ours). OpMismatch naming the worst element of each failing output (and
    `case`, a label for the message); verify's row if all pass."""
    op = _op(op)
    if variant not in op.variants:
        raise UsageError(f"unknown variant {variant!r} of op {op.name}; it has {', '.join(op.variants)}")
    unknown = [n for n in outputs if n not in op.outputs]
    if unknown:
        raise UsageError(f"{', '.join(map(repr, unknown))}: not outputs of {op.name} ({', '.join(op.outputs)})")
    inputs, given = _numpy(inputs), _numpy(outputs)
    how = GOLDEN
    if expected is None:
        expected, on_device = reference_outputs(op, variant, inputs, params)
        how = DEVICE_REFERENCE if on_device else REFERENCE
    impl = Implementation(name, (Serves(op.name, variant, tuple(given)),),
                          lambda op_, variant_, inputs_, params_: lambda: dict(given), device=HOST)
    row, _ = check_case(op, variant, inputs, _numpy(expected), dict(params), dict(op.tolerances(variant)),
                        Options(), impl, case=case, file="", expected_from=how)
    if row.failed:
        raise OpMismatch(failure_text(row, inputs, params), row)
    return row


def failure_text(row: Any, inputs: Mapping[str, np.ndarray] | None = None,
                 params: Mapping[str, Any] | None = None) -> str:
    """kdtree's account of a failing verify row: the case and trial, why, and per failing output its
    worst element, where that sits in the tree (from `inputs`, where given), its share of the
    tolerance and how many elements missed it."""
    head = f"FAIL {row.op}/{row.variant}" + (f" {row.case}" if row.case else "") + (
        f" trial {row.trial}" if row.trial else "")
    lines = [head + (f": {row.error}" if row.error else "")]
    for out in row.outputs:
        if out.passed:
            continue
        where = ""
        if out.worst:
            element = out.worst[0]
            spot = {}
            if inputs is not None:
                try:
                    shape = _output_shape(get_op(row.op), row.variant, out.name, inputs, params or {})
                    spot = position(get_op(row.op), row.variant, shape, tuple(element.index), inputs, params)
                except Exception:  # noqa: BLE001 - the row's own words stand without the position
                    spot = {}
            where = (f" worst at {list(element.index)}"
                     + (f" ({', '.join(f'{k} {v}' for k, v in spot.items())})" if spot else "")
                     + f": got {element.got:.7g}, expected {element.expected:.7g};")
        lines.append(f"  {out.name}: {out.reason or 'mismatch'};{where} tol share {out.tol_share:.3g}"
                     f" ({out.mismatches} of {out.count} elements outside {out.tolerance.to_json()})")
    return "\n".join(lines)


def _output_shape(op, variant: str, name: str, inputs, params) -> tuple[int, ...]:
    return tuple(op.output_specs(variant, inputs, params)[name][1])


def make_case(op: Any, variant: str | None = None, *, seed: int = 0, name: str | None = None,
              **params: Any) -> OpCase:
    """A case of `op` from keyword params (the suite parameters of docs/ops: batch, heads, prefix,
    budget, ...; the others at their defaults), checked as a YAML suite's case is (a SpecError
    naming the parameter at fault), its inputs drawn by the op's generator from `seed`."""
    op = _op(op)
    entry = dict(params, seed=seed, **({"name": name} if name is not None else {}))
    suite = {"op": op.name, **({"variant": variant} if variant is not None else {}), "cases": [entry]}
    [case] = suite_from_text(json.dumps(suite), f"make_case({op.name})").cases
    return _drawn(op, case)


def _drawn(op, case) -> OpCase:
    generated = op.generate(case)
    return OpCase(op.name, case.variant, case.name, generated.inputs, dict(generated.params),
                  dict(case.params, seed=case.seed))


def op_cases(op: Any, *, suite: str = "verify", variant: str | None = None,
             pattern: str | None = None) -> Iterator[OpCase]:
    """The cases of kdtree's own suites for `op` (suite "verify": the goldens' shapes, specs/<op>.yaml;
    "bench": the timed shapes, specs/bench/), of `variant` and matching -k `pattern` where given,
    each drawn as it is iterated (a serving-size case holds hundreds of MB)."""
    if suite not in SUITES:
        raise UsageError(f"suite {suite!r}: choose one of {', '.join(SUITES)}")
    op = _op(op)
    folder = config().specs_dir / ("bench" if suite == "bench" else "")
    for loaded in load_suites([folder]):
        if loaded.op != op.name:
            continue
        for case in select(loaded.cases, pattern):
            if variant is None or case.variant == variant:
                yield _drawn(op, case)


def time_gpu(fn: Callable[[], Any], *others: Callable[[], Any], mode: str = "hot", options: Any = None):
    """Time `fn` (and `others`, interleaved with it in balanced rounds: each runs right after every
    other equally often) as `kdtree bench` times a kernel: on a GPU, CUDA events around replays of
    a CUDA graph of k calls (eager where capture fails; the Timing's `method` says), after a
    warm-up, with the L2 flushed before every sample in `mode="cold"`; rounds until every noise is
    under `options.target` or the budget is spent (kdtr.bench.TimingOptions; default: bench's).
    Without a GPU, perf_counter around each call (mode "host"). The Timing of `fn` (ms per call:
    median, p10, p90, rel_ci, samples), or a tuple of one per function with `others`."""
    if mode not in ("hot", "cold"):
        raise UsageError(f"mode {mode!r}: choose hot or cold")
    options = options or TimingOptions()
    options.check()
    calls = (fn, *others)
    timer = None
    if device.gpu_available():
        import torch

        props = torch.cuda.get_device_properties(0)
        timer = DeviceTimer(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
        samplers = [timer.prepare([call], options=options, mode=mode) for call in calls]
    else:
        host = HostTimer()
        samplers = [host.prepare([call], options=options) for call in calls]
    try:
        timings = interleave(samplers, options)
    finally:
        if timer is not None:
            timer.release()
    for timing in timings:
        if isinstance(timing, Exception):
            raise timing
    return tuple(timings) if others else timings[0]
