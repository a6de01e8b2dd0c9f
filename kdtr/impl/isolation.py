"""Implementations under test in worker processes of their own: a crash is a failing row, not the run's end.

Every implementation that is not one of ours (`--impl`, `--against`, the pytest plugin's
`--kdtree-impl` and `kdtree_case.check`, `bench --impl`) runs by default in a spawned worker
process: one per implementation (keyed by its recipe, `Implementation.worker`), reused across
cases, started again after it dies. Its `os._exit`, a segfault, an `abort()`, any signal, a CUDA
error that leaves its context unusable, or a call past the case timeout that never returns to
Python (it is killed) is that case's error with the cause, and the run goes on. The worker has
its own GPU context and its own copy of the inputs (it uploads them); it runs the implementation
and reads its outputs back (kdtr.impl.evaluation.produce), and the comparison runs here.

Bench times an isolated implementation inside its worker (`WorkerCall.time_in_worker`): the same
timer class on the call the worker prepared and, where the case rotates input sets, on the other
sets its prepare makes there, by the case's plan (kdtr.impl.rotation, as in bench's own process),
so no pipe is inside a timed region; only the samples come back. KDTREE_ISOLATE=0 runs every
implementation in the calling process (for a debugger).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ConfigError, KdtreeError
from .base import CaseData, Implementation, ImplUnavailable, Produced
from .carry import Carrier, CarryFolder

ISOLATE_VARIABLE = "KDTREE_ISOLATE"
GRACE_S = 10.0              # past the case timeout(s), before a worker that has not answered is killed
BYTES_PER_S = 2.5e8         # ... and a second per 250 MB of the case's arrays, to carry them both ways
                            # (kdtr.impl.carry, shared memory: 0.35-1.3 GB/s one way on the 2-core box)
PIPE_BYTES_PER_S = 1e8      # ... and per 100 MB pickled through the pipe where the carry folder was full
JOIN_S = 5.0


class WorkerFailure(KdtreeError):
    """The worker could not time an implementation's call: it died, or timing raised there
    (bench's row says so; the other implementations are timed on)."""


class WorkerDied(WorkerFailure):
    """The worker died while timing: the implementation under test crashed (bench fails its row)."""


class _Died(Exception):
    """The worker process is gone (the message: how it ended)."""


class _NoAnswer(Exception):
    """The worker did not answer in time; it has been killed."""


def isolation_on() -> bool:
    """KDTREE_ISOLATE: 1 (the default) runs implementations under test in worker processes, 0 in
    the calling process; anything else is a ConfigError."""
    value = os.environ.get(ISOLATE_VARIABLE, "1").strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{ISOLATE_VARIABLE}={value!r}: expected 1 (each implementation under test in "
                          "a worker process of its own, the default) or 0 (in the calling process)")
    return value == "1"


def isolated(impl: Implementation, recipe: Callable[[], Implementation]) -> Implementation:
    """`impl`, to be run in a worker process where `recipe()` (picklable) builds it again; `impl`
    as it is where KDTREE_ISOLATE=0."""
    return replace(impl, worker=recipe) if isolation_on() else impl


def _cause(exitcode: int | None) -> str:
    if exitcode is None:
        return "it stopped answering"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
        except ValueError:
            return f"killed by signal {-exitcode}"
        described = signal.strsignal(sig)
        return f"killed by {sig.name}" + (f" ({described})" if described else "")
    return f"it exited with status {exitcode}" + (" (os._exit or exit() from C)" if exitcode == 0 else "")


class _Worker:
    """One worker process serving one implementation (kdtr.impl.worker.main), and the pipes to it.

    A plain child process (`python -c`), not multiprocessing's spawn: that runs the caller's main
    module again in the child, which breaks a script without a `__main__` guard. The child gets
    this process's sys.path, environment and working directory, and the recipe as its first
    message. Large arrays travel both ways through its carry folder (kdtr.impl.carry), which this
    side empties after every exchange and removes when the worker ends."""

    def __init__(self, recipe: Callable[[], Implementation], label: str):
        self.folder = CarryFolder()
        theirs_in, ours_out = os.pipe()          # requests: we write, it reads
        ours_in, theirs_out = os.pipe()          # replies: it writes, we read
        code = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
                "from kdtr.impl.worker import main; main(*map(int, sys.argv[2:5]), sys.argv[5])")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(sys.path), str(theirs_in), str(theirs_out),
                 str(os.getpid()), self.folder.path], pass_fds=(theirs_in, theirs_out), stdin=subprocess.DEVNULL)
        except BaseException:
            self.folder.remove()
            raise
        finally:
            os.close(theirs_in)
            os.close(theirs_out)
        self.label = label
        self.requests = Connection(ours_out, readable=False)
        self.replies = Connection(ours_in, writable=False)
        self.carrier = Carrier(self.folder.path)
        self.token = 0                       # the call it keeps (WorkerCall): the last case's
        self.carrier.send(self.requests, recipe)

    def ask(self, request: Any, limit_s: float | None = None) -> Any:
        """Send `request`, return the reply. _Died when the worker ends meanwhile, _NoAnswer (it is
        killed) when `limit_s` passes first; on any other way out (Ctrl-C) it is stopped. Either
        way no array file of the exchange is left in its carry folder."""
        try:
            try:
                self.carrier.send(self.requests, request)
            except (OSError, EOFError):
                raise _Died(self._ended()) from None
            if limit_s is not None and self.carrier.inlined:    # the folder was full: both ways by pipe
                limit_s += 2 * self.carrier.inlined / PIPE_BYTES_PER_S
            if wait([self.replies], timeout=limit_s):
                try:
                    return self.carrier.recv(self.replies)
                except (OSError, EOFError):       # its end of the pipe closed: it is gone
                    raise _Died(self._ended()) from None
            self.stop()
            raise _NoAnswer()
        except (_Died, _NoAnswer):
            raise
        except BaseException:
            self.stop()                    # a reply may still come: this pipe is not to be read again
            raise
        finally:
            self.folder.clear()

    def _ended(self) -> str:
        try:
            code = self.process.wait(JOIN_S)
        except subprocess.TimeoutExpired:
            self.stop()
            code = None
        self._close()
        return _cause(code)

    def alive(self) -> bool:
        return self.process.poll() is None and not self.replies.closed

    def stop(self) -> None:
        """End the worker now (SIGKILL: it may be stuck where nothing else reaches it)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._close()

    def _close(self) -> None:
        for conn in (self.requests, self.replies):
            if not conn.closed:
                conn.close()
        self.folder.remove()                 # it has ended: nothing writes there any more


_WORKERS: dict[bytes, _Worker] = {}        # recipe (pickled) -> its worker
_UNLOADABLE: dict[bytes, str] = {}          # recipes that failed in a worker: why (not tried again)


def _worker_for(impl: Implementation) -> _Worker | str:
    """`impl`'s worker (started where none is alive), or why its recipe cannot be built in one."""
    key = pickle.dumps(impl.worker)
    if key in _UNLOADABLE:
        return _UNLOADABLE[key]
    worker = _WORKERS.get(key)
    if worker is not None and worker.alive():
        return worker
    worker = _Worker(impl.worker, impl.name)
    try:
        why = worker.ask(("ready",))
    except _Died as died:
        why = f"its worker process died as it started: {died}"
    if why is not None:
        worker.stop()
        _UNLOADABLE[key] = why
        return why
    _WORKERS[key] = worker
    return worker


