"""`report --compare-gpus`: the same cases of bench records from different GPUs side by side, each
figure a share of its own GPU's ceilings measured in its own run (kdtr/gpus.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..bench import BenchRecord, BenchRow
from ..bench.ceilings import Ceilings
from ..bench.record import with_figures
from ..errors import UsageError
from ..runtime.gpu_identity import GpuIdentity, record_gpu


@dataclass(frozen=True)
class GpuFigure:
    """One record's figures for one case: the time, the throughput on the case's binding resource
    (TFLOP/s or GB/s, the one the first record's row is nearer its ceiling on) and its share of
    this GPU's own measured ceiling; `speed` = the first record's time / this one's."""

    median_ms: float
    throughput: float | None
    share: float | None
    speed: float | None


@dataclass(frozen=True)
class GpuComparisonRow:
    op: str
    variant: str
    case: str
    impl: str
    mode: str
    config: dict
    unit: str                                 # "TFLOP/s" or "GB/s"
    figures: tuple[GpuFigure | None, ...]     # one per record; None where that record lacks the case


@dataclass(frozen=True)
class GpuComparison:
    labels: tuple[str, ...]
    gpus: tuple[GpuIdentity, ...]
    rows: tuple[GpuComparisonRow, ...]
    unmatched: tuple[int, ...]                # per record: its timed rows not in the comparison


def _ceilings(gpu: GpuIdentity) -> Ceilings:
    return Ceilings(l2_bytes=0, **dict(gpu.ceilings or {}))


def _checked(records: Sequence[BenchRecord], labels: Sequence[str]) -> tuple[GpuIdentity, ...]:
    if len(records) < 2:
        raise UsageError("--compare-gpus needs two or more bench records")
    gpus = []
    for record, label in zip(records, labels):
        gpu = record_gpu(record.meta, record.ceilings)
        if gpu.host or not record.settings.get("gpu", True) or any(r.mode == "host" for r in record.rows):
            raise UsageError(f"{label}: timed on the host CPU (perf_counter, no ceilings); --compare-gpus "
                             "compares GPU records only")
        if not gpu.ceilings:
            raise UsageError(f"{label}: the record holds no measured ceilings ({gpu.model}); "
                             "re-run the bench without --no-sanity")
        gpus.append(gpu)
    return tuple(gpus)


def _timed(record: BenchRecord, gpu: GpuIdentity) -> dict[tuple, BenchRow]:
    """Rows with a time, by their match key, figures recomputed against this GPU's own ceilings."""
    ceilings = _ceilings(gpu)
    return {row.key: with_figures(row, ceilings) for row in record.rows
            if row.timing is not None and row.timing.median > 0}


def _unit(row: BenchRow) -> str:
    compute, bandwidth = row.pct_compute or 0.0, row.pct_bandwidth or 0.0
    return "TFLOP/s" if compute > bandwidth else "GB/s"


def _figure(row: BenchRow | None, unit: str, first_ms: float) -> GpuFigure | None:
    if row is None:
        return None
    compute = unit == "TFLOP/s"
    return GpuFigure(median_ms=row.timing.median, throughput=row.tflops if compute else row.gbps,
                     share=row.pct_compute if compute else row.pct_bandwidth,
                     speed=first_ms / row.timing.median)


def compare_gpus(records: Sequence[BenchRecord], labels: Sequence[str]) -> GpuComparison:
    """Cases matched on op, variant, case name, implementation, mode and every parameter (BenchRow.key)
    that the first record and at least one other timed; UsageError for a host-timed record."""
    gpus = _checked(records, labels)
    tables = [_timed(record, gpu) for record, gpu in zip(records, gpus)]
    rows, compared = [], set()
    for key, first in tables[0].items():
        others = [table.get(key) for table in tables[1:]]
        if not any(others):
            continue
        compared.add(key)
        unit = _unit(first)
        rows.append(GpuComparisonRow(
            op=first.op, variant=first.variant, case=first.case, impl=first.impl, mode=first.mode,
            config=dict(first.config), unit=unit,
            figures=tuple(_figure(row, unit, first.timing.median) for row in (first, *others))))
    unmatched = tuple(len(table.keys() - compared) for table in tables)
    return GpuComparison(labels=tuple(labels), gpus=gpus, rows=tuple(rows), unmatched=unmatched)
