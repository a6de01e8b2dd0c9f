"""The one evaluator: run an implementation on a case, check what came back, compare it with the
expected outputs. verify (goldens, trials, captured outputs, --against), bench (the check before
timing) and e2e all go through `evaluate`, so an implementation is held to one contract everywhere.

What one evaluation guarantees, whatever the implementation does:
- it gets its own deep copy of the params (one implementation that edits them cannot change what
  the next one sees) and freshly uploaded inputs (unless the caller hands device inputs it owns);
- whatever it prints goes to stderr while it runs (Python's `sys.stdout` and file descriptor 1), so
  `--json -` keeps stdout for the JSON alone;
- any exception it raises, `SystemExit` and `GeneratorExit` included (not KeyboardInterrupt), is
  the outcome's reason (`errors.reason`: one line), and the run goes on. `os._exit` or a signal
  ends the process: an implementation with a `worker` runs in a worker process of its own
  (kdtr.impl.isolation), where its death is its case's error (docs/implementations-model.md);
- with `timeout_s`, the call runs under a SIGALRM timer (POSIX, main thread only): past it, the
  outcome is an error "ran past the case timeout". The signal is delivered between Python bytecodes,
  so a call blocked inside one C function (a long BLAS call, a device sync) is stopped when that
  function returns, not before; a call that swallows BaseException defeats it;
- a kdtree error that is not the case's own (no GPU, a compile error, a bad configuration) is
  raised: the run cannot go on. A LaunchError fails the case; ImplUnavailable skips it.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import numpy as np

from ..errors import KdtreeError, LaunchError, reason
from ..ops.base import Op, Tolerance
from .base import HOST, CaseData, Implementation, ImplUnavailable, Produced, check_outputs, device_for

if TYPE_CHECKING:
    from ..ops.compare import Gate


class Status(str, enum.Enum):
    """The closed set of outcomes; each but PASSED carries its reason."""

    PASSED = "passed"          # ran, kept the contract, every compared output within tolerance
    FAILED = "failed"          # ran, but broke the output contract or missed a tolerance
    ERROR = "error"            # raised (or timed out) instead of returning outputs
    SKIPPED = "skipped"        # cannot run here (ImplUnavailable): not a pass, not a failure
    NOT_RUN = "not run"        # does not serve the case's op and variant


@dataclass(frozen=True)
class Outcome:
    """What evaluating one implementation on one case gave (validated per status, see Status).

    `checks` are the compared outputs (kdtr.ops.compare.OutputCheck); `outputs` the numpy outputs it
    gave (kept where the contract held, also when a tolerance was missed: parity and the
    determinism probe use them); `call` and `raw` the prepared call and the tensors it returned
    (bench times the one and re-reads the other)."""

    status: Status
    impl: str
    reason: str | None = None
    checks: tuple = ()
    not_compared: tuple[str, ...] = ()
    deterministic: bool | None = None
    seconds: float = 0.0
    error_type: str | None = None          # ERROR: the exception's class name
    outputs: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)
    call: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        status = Status(self.status)
        if status is Status.PASSED:
            if self.reason is not None or not all(c.passed for c in self.checks):
                raise ValueError("a passed outcome has no reason and no failing check")
        elif not self.reason:
            raise ValueError(f"a {status.value} outcome needs its reason")
        if status in (Status.ERROR, Status.SKIPPED, Status.NOT_RUN) and (self.checks or self.outputs is not None):
            raise ValueError(f"a {status.value} outcome compared nothing")
        if (status is Status.ERROR) != (self.error_type is not None):
            raise ValueError("error_type belongs to an error outcome, and only there")

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def failed(self) -> bool:
        """It ran (or was to run) and did not pass; skipped and not-run outcomes are neither."""
        return self.status in (Status.FAILED, Status.ERROR)

    @property
    def contract_fault(self) -> bool:
        """It returned, but what it returned broke the contract (nothing was compared)."""
        return self.status is Status.FAILED and not self.checks


class CaseTimeout(BaseException):
    """Raised into an implementation's call when the case timeout fires (a BaseException, so the
    implementation's own `except Exception` does not swallow it)."""


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Python's sys.stdout and file descriptor 1 both point at stderr meanwhile."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:                     # no fd 1 (a closed stdout): Python's level only
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """SIGALRM after `seconds` raises CaseTimeout into the running code (see the module docstring);
    no limit without `seconds`, off the main thread, or where the platform has no setitimer."""
    if not seconds or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
        raise CaseTimeout(f"ran past the case timeout of {seconds:g} s")
    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class _Ran:
    call: Callable[[], Any] | None = None
    raw: Any = None
    fault: str | None = None           # the contract the outputs broke
    error: BaseException | None = None


