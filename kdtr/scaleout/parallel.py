"""Scale-out without a cluster: deterministic shards for CI matrices, one worker process per GPU."""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
import zlib
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import active_children, get_context
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from ..errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """`--shard I/N`, 1-based: job I of N takes the items whose name hashes to I; with `costs`
    (`--balance-from`: seconds per key), the items a longest-first split by those times gives it."""

    index: int
    count: int
    costs: Mapping[str, float] | None = field(default=None, compare=False, repr=False)
    split: str = ""         # with costs: a digest of them, so a merge can tell shards of one split

    @staticmethod
    def parse(text: str) -> "Shard":
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise UsageError(f"--shard {text!r}: expected I/N with integers, e.g. 2/4") from None
        if not 1 <= index <= count:
            raise UsageError(f"--shard {text!r}: need 1 <= I <= N")
        return Shard(index, count)

    @staticmethod
    def label(shard: "Shard | None") -> str:
        """The shard as a record names it, "I/N" ("I/N@DIGEST" when split by case times); a run
        without --shard is "1/1"."""
        if shard is None:
            return "1/1"
        return f"{shard.index}/{shard.count}" + (f"@{shard.split}" if shard.split else "")

    def owns(self, key: str) -> bool:
        """crc32 of the key: stable across machines, Python versions and suite order."""
        return zlib.crc32(key.encode("utf-8")) % self.count == self.index - 1


def shard_items(items: Sequence[T], key: Callable[[T], str], shard: Shard | None) -> list[T]:
    if shard is None:
        return list(items)
    if shard.costs is None:
        return [item for item in items if shard.owns(key(item))]
    owners = balanced_owners([key(item) for item in items], shard.costs, shard.count)
    return [item for item in items if owners[key(item)] == shard.index - 1]


def balanced_owners(keys: Sequence[str], costs: Mapping[str, float], count: int) -> dict[str, int]:
    """key -> 0-based shard: longest first onto the least loaded shard (ties: the lower shard;
    equal times: by name), so every job of a run computes the same split from the same record. A
    key the record lacks counts the median of the record's times."""
    fill = statistics.median(costs.values())
    bins = balance(sorted(set(keys)), lambda key: costs.get(key, fill), count)
    return {key: index for index, group in enumerate(bins) for key in group}


def parse_devices(text: str | None, available: int) -> list[str] | None:
    """`all` -> every visible GPU; `0,2` -> those indices; None -> no workers (run in-process)."""
    if text is None:
        return None
    if text == "all":
        if available < 1:
            raise UsageError("--devices all: no GPU is visible here")
        return [str(i) for i in range(available)]
    try:
        devices = [str(int(part)) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--devices {text!r}: expected 'all' or comma-separated indices like 0,1") from None
    if len(set(devices)) != len(devices) or any(int(d) < 0 for d in devices):
        raise UsageError(f"--devices {text!r}: indices must be distinct and >= 0")
    if available and any(int(d) >= available for d in devices):
        raise UsageError(f"--devices {text!r}: only {available} GPU(s) visible")
    return devices


def balance(items: Sequence[T], cost: Callable[[T], float], bins: int) -> list[list[T]]:
    """Longest-processing-time first: the costliest item goes to the least loaded bin."""
    loads = [0.0] * bins
    out: list[list[T]] = [[] for _ in range(bins)]
    for item in sorted(items, key=cost, reverse=True):
        target = loads.index(min(loads))
        out[target].append(item)
        loads[target] += cost(item)
    return out


def _pin(device: str) -> None:
    """Worker initializer: runs before anything in the worker touches CUDA."""
    os.environ["CUDA_VISIBLE_DEVICES"] = device


def map_on_devices(devices: list[str], groups: list[list[T]], work: Callable[[T], object],
                   on_crash: Callable[[T, str], object]):
    """Run `work(item)` for each group in its own spawned process pinned to one device; yields
    (item, result) as results arrive. A crashed worker yields `on_crash(item, reason)` for each of
    its unfinished items: its cases fail, the run goes on and says why."""
    context = get_context("spawn")
    pools = [ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_pin, initargs=(device,))
             for device in devices]
    try:
        futures = {pool.submit(work, item): (device, item)
                   for device, pool, group in zip(devices, pools, groups) for item in group}
        for future in as_completed(futures):
            device, item = futures[future]
            try:
                yield item, future.result()
            except BrokenProcessPool:
                yield item, on_crash(item, f"the worker on device {device} crashed")
    finally:
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# The thread pools of BLAS and OpenMP, read once when numpy (or torch) loads them: a worker sets
# them before its first import of numpy, so that workers x threads stays within the cores.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
_PR_SET_PDEATHSIG = 1                  # linux/prctl.h
_PARENT_POLL_S = 0.5


class _ParentGone(BaseException):
    """Raised in a worker's work when its parent is gone (or terminates it): the work unwinds, so
    an atomic writer removes its temp file, and the worker exits (kdtr.scaleout.parallel._call)."""


