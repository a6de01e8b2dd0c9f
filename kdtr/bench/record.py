"""Bench records: frozen rows and records, their JSON (with a samples sidecar) and CSV."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import sys
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from ..records.record import BENCH_KIND, Record
from .ceilings import Ceilings
from .plan import TimingPlan, same_method
from .settings import FLAG_LIMIT, BenchSettings
from .stats import Timing, _fields, _num

BENCH_FORMAT = 1
RECORD_KIND = BENCH_KIND


@dataclass(frozen=True)
class BenchRow:
    """One implementation of one case in one mode."""

    case: str
    op: str
    variant: str
    config: dict[str, Any]
    impl: str                      # "cuda" (our kernel), "torch" (the torch backend) or a baseline name
    mode: str                      # requested: hot | cold | host
    primary: bool                  # the implementation under test; speedups are quoted for it
    timing: Timing | None          # None: not timed (skipped, failed or its check failed)
    flops: float
    bytes: float
    tflops: float | None = None
    gbps: float | None = None
    pct_compute: float | None = None     # of the measured ceiling of `compute_unit`
    pct_bandwidth: float | None = None   # of the measured HBM bandwidth
    flagged: bool = False                # a figure above 100% of its ceiling: a measurement error
    check_passed: bool | None = None     # outputs on the timed inputs vs the reference
    check: str | None = None             # what was compared, or why it failed
    skip: str | None = None              # why it was not timed
    speedups: dict[str, float] = field(default_factory=dict)    # baseline -> its median / ours
    compute_unit: str = "bf16_mma"
    repeat: Timing | None = None         # a second timing of the same calls, interleaved with the first
    repeat_agrees: bool | None = None
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    setup_s: float | None = None         # wall seconds of its check, compile, capture and calibration
    kernel: str | None = None            # a kernel forced by name (--kernel, --define); impl is its label
    defines: dict[str, str] = field(default_factory=dict)   # the compile-time defines of a knob build
    alone: Timing | None = None          # back to back: the same calls timed alone, after the rounds

    def to_plain(self) -> dict[str, Any]:
        """Every field; `alone` only where it was timed (so records from before it read the same)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.alone is None:
            del out["alone"]
        return out

    @property
    def headline(self) -> Timing | None:
        """The figure a table quotes: the slower of the interleaved and the back-to-back timing."""
        return slower(self.timing, self.alone)

    @property
    def key(self) -> tuple:
        """What matches a row between two records: case, op, variant, impl, mode and every parameter."""
        return (self.op, self.variant, self.case, self.impl, self.mode,
                json.dumps(self.config, sort_keys=True, default=str), json.dumps(self.params, sort_keys=True, default=str))

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "BenchRow":
        values = _fields(BenchRow, d)
        for name in ("timing", "repeat", "alone"):
            values[name] = Timing.from_plain(d[name]) if d.get(name) else None
        for name in ("flops", "bytes", "tflops", "gbps", "pct_compute", "pct_bandwidth", "setup_s"):
            if values.get(name) is not None:
                values[name] = _num(values[name])
        values["speedups"] = {k: _num(v) for k, v in (d.get("speedups") or {}).items()}
        return BenchRow(**values)


@dataclass(frozen=True)
class BenchRecord(Record):
    """What `bench --json` writes: meta, settings, ceilings, sanity and case rows, errors, the cases
    a time limit left out; `bench_format` is the layout of its rows."""

    KIND: ClassVar[str] = RECORD_KIND
    LABEL: ClassVar[str] = "bench"
    meta: dict[str, Any]
    settings: dict[str, Any]
    ceilings: Ceilings | None
    sanity: tuple[BenchRow, ...]
    rows: tuple[BenchRow, ...]
    errors: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()        # cases left out by the run's time limit
    complete: bool = True
    case_seconds: dict[str, float] = field(default_factory=dict)   # "op/variant case" -> wall seconds
    # "op/variant case" -> mode -> how every row of it was timed (kdtr/bench/plan.py), said once a case
    timing_plans: dict[str, dict[str, dict]] = field(default_factory=dict)
    kind: str = RECORD_KIND
    bench_format: int = BENCH_FORMAT

    @property
    def primary(self) -> str:
        return str(self.settings.get("primary", "cuda"))

    @classmethod
    def load(cls, path: str | Path) -> "BenchRecord":
        """`load_record`: the record with its samples sidecar."""
        return load_record(path)

    @staticmethod
    def from_plain(d: Mapping[str, Any], file: str | Path | None = None) -> "BenchRecord":
        BenchRecord.check_kind(d, file)
        if d.get("bench_format") != BENCH_FORMAT:
            raise UsageError(f"bench record format {d.get('bench_format')!r}; this kdtree reads {BENCH_FORMAT}")
        return BenchRecord(
            meta=dict(d.get("meta") or {}), settings=dict(d.get("settings") or {}),
            ceilings=Ceilings.from_plain(d["ceilings"]) if d.get("ceilings") else None,
            sanity=tuple(BenchRow.from_plain(r) for r in d.get("sanity") or ()),
            rows=tuple(BenchRow.from_plain(r) for r in d.get("rows") or ()),
            errors=tuple(d.get("errors") or ()), not_run=tuple(d.get("not_run") or ()),
            complete=bool(d.get("complete", True)),
            case_seconds={str(k): _num(v) for k, v in (d.get("case_seconds") or {}).items()},
            timing_plans={str(k): {str(m): TimingPlan.from_plain(p).to_plain() for m, p in v.items()}
                          for k, v in (d.get("timing_plans") or {}).items()})


