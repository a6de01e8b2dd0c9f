"""Scale-out without a cluster: deterministic shards for CI matrices, one worker process per GPU."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Callable, Sequence, TypeVar

from .errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """`--shard I/N`, 1-based: job I of N takes the items whose name hashes to I."""

    index: int
    count: int

    @staticmethod
    def parse(text: str) -> "Shard":
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise UsageError(f"--shard {text!r}: expected I/N with integers, e.g. 2/4") from None
        if not 1 <= index <= count:
            raise UsageError(f"--shard {text!r}: need 1 <= I <= N")
        return Shard(index, count)

    def owns(self, key: str) -> bool:
        """crc32 of the key: stable across machines, Python versions and suite order."""
        return zlib.crc32(key.encode("utf-8")) % self.count == self.index - 1


def shard_items(items: Sequence[T], key: Callable[[T], str], shard: Shard | None) -> list[T]:
    return list(items) if shard is None else [item for item in items if shard.owns(key(item))]


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
