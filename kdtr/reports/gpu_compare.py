"""`report --compare-gpus`: the same cases of bench records from different GPUs side by side, each
figure a share of its own GPU's ceilings measured in its own run (kdtr/gpus.py)."""

from __future__ import annotations

import math
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


def _timed(record: BenchRecord, gpu: GpuIdentity, label: str) -> dict[tuple, BenchRow]:
    """Rows with a time, by their match key, figures recomputed against this GPU's own ceilings.
    UsageError naming the record and the row for a time that is not a positive number (a median of
    0 s, negative or NaN matches nothing) and for a case the record holds twice (which would it be?)."""
    ceilings = _ceilings(gpu)
    timed: dict[tuple, BenchRow] = {}
    first_index: dict[tuple, int] = {}
    for index, row in enumerate(record.rows):
        if row.timing is None:
            continue
        median = row.timing.median
        if isinstance(median, bool) or not isinstance(median, (int, float)) or not 0 < median < math.inf:
            raise UsageError(f"{median!r} is not a time (a positive number of ms): --compare-gpus cannot match "
                             f"case {row.op}/{row.variant} {row.case} ({row.impl}, {row.mode})",
                             file=label, field=f"rows[{index}].timing.median")
        if row.key in timed:
            raise UsageError(f"rows[{first_index[row.key]}] and rows[{index}] are the same case ({row.op}/"
                             f"{row.variant} {row.case}, {row.impl}, {row.mode}, the same parameters): a record "
                             "holds each case once; --compare-gpus refuses to pick one", file=label)
        first_index[row.key] = index
        timed[row.key] = with_figures(row, ceilings)
    return timed


def _nothing_shared(tables: Sequence[dict[tuple, BenchRow]], labels: Sequence[str]) -> str:
    """Why the first record shares no timed case with any other: what its rows and theirs differ in."""
    if not tables[0]:
        return f"{labels[0]} holds no timed row"
    names = {(row.op, row.variant, row.case) for row in tables[0].values()}
    causes = []
    for table, label in zip(tables[1:], labels[1:]):
        if not table:
            causes.append(f"{label} holds no timed row")
            continue
        same_names = sum((row.op, row.variant, row.case) in names for row in table.values())
        causes.append(f"{label}: {same_names} of its {len(table)} timed rows name a case of {labels[0]} but differ "
                      "in implementation, mode or parameters" if same_names else
                      f"{label}: none of its {len(table)} timed rows names a case of {labels[0]}")
    return (f"no case to compare: a case matches on op, variant, case name, implementation, mode and every "
            f"parameter, and {labels[0]}'s {len(tables[0])} timed rows match none of the others' ("
            + "; ".join(causes) + ")")


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
    that the first record and at least one other timed. UsageError for a host-timed record, a row
    timed twice or with a time that is not one, and records that share no case (saying why)."""
    gpus = _checked(records, labels)
    tables = [_timed(record, gpu, label) for record, gpu, label in zip(records, gpus, labels)]
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
    if not rows:
        raise UsageError(_nothing_shared(tables, labels))
    unmatched = tuple(len(table.keys() - compared) for table in tables)
    return GpuComparison(labels=tuple(labels), gpus=gpus, rows=tuple(rows), unmatched=unmatched)