def _run_once(impl: Implementation, case: CaseData, device: str, device_inputs, expected,
              timeout_s: float | None) -> _Ran:
    """One prepare-and-call of `impl` (a HOST one takes the case's numpy inputs and never imports
    torch; the others get torch inputs on `device`) and the contract check of what it returned."""
    op, variant = case.op, case.variant
    host = device == HOST
    if host:
        device_inputs, no_grad = case.inputs, contextlib.nullcontext()
    else:
        import torch

        no_grad = torch.no_grad()
        if device_inputs is None:
            from .backends import upload

            device_inputs = upload(case.inputs, device)
    try:
        with stdout_to_stderr(), _deadline(timeout_s), no_grad:
            call = impl.prepare(op, variant, device_inputs, copy.deepcopy(dict(case.params)))
            raw = call()
            if device == "cuda":
                torch.cuda.synchronize()
        fault = check_outputs(op, variant, raw, op.output_specs(variant, case.inputs, case.params),
                              impl.provides(op, variant), expected, host=host)
        return _Ran(call, raw, fault)
    except (ImplUnavailable, KeyboardInterrupt):
        raise
    except KdtreeError as err:
        if isinstance(err, LaunchError):
            return _Ran(error=err)
        raise                            # no GPU, a compile error: the run cannot go on
    except BaseException as err:  # noqa: BLE001 - SystemExit, GeneratorExit, a timeout: the case's reason
        return _Ran(error=err)


def produce(impl: Implementation, case: CaseData, expected: Mapping[str, np.ndarray] | None = None, *,
            determinism: bool = False, timeout_s: float | None = None,
            device_inputs: Mapping[str, Any] | None = None) -> Produced:
    """Run `impl` on `case` in this process and read its outputs back (see `evaluate`, which
    compares them; an isolated implementation's worker process runs this). ImplUnavailable and a
    kdtree error that is not the case's own are raised."""
    from ..dtypes import to_numpy

    device = device_for(impl)
    ran = _run_once(impl, case, device, device_inputs, expected, timeout_s)
    if ran.error is not None:
        return Produced(error=reason(ran.error), error_type=type(ran.error).__name__)
    if ran.fault is not None:
        return Produced(fault=ran.fault, call=ran.call, raw=ran.raw)
    provides = impl.provides(case.op, case.variant)
    readback = np.asarray if device == HOST else to_numpy
    try:
        outputs = {name: readback(ran.raw[name]) for name in provides}
    except Exception as err:  # noqa: BLE001 - a tensor that cannot be read back breaks the contract
        return Produced(fault=f"its outputs cannot be read back: {reason(err)}")
    deterministic = None
    if determinism:
        again = _run_once(impl, case, device, None, expected, timeout_s)
        deterministic = again.error is None and again.fault is None and all(
            _bitwise_equal(outputs[n], readback(again.raw[n])) for n in provides)
    return Produced(outputs, deterministic=deterministic, call=ran.call, raw=ran.raw)


def evaluate(impl: Implementation, case: CaseData, expected: Mapping[str, np.ndarray] | None = None,
             tolerances: Mapping[str, Tolerance] | None = None, *, determinism: bool = False,
             timeout_s: float | None = None, device_inputs: Mapping[str, Any] | None = None,
             gates: Mapping[str, Gate] | None = None) -> Outcome:
    """Run `impl` on `case` and judge it (see the module docstring and Status). `expected` (numpy,
    the op's names) also catches a NaN where it has none; with `tolerances` too, every output the
    implementation provides is compared (kdtr.ops.compare.compare_output). `determinism` runs it a
    second time and says whether the outputs are bitwise equal. `device_inputs`: torch inputs the
    caller uploaded (bench keeps them for the timed calls); default: uploaded here (an isolated
    implementation's worker uploads its own). `gates`: per output, the gate it is held to within its
    tolerance (kdtr.ops.numerics; docs/numerics.md)."""
    from ..ops.compare import compare_output

    op, variant = case.op, case.variant
    if not impl.serves(op.name, variant):
        return Outcome(Status.NOT_RUN, impl.name, f"{impl.name} does not serve {op.name}/{variant}")
    started = time.perf_counter()
    try:
        why = impl.unavailable()
        if why:
            raise ImplUnavailable(f"{impl.name}: {why}")
        if impl.worker is not None:
            from .isolation import produce_in_worker

            got = produce_in_worker(impl, case, expected, determinism=determinism, timeout_s=timeout_s)
        else:
            got = produce(impl, case, expected, determinism=determinism, timeout_s=timeout_s,
                          device_inputs=device_inputs)
    except ImplUnavailable as err:
        return Outcome(Status.SKIPPED, impl.name, str(err), seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if got.error is not None:
        return Outcome(Status.ERROR, impl.name, got.error, seconds=seconds, error_type=got.error_type)
    if got.fault is not None:
        return Outcome(Status.FAILED, impl.name, got.fault, seconds=seconds, call=got.call, raw=got.raw)
    provides = impl.provides(op, variant)
    checks: tuple = ()
    if expected is not None and tolerances is not None:
        gates = gates or {}
        checks = tuple(compare_output(name, got.outputs[name], expected[name], tolerances[name], gates.get(name))
                       for name in provides)
    missed = "; ".join(f"{c.name}: {c.reason}" for c in checks if not c.passed)
    return Outcome(Status.FAILED if missed else Status.PASSED, impl.name, missed or None, checks,
                   tuple(n for n in op.outputs if n not in provides), got.deterministic, seconds,
                   outputs=got.outputs, call=got.call, raw=got.raw)


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))
