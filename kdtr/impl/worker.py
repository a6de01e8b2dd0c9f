"""The worker process side of kdtr.impl.isolation: build the implementation, then answer requests
(produce a case's outputs, time the call it kept) until the pipe closes; large arrays come and go
through the caller's carry folder (kdtr.impl.carry)."""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, Callable

from ..errors import KdtreeError, reason
from .base import HOST, CaseData, Implementation, ImplUnavailable, Produced, device_for
from .carry import Carrier
from .evaluation import produce
from .rotation import prepare_sets


class _Kept:
    """The last case's prepared call (and the tensors it returned), the case it was prepared on (its
    op, variant, inputs as the call got them, and params: the other input sets are made from them),
    and the sampler timing it."""

    def __init__(self) -> None:
        self.token = 0
        self.call: Callable[[], Any] | None = None
        self.raw: Any = None
        self.case: tuple | None = None
        self.sampler: Any = None

    def drop(self) -> None:
        self.call = self.raw = self.case = self.sampler = None

    def call_for(self, token: int) -> Callable[[], Any]:
        if token != self.token or self.call is None:
            raise KdtreeError("this worker no longer holds that call")
        return self.call


def main(requests_fd: int, replies_fd: int, parent: int, folder: str) -> None:
    """The worker's main: it dies with its parent, writes nothing to stdout (file descriptor 1 is
    stderr here, so the parent's stdout stays its own), prints a Python stack on a fatal signal
    (faulthandler), builds the implementation from the recipe it is sent first, then answers
    requests in turn until the pipe closes; it exits when its CUDA context is unusable."""
    from ..scaleout.parallel import die_with_parent

    die_with_parent(parent)
    os.dup2(2, 1)
    faulthandler.enable()
    requests = Connection(requests_fd, writable=False)
    conn = Connection(replies_fd, readable=False)
    carrier = Carrier(folder)                # its arrays of SHARED_MIN_BYTES or more go through `folder`
    try:
        impl, why = carrier.recv(requests)(), None
        if impl.device != HOST:
            import torch  # noqa: F401 - imported now, not inside its first case's timeout
    except BaseException as err:  # noqa: BLE001 - a recipe that fails here is every case's reason
        impl, why = None, reason(err)
    kept = _Kept()
    while True:
        try:
            request = carrier.recv(requests)
        except (EOFError, OSError):
            return
        kind, *args = request
        if kind == "ready":
            carrier.send(conn, why)
            continue
        if kind == "produce":
            reply = _produce(impl, kept, *args)
        else:
            try:
                reply = ("done", _time(impl, kept, *args) if kind == "time" else _take(kept, *args))
            except BaseException as err:  # noqa: BLE001 - timing failed: bench's row says why
                reply = ("error", reason(err))
        carrier.send(conn, reply)
        if kind == "produce" and reply[3]:
            return


def _produce(impl: Implementation, kept: _Kept, op_name: str, variant: str, inputs, params, expected,
             determinism: bool, timeout_s: float | None) -> tuple:
    """("produced", Produced without call and raw, its token or None, broken) or ("unavailable" |
    "raise", the message, None, broken); `broken`: its CUDA context is unusable now."""
    from ..ops import get_op
    from .backends import upload

    kept.drop()
    try:
        op = get_op(op_name)
        device = device_for(impl)
        device_inputs = None if device == HOST else upload(inputs, device)   # kept: bench's other sets
        got = produce(impl, CaseData(op, variant, inputs, params), expected,
                      determinism=determinism, timeout_s=timeout_s, device_inputs=device_inputs)
    except ImplUnavailable as err:
        return "unavailable", str(err), None, False
    except KdtreeError as err:
        return "raise", str(err), None, _cuda_broken(impl)
    except BaseException as err:  # noqa: BLE001 - the upload or the readback failed: the case's error
        got = Produced(error=reason(err), error_type=type(err).__name__)
    token = None
    if got.call is not None:
        kept.token += 1
        token, kept.call, kept.raw = kept.token, got.call, got.raw
        kept.case = (op, variant, device_inputs, params)
    broken = (got.error is not None or got.fault is not None) and _cuda_broken(impl)
    return "produced", replace(got, call=None, raw=None), token, broken


def _cuda_broken(impl: Implementation) -> bool:
    """Whether this process's CUDA context is unusable (a sticky error: an illegal address)."""
    if "torch" not in sys.modules or device_for(impl) != "cuda":
        return False
    import torch

    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True
    return False


def _time(impl: Implementation, kept: _Kept, token: int, timer_class, l2_bytes: int | None,
          prepare: dict) -> tuple[Any, int, str]:
    """A timer of `timer_class` (CUDA events with `l2_bytes`, else a host clock) prepares the kept
    call and the other input sets the case's plan asks for, made here by the implementation's own
    prepare (kdtr.impl.rotation.prepare_sets, as bench does in its own process); the sampler stays
    here, its description goes back with how many sets it rotates through and why they fall short."""
    call = kept.call_for(token)
    timer = timer_class(l2_bytes) if l2_bytes is not None else timer_class()
    op, variant, device_inputs, params = kept.case
    calls, kept.sampler, short = prepare_sets(timer, impl, op, variant, device_inputs, params, call, **prepare)
    return replace(kept.sampler, take=None, keepalive=()), len(calls), short


def _take(kept: _Kept, token: int, n: int) -> list[float]:
    kept.call_for(token)
    collecting = gc.isenabled()
    gc.disable()                             # as interleave does: no collector pause inside a sample
    try:
        return [float(x) for x in kept.sampler.take(n)]
    finally:
        if collecting:
            gc.enable()
