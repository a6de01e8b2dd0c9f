"""Bench as a library: a `Selection` of suites and bundles -> `run_bench` -> one `BenchRecord`.

`run_bench` does everything `kdtree bench` does but parse options and render: it collects the cases
(YAML suites and .kdtr bundles, -k, --quick's first cases of each suite, the shard), keeps those of
the kernels forced by name, refuses a case over the memory bound, and times them in this process
(`bench_items`) or spreads them over `devices` (one spawned worker per GPU, cases balanced by
estimated cost; the workers' records merged, a worker that crashes failing its cases in the
record's errors). Every record it returns carries the shard and the digest of the whole selection,
which `report --merge` checks shards by."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from ..bundle.memory import check_items
from ..errors import UsageError
from ..impl.backends import resolve_backend
from ..scaleout import parallel
from ..scaleout.parallel import Shard
from .cases import BenchItem, collect_items, estimated_cost, items_for_kernels, selection_meta
from .record import BenchRecord, merge_records
from .runner import bench_items
from .settings import BenchSettings, Progress


def item_key(item: BenchItem) -> str:
    """"op/case": the key a shard owns a case by (as verify's bundles)."""
    return f"{item.op}/{item.name}"


@dataclass(frozen=True)
class Selection:
    """What to bench: YAML suites, folders of them and .kdtr bundles (`paths`), the cases whose name
    matches `pattern` (-k), this job's `shard` (None: all), and the GPUs to spread them over
    (`devices`, as kdtr.scaleout.parallel.parse_devices gives them; None: this process)."""

    paths: tuple[Path, ...]
    pattern: str | None = None
    shard: Shard | None = None
    devices: tuple[str, ...] | None = None

    def items(self, quick: bool = False) -> tuple[list[BenchItem], dict[str, str]]:
        """This shard's cases (with `quick`, the first of each suite) and the meta that lets
        `report --merge` check that shards join; UsageError when none is selected."""
        selected = collect_items(self.paths, self.pattern, quick)
        items = parallel.shard_items(selected, item_key, self.shard)
        if not items:
            raise UsageError(f"no case matches -k {self.pattern!r}" if self.pattern else "no cases to bench")
        return items, selection_meta(selected, self.shard)


def run_bench(selection: Selection, settings: BenchSettings = BenchSettings(), progress: Progress | None = None, *,
              mem_limit: int | None = None,
              on_partial: Callable[[BenchRecord], None] | None = None) -> BenchRecord:
    """Bench a selection under `settings`: the record of every case (see bench_items), with the
    selection's shard and digest in its meta. `progress(what, done, total)` follows the cases (with
    devices: the workers); `on_partial(record)` gets the record so far after every case (in this
    process only). Up front, before any case runs: UsageError for forced kernels without the cuda
    backend or a case over `mem_limit` bytes, DeviceError for the cuda backend without a GPU (one
    line, not one per worker or case)."""
    settings.timing.check()
    backend = resolve_backend(settings.backend)
    if settings.kernels and backend != "cuda":
        raise UsageError(f"--kernel and --define force CUDA kernels; they need the cuda backend, not {backend}")
    if backend == "cuda":
        from ..runtime.device import require_gpu

        require_gpu()
    items, meta = selection.items(settings.quick)
    items = items_for_kernels(items, settings.kernels)
    check_items(items, backend, mem_limit)

    def stamped(record: BenchRecord) -> BenchRecord:
        return replace(record, meta=record.meta | meta)

    if selection.devices:
        return stamped(_on_devices(list(selection.devices), items, settings, progress))
    partial = None if on_partial is None else (lambda record: on_partial(stamped(record)))
    return stamped(bench_items(items, settings, progress=progress, on_partial=partial))


@dataclass(frozen=True)
class WorkerJob:
    """What a bench worker process receives: its share of the cases (plain data) and the settings."""

    items: tuple[BenchItem, ...]
    settings: BenchSettings

    @property
    def names(self) -> tuple[str, ...]:
        """"op/case" keys of this worker's share."""
        return tuple(map(item_key, self.items))


def run_worker(job: WorkerJob) -> BenchRecord:
    """One worker: its share of the cases on the GPU it was pinned to, with its own ceilings."""
    return bench_items(list(job.items), job.settings)


def _on_devices(devices: list[str], items: Sequence[BenchItem], settings: BenchSettings,
                progress: Progress | None) -> BenchRecord:
    """One spawned worker per GPU, cases spread by size; the records merge into one. A worker that
    crashes fails its cases (listed in the record's errors), never the whole run silently."""
    groups = parallel.balance(items, estimated_cost, len(devices))
    jobs = [[WorkerJob(tuple(group), settings)] for group in groups]
    records, crashed = [], []
    for job, result in parallel.map_on_devices(devices, jobs, run_worker, lambda job, why: why):
        if isinstance(result, str):
            crashed.append(f"{result}: its cases {', '.join(job.names)} were not timed")
        else:
            records.append(result)
        if progress is not None:
            finished = len(records) + len(crashed)
            progress(f"worker done ({finished}/{len(devices)})", finished, len(devices))
    if not records:
        raise UsageError("every bench worker crashed: " + "; ".join(crashed))
    merged = merge_records(records)
    return replace(merged, errors=merged.errors + tuple(crashed), complete=merged.complete and not crashed)


def unmatched_baselines(named: Sequence[str], record: BenchRecord) -> tuple[list[str], list[str]]:
    """The baselines named (--baseline) that no case of the record has (a typo, another op's), and
    those it has: the ops' baselines are known only once a case's inputs exist, so this is checked
    after the run."""
    timed = sorted({r.impl for r in record.rows if not r.primary})
    return [name for name in dict.fromkeys(named) if name not in timed], timed