def _unwind(signum, frame) -> None:
    signal.signal(signal.SIGTERM, _exit_now)      # a second SIGTERM (the pool's, then the kernel's)
    raise _ParentGone                             # ends the worker at once, wherever it lands


def _exit_now(signum, frame) -> None:
    os._exit(128 + signum)


def die_with_parent(parent: int) -> None:
    """In a worker process: Ctrl-C reaches the whole process group, the parent alone handles it;
    SIGTERM ends the worker; the worker dies with the parent that spawned it (a SIGKILLed parent
    cannot terminate it: on Linux the kernel sends SIGTERM at the death of the parent's thread that
    started it, which for bounded_map is its caller's; elsewhere a thread watches the parent's pid)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_now)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:                # it died before the line above
            os._exit(128 + signal.SIGTERM)
    elif hasattr(os, "getppid"):
        import threading

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(_PARENT_POLL_S)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="kdtr-parent-watch", daemon=True).start()


def _worker_start(parent: int, threads: int) -> None:
    """Worker initializer: it dies with its parent (die_with_parent), and its BLAS/OpenMP pools get
    `threads` threads at most."""
    die_with_parent(parent)
    for name in THREAD_VARIABLES:
        given = os.environ.get(name, "")
        if not (given.isdigit() and 0 < int(given) <= threads):
            os.environ[name] = str(threads)


def _call(work: Callable[[T], object], item: T) -> object:
    """`work(item)` in a worker; a SIGTERM meanwhile (the parent died, or terminates it) unwinds
    the work, so that its temp files are removed, and ends the worker."""
    try:                    # the handler is installed and restored inside: a SIGTERM at any point
        previous = signal.signal(signal.SIGTERM, _unwind)      # exits quietly, never a traceback
        try:
            return work(item)
        finally:
            signal.signal(signal.SIGTERM, previous)
    except _ParentGone:
        os._exit(128 + signal.SIGTERM)


def worker_threads(workers: int) -> int:
    """BLAS/OpenMP threads per worker process: `workers` of them share the cores (at least one each)."""
    return max(1, cpu_count() // max(1, workers))


def bounded_map(work: Callable[[T], object], items: Sequence[T], *, jobs: int,
                cost: Callable[[T], float] | None = None, budget: float | None = None) -> Iterator[object]:
    """`work(item)` for each item in spawned worker processes, results yielded in input order: at
    most `jobs` at once and, with `budget`, never more at once than the sum of their `cost`s fits
    (an item over the budget alone runs by itself). An exception from `work` is raised here, in its
    item's turn. On any exit before the end (an error, Ctrl-C, the caller stopping) the workers
    are terminated first: nothing runs on behind the caller's back; a parent killed outright takes
    its workers with it (_worker_start), and the workers' BLAS threads share the cores."""
    jobs = max(1, jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_worker_start,
                               initargs=(os.getpid(), worker_threads(min(jobs, len(items)))))
    pending = deque(enumerate(items))
    running: dict = {}
    finished: dict = {}
    load, turn = 0.0, 0
    try:
        while pending or running:
            while pending and len(running) < jobs:
                index, item = pending[0]
                weight = float(cost(item) or 0) if cost is not None else 0.0
                if running and budget is not None and load + weight > budget:
                    break
                pending.popleft()
                running[pool.submit(_call, work, item)] = (index, weight)
                load += weight
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                index, weight = running.pop(future)
                load -= weight
                finished[index] = future
            while turn in finished:
                yield finished.pop(turn).result()
                turn += 1
    except BaseException:
        for child in active_children():
            child.terminate()
        for child in active_children():
            child.join()
        raise
    finally:
        pool.shutdown(wait=not running, cancel_futures=True)


def threaded_map(work: Callable[[T], object], items: Iterable[T], *, window: int) -> Iterator[object]:
    """`work(item)` for each item, results yielded in input order, up to `window` items' work at once
    in threads (for work that releases the GIL, like numpy's random draws): never more than `window`
    results alive, the one the caller holds included, where the caller drops each before asking for
    the next. `window` 1 runs each item in turn in the calling thread, as `map` would. An exception
    from `work` is raised here in its item's turn (the items before it were all yielded); on any exit
    before the end the work not started is cancelled and the work running is waited for (a thread
    cannot be stopped), so none goes on behind the caller's back."""
    if window <= 1:
        yield from map(work, items)
        return
    pending = iter(items)
    queued: deque = deque()
    pool = ThreadPoolExecutor(max_workers=window, thread_name_prefix="kdtr-threaded-map")
    try:
        while True:
            for item in pending:
                queued.append(pool.submit(work, item))
                if len(queued) >= window:
                    break
            if not queued:
                return
            yield queued.popleft().result()     # no copy kept here: the caller's is the only one
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