def load_record(path: str | Path) -> BenchRecord:
    """A bench record from JSON, its raw samples from the sidecar the JSON names (without the
    sidecar every Timing keeps its summary and no samples); UsageError (exit 2) naming the file
    when it is not one. Records with their samples inline (before the sidecar) load as they are."""
    path = Path(path)
    data = BenchRecord.read_json(path)
    try:
        if isinstance(data, dict) and data.get("samples_file") is not None:
            _restore_samples(data, path)
        return BenchRecord.from_plain(data)
    except UsageError as err:
        raise UsageError(err.message, file=err.file or path, field=err.field) from None
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise UsageError(f"malformed bench record: {type(err).__name__}: {err}", file=path) from None


def _timing_slots(data: Mapping[str, Any]) -> Iterator[tuple[str, dict]]:
    """(sidecar key, plain Timing) for every Timing of a plain record: the ceilings', then every
    sanity and case row's timing and repeat."""
    for name, timing in ((data.get("ceilings") or {}).get("timings") or {}).items():
        yield f"ceilings.{name}", timing
    for group in ("sanity", "rows"):
        for i, row in enumerate(data.get(group) or ()):
            for slot in ("timing", "repeat", "alone"):
                if row.get(slot):
                    yield f"{group}.{i}.{slot}", row[slot]


# The raw series of a Timing that live in the sidecar, each with the summary field that counts it:
# the samples, and the rounds' medians (64 full-precision floats a Timing at the round cap).
RAW_SERIES = {"samples_ms": "n", "round_medians": "rounds"}