def _forget(worker: _Worker) -> None:
    """`worker` is stopped: the next case of its implementation starts another."""
    worker.stop()
    for key in [key for key, held in _WORKERS.items() if held is worker]:
        del _WORKERS[key]


@atexit.register
def stop_workers() -> None:
    """End every worker (at exit too; the next evaluation starts a fresh one)."""
    while _WORKERS:
        _WORKERS.popitem()[1].stop()
    _UNLOADABLE.clear()


def produce_in_worker(impl: Implementation, case: CaseData, expected: Mapping[str, np.ndarray] | None = None, *,
                      determinism: bool = False, timeout_s: float | None = None) -> Produced:
    """kdtr.impl.evaluation.produce, run in `impl`'s worker process (see the module docstring):
    a death or an unanswered timeout is the case's error with its cause, the worker started again
    for the next case; a prepared call comes back as a WorkerCall."""
    worker = _worker_for(impl)
    if isinstance(worker, str):
        return Produced(error=f"cannot be loaded in its worker process: {worker}", error_type="WorkerLoad")
    limit = None
    if timeout_s is not None:
        carried = sum(np.asarray(a).nbytes for a in case.inputs.values())
        limit = timeout_s * (2 if determinism else 1) + GRACE_S + carried / BYTES_PER_S
    request = ("produce", case.op.name, case.variant, dict(case.inputs), dict(case.params),
               None if expected is None else dict(expected), determinism, timeout_s)
    try:
        kind, payload, token, broken = worker.ask(request, limit)
    except _Died as died:
        _forget(worker)
        return Produced(error=f"its worker process died running this case: {died}", error_type="WorkerDied")
    except _NoAnswer:
        _forget(worker)
        return Produced(error=f"ran past the case timeout of {timeout_s:g} s and did not return "
                              "(its worker process was killed)", error_type="CaseTimeout")
    if broken:                              # its CUDA context is unusable: the next case gets a fresh one
        _forget(worker)
    if kind == "unavailable":
        raise ImplUnavailable(payload)
    if kind == "raise":
        raise KdtreeError(payload)          # not the case's own (no GPU, a bad configuration): as in-process
    worker.token = token
    return replace(payload, call=None if token is None else WorkerCall(worker, token))


@dataclass(frozen=True, eq=False)
class WorkerCall:
    """An isolated implementation's prepared call, kept in its worker (the Outcome's `call`) until
    it evaluates the next case. Bench does not call it: it times it there (`time_in_worker`)."""

    worker: _Worker
    token: int

    def _ask(self, request: tuple) -> Any:
        if self.worker.token != self.token or not self.worker.alive():
            raise WorkerFailure("its worker process no longer holds this call (it ran another case, or died)")
        try:
            kind, payload = self.worker.ask(request)
        except _Died as died:
            raise WorkerDied(f"its worker process died: {died}") from None
        if kind == "error":
            raise WorkerFailure(payload)
        return payload

    def time_in_worker(self, timer: Any, **prepare: Any) -> tuple[Any, int, str]:
        """`kdtr.impl.rotation.prepare_sets(timer, ..., **prepare)` done in the worker, by a timer of
        the same class (CUDA events: with the same L2 size; a host clock), on the call it prepared
        and the input sets its prepare makes there: the Sampler that comes back takes its samples
        there, with the collector off meanwhile (as `interleave` has it here). Returns the Sampler,
        how many input sets it rotates through and why they fall short of `sets` ("" where they
        do not)."""
        request = ("time", self.token, type(timer), getattr(timer, "l2_bytes", None), prepare)
        sampler, made, short = self._ask(request)
        return replace(sampler, take=self._take, keepalive=(self,)), made, short

    def _take(self, n: int) -> list[float]:
        return self._ask(("take", self.token, n))