def samples_path(path: str | Path) -> Path:
    """The sidecar beside a record: bench.json -> bench.samples.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}.samples.npz")


def _restore_samples(data: dict, path: Path) -> None:
    name = data["samples_file"]
    if not isinstance(name, str) or Path(name).name != name or not name:
        raise UsageError(f"samples_file must name a file beside the record, got {name!r}")
    sidecar = path.with_name(name)
    try:
        blob = sidecar.read_bytes()
    except FileNotFoundError:
        return                              # summaries only: report, compare, CSV and plots need no more
    except OSError as err:
        raise UsageError(f"cannot read the samples sidecar: {err.strerror or err}", file=sidecar) from None
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as arrays:
            samples = {key: arrays[key] for key in arrays.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise UsageError(f"not a samples sidecar (.npz): {err}", file=sidecar) from None
    for key, timing in _timing_slots(data):
        for series, count in RAW_SERIES.items():
            values = samples.pop(f"{key}.{series}", None)
            # size 0: a timing loaded without its samples and written again
            if values is None or values.ndim != 1 or values.dtype != np.float64 \
                    or values.size not in (0, timing.get(count)):
                raise UsageError(f"the {series} of {key} do not match the record's {count} = {timing.get(count)} "
                                 "(a sidecar of another run?)", file=sidecar)
            timing[series] = values.tolist()
    if samples:
        raise UsageError(f"samples of timings the record lacks: {', '.join(sorted(samples))} "
                         "(a sidecar of another run?)", file=sidecar)


def slower(timing: Timing | None, alone: Timing | None) -> Timing | None:
    """The timing with the larger median (the interleaved one where there is no other)."""
    if timing is None or alone is None:
        return timing
    return alone if alone.median > timing.median else timing


def with_figures(row: BenchRow, ceilings: Ceilings | None) -> BenchRow:
    """Achieved TFLOP/s and GB/s from the cost model (at the headline figure, the slower of the
    interleaved and back-to-back timings), as fractions of the ceilings; flagged > 100%."""
    if row.timing is None or row.headline.median <= 0:
        return row
    seconds = row.headline.median * 1e-3
    tflops = row.flops / seconds / 1e12 if row.flops > 0 else None
    gbps = row.bytes / seconds / 1e9 if row.bytes > 0 else None
    pct_compute = pct_bandwidth = None
    if ceilings is not None:
        if tflops is not None:
            pct_compute = tflops / ceilings.compute_tflops(row.compute_unit)
        if gbps is not None:
            pct_bandwidth = gbps / ceilings.bandwidth_gbps
    flagged = any(p is not None and p > FLAG_LIMIT for p in (pct_compute, pct_bandwidth))
    return replace(row, tflops=tflops, gbps=gbps, pct_compute=pct_compute, pct_bandwidth=pct_bandwidth,
                   flagged=flagged)


def with_speedups(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """Speedups of each primary row over the baselines of the same case and mode (both timed, both
    checked, both by one method): baseline headline / primary headline (`BenchRow.headline`). A
    baseline timed by another method than ours (eager beside a graph replay, another count of calls
    a sample, a flush beside rotated sets: `plan.same_method`) gets no speedup; its row's note says why. Where several kernels were forced by
    name, each one's speedup over the first of them (the reference point) joins its speedups the
    same way."""
    def usable(r: BenchRow) -> bool:
        return r.timing is not None and bool(r.check_passed) and r.timing.median > 0

    def ratio(other: BenchRow, row: BenchRow) -> float:
        return other.headline.median / row.headline.median

    out = []
    for row in rows:
        if row.primary and usable(row):
            group = [o for o in rows if o.case == row.case and o.mode == row.mode and usable(o)]
            speedups = {o.impl: ratio(o, row) for o in group
                        if not o.primary and same_method(o.timing, row.timing)}
            forced = [o for o in rows if o.case == row.case and o.mode == row.mode and o.kernel is not None]
            if (len(forced) > 1 and forced[0] is not row and usable(forced[0])
                    and same_method(forced[0].timing, row.timing)):
                speedups[forced[0].impl] = ratio(forced[0], row)
            row = replace(row, speedups=speedups)
        out.append(row)
    return out


TIME_LIMIT_SKIP = "the run's time limit was reached"


def _jsonable(value: Any) -> Any:
    from ..records.report import plain

    return json.loads(json.dumps(plain(value), allow_nan=False, default=str))


def bench_meta(command: str = "bench") -> dict[str, Any]:
    """record_meta plus the command line, its paths portable (`report.portable`) and the interpreter
    by its name, so a record names no folder of the machine it ran on."""
    from ..records.report import portable_argv, record_meta

    meta = record_meta(command)
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    meta["command_line"] = shlex.join([Path(argv[0]).name, *portable_argv(argv)[1:]])
    meta["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return meta


def settings_dict(settings: BenchSettings, env_primary: str, modes: Sequence[str], gpu: bool) -> dict[str, Any]:
    values = dataclasses.asdict(settings)
    values.update(primary=env_primary, modes=list(modes), gpu=gpu,
                  timer="CUDA events" if gpu else "host perf_counter (no GPU: degraded run)")
    return values


CSV_HEADER = ["case", "op", "variant", "config", "impl", "primary", "mode", "timing_mode", "method",
              "calls_per_sample", "median_us", "p10_us", "p90_us", "rel_std", "rel_ci", "n", "stop_reason",
              "flops", "bytes", "tflops", "gbps", "pct_compute", "pct_bandwidth", "compute_unit", "flagged",
              "check_passed", "skip", "repeat_median_us", "repeat_agrees", "rounds", "rel_ci_samples",
              "rel_ci_rounds", "repeat_rel_ci", "setup_s", "kernel", "defines"]


def csv_table(record: BenchRecord) -> tuple[list[str], list[list[Any]]]:
    """One line per row (sanity rows first); a speedup_vs_<baseline> column per baseline present."""
    rows = [*record.sanity, *record.rows]
    baselines = sorted({name for r in rows for name in r.speedups})
    header = CSV_HEADER + [f"speedup_vs_{b}" for b in baselines]

    def us(ms):
        return None if ms is None else round(ms * 1e3, 6)

    lines = []
    for r in rows:
        t = r.timing
        lines.append([r.case, r.op, r.variant, " ".join(f"{k}={v}" for k, v in r.config.items()), r.impl,
                      r.primary, r.mode, t.mode if t else "", t.method if t else "",
                      t.calls_per_sample if t else "", us(t.median) if t else "", us(t.p10) if t else "",
                      us(t.p90) if t else "", t.rel_std if t else "", t.rel_ci if t else "", t.n if t else "",
                      t.stop_reason if t else "", r.flops, r.bytes, _blank(r.tflops), _blank(r.gbps),
                      _blank(r.pct_compute), _blank(r.pct_bandwidth), r.compute_unit, r.flagged,
                      _blank(r.check_passed), r.skip or "", us(r.repeat.median) if r.repeat else "",
                      _blank(r.repeat_agrees), t.rounds if t else "", _blank(t.rel_ci_samples) if t else "",
                      _blank(t.rel_ci_rounds) if t else "", r.repeat.rel_ci if r.repeat else "",
                      _blank(r.setup_s), r.kernel or "", " ".join(f"{k}={v}" for k, v in r.defines.items())]
                     + [_blank(r.speedups.get(b)) for b in baselines])
    return header, lines


def _blank(value: Any) -> Any:
    return "" if value is None else value


def bench_csv(record: BenchRecord) -> str:
    from ..records.report import csv_text

    header, lines = csv_table(record)
    return csv_text(header, lines)


def default_record_path(folder: str | Path = "results") -> Path:
    """results/bench-<UTC time>.json"""
    return Path(folder) / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"


def merge_records(records: Sequence[BenchRecord]) -> BenchRecord:
    """One bench record from shards' records: rows joined; the first record's ceilings and sanity
    rows stand for the run (each shard measured its own; they are kept under meta.merged_from)."""
    first = records[0]
    meta = dict(first.meta) | {"merged_from": [dict(r.meta) | {"ceilings": r.ceilings} for r in records]}
    return replace(first, meta=meta, rows=tuple(row for r in records for row in r.rows),
                   errors=tuple(e for r in records for e in r.errors),
                   not_run=tuple(n for r in records for n in r.not_run),
                   complete=all(r.complete for r in records),
                   case_seconds={k: v for r in records for k, v in r.case_seconds.items()},
                   timing_plans={k: v for r in records for k, v in r.timing_plans.items()})


def merge_shards(records: Sequence[BenchRecord], labels: Sequence[str]) -> BenchRecord:
    """merge_records for the records of every shard of one run (`report --merge`): a duplicate,
    missing or foreign shard is a UsageError listing each problem; meta.shards says what it joined."""
    from ..records.report import check_shards

    problems = check_shards([r.meta for r in records], labels)
    if problems:
        raise UsageError("these bench records are not the shards of one run: " + "; ".join(problems))
    merged = merge_records(records)
    shards = sorted((r.meta["shard"] for r in records), key=lambda s: int(s.split("/")[0]))
    return replace(merged, meta=merged.meta | {"shard": "1/1", "shards": shards})


def write_record(path: str | Path, record: BenchRecord) -> None:
    """The record as compact JSON at `path`, every Timing's summary inline and its raw series (RAW_SERIES) in
    the compressed sidecar `samples_path(path)` that the JSON names (samples are most of a record's
    size: inline, a --repeat run of the default suites in both modes took several MB). Both written
    atomically, the sidecar first, so a JSON on disk never names samples not yet written."""
    from ..atomic import atomic_write
    from ..records.report import plain

    path = Path(path)
    data = plain(record)
    if not data.get("timing_plans"):          # a record from before the plan writes back as it was
        data.pop("timing_plans", None)
    arrays = {f"{key}.{series}": np.asarray([_num(v) for v in timing.pop(series, ())], dtype=np.float64)
              for key, timing in _timing_slots(data) for series in RAW_SERIES}
    if any(a.size for a in arrays.values()):
        sidecar = samples_path(path)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        atomic_write(sidecar, buffer.getvalue())
        data["samples_file"] = sidecar.name
    atomic_write(path, json.dumps(data, allow_nan=False, separators=(",", ":")) + "\n")


def record_text(record: BenchRecord) -> str:
    """The record as one JSON document with its samples inline (for stdout, where no sidecar fits)."""
    from ..records.report import plain

    return json.dumps(plain(record), allow_nan=False, separators=(",", ":")) + "\n"
