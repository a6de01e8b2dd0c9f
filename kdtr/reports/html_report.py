"""`kdtree report --html`: one self-contained page of verify and bench records (inline CSS and SVG,
no script, no network: its Content-Security-Policy forbids every fetch). Every string taken from a
record goes through `_e`: a record may hold any case name, argv or error text, markup and terminal
escape codes among them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Sequence

from ..atomic import atomic_write
from ..bench import COMPUTE_UNITS, BenchRecord, BenchRow
from ..errors import UsageError
from ..records.record import BENCH_KIND, VERIFY_KIND, read_json, record_kind
from ..records.report import portable, visible
from ..runtime.gpu_identity import record_gpu
from .plot import prefix_series, roofline_points
from .svg_plot import PALETTE, Series, legend, log_chart

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:20px 0 6px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:12px 0 4px}p.note{color:#555;margin:4px 0}
table{border-collapse:collapse;font-size:12px}th,td{padding:2px 8px;text-align:left;white-space:nowrap}
th{background:#f3f3f3;position:sticky;top:0}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.scroll{max-height:360px;overflow:auto;border:1px solid #ddd;display:inline-block;max-width:100%}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:700}.skip{color:#888}
.bar{display:inline-block;height:8px;background:#4c8bf5;vertical-align:middle;margin-left:4px}
.bar.over{background:#cf222e}.charts{display:flex;flex-wrap:wrap;gap:16px}
.chart text{font:11px system-ui,sans-serif;fill:#333}.chart .title{font-size:13px;text-anchor:middle}
.chart .tick{text-anchor:middle}.chart .ytick{text-anchor:end}.chart .axis{text-anchor:middle}
.chart .frame{fill:none;stroke:#999}.chart .grid{stroke:#e4e4e4}
ul.legend{list-style:none;padding:0;margin:2px 0;font-size:11px;max-width:560px;columns:2}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:5px}
.swatch.roof{width:18px;height:0;border-top:2px solid #000;border-radius:0;vertical-align:middle}
.swatch.ring{border:2px solid #d62728;width:7px;height:7px}
dl.prov{display:grid;grid-template-columns:max-content auto;gap:1px 12px;font-size:12px;margin:4px 0}
dl.prov dt{color:#666}dl.prov dd{margin:0;font-family:ui-monospace,monospace;word-break:break-all}
"""


@dataclass(frozen=True)
class LoadedRecord:
    label: str
    kind: str                       # VERIFY_KIND or BENCH_KIND
    meta: dict
    verify: dict | None = None      # the verify record as JSON
    bench: BenchRecord | None = None


def load_records(paths: Sequence[str | Path]) -> list[LoadedRecord]:
    """Verify and bench records (bench ones without their samples: the page needs no raw samples)."""
    loaded = []
    for path in paths:
        data = read_json(path)
        kind = record_kind(data, path)
        label = portable(path)
        if kind == VERIFY_KIND:
            if not isinstance(data.get("rows"), list):
                raise UsageError("malformed verify record: no list of rows", file=path, field="rows")
            loaded.append(LoadedRecord(label, kind, dict(data.get("meta") or {}), verify=data))
        elif kind == BENCH_KIND:
            try:
                record = BenchRecord.from_plain(data)
            except UsageError as err:
                raise UsageError(err.message, file=path, field=err.field) from None
            except (TypeError, ValueError, KeyError, AttributeError) as err:
                raise UsageError(f"malformed bench record: {type(err).__name__}: {err}", file=path) from None
            loaded.append(LoadedRecord(label, kind, record.meta, bench=record))
    return loaded


def _e(value: Any) -> str:
    """A record's string as HTML text: escaped, its control characters visible (ESC -> `\\x1b`)."""
    return escape(visible("" if value is None else str(value)), quote=True)


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1e3:.2f} µs" if value < 1 else f"{value:.3f} ms"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int] = frozenset()) -> str:
    """Cells are HTML already (each escaped where it was built)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


# -- verify ---------------------------------------------------------------------------------------
def _share(row: dict) -> float | None:
    shares = [o.get("tol_share") for o in row.get("outputs") or () if isinstance(o, dict)]
    numbers = [float(s) for s in shares if isinstance(s, (int, float)) or s in ("inf", "nan")]
    return max(numbers, default=None)


def _verdict(row: dict) -> str:
    if row.get("skipped") is not None:
        return '<span class="skip">SKIP</span>'
    return '<span class="pass">PASS</span>' if row.get("passed") else '<span class="fail">FAIL</span>'


def _share_cell(share: float | None) -> str:
    if share is None:
        return "exact"
    width = min(share, 1.0) * 60
    over = " over" if not share <= 1 else ""
    return f'{_num(share)}<span class="bar{over}" style="width:{width:.0f}px"></span>'


def _why(row: dict) -> str:
    if row.get("skipped") is not None:
        return _e(row["skipped"])
    if row.get("error"):
        return _e(row["error"])
    return _e("; ".join(f"{o.get('name')}: {o.get('reason')}" for o in row.get("outputs") or ()
                        if isinstance(o, dict) and not o.get("passed")))


def verify_section(record: LoadedRecord) -> str:
    rows = [r for r in record.verify["rows"] if isinstance(r, dict)]
    passed = sum(1 for r in rows if r.get("passed"))
    skipped = sum(1 for r in rows if r.get("skipped") is not None)
    failed = len(rows) - passed - skipped
    errors = [e for e in record.verify.get("errors") or ()]

    def order(row):     # failures first, then the nearest their tolerance
        share = _share(row)
        return (bool(row.get("passed")) or row.get("skipped") is not None, -(share if share == share and share else 0))

    cells = []
    for row in sorted(rows, key=order):
        name = str(row.get("case")) + (f" #{row['trial']}" if row.get("trial") else "")
        cells.append([_verdict(row), _e(f"{row.get('op')}/{row.get('variant')}"), _e(name),
                      _e(row.get("impl") or row.get("backend")),
                      _e(" ".join(f"{k}={v}" for k, v in (row.get("config") or {}).items())),
                      _share_cell(_share(row)), _ms(float(row.get("seconds") or 0) * 1e3), _why(row)])
    summary = (f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
               + (f", {len(errors)} input errors" if errors else ""))
    notes = "".join(f'<p class="note fail">{_e(e)}</p>' for e in errors)
    return (f"<h2>verify: {_e(record.label)}</h2><p class=\"note\">{_e(summary)}. Tolerance share = the worst "
            "element's |x−r| / (atol + rtol·|r|): at most 1 passes; failures first, then the nearest their "
            f"tolerance.</p>{notes}"
            + _table(["result", "op", "case", "impl", "config", "tol share", "time", "why"], cells, frozenset({6})))


# -- bench ----------------------------------------------------------------------------------------
def _bound(row: BenchRow) -> str:
    """The figure nearer its ceiling: "412 TFLOP/s (52%)"."""
    options = [(row.pct_compute or 0.0, f"{_num(row.tflops)} TFLOP/s", row.pct_compute)] if row.tflops else []
    options += [(row.pct_bandwidth or 0.0, f"{_num(row.gbps)} GB/s", row.pct_bandwidth)] if row.gbps else []
    if not options:
        return "—"
    _, text, pct = max(options, key=lambda o: o[0])
    return _e(text if pct is None else f"{text} ({_pct(pct)})")


def _peer_cell(peer: BenchRow | None, ours: BenchRow) -> str:
    if peer is None:
        return "—"
    if peer.timing is None:
        return f'<span class="skip" title="{_e(peer.skip or peer.check)}">skip</span>'
    speedup = ours.speedups.get(peer.impl)
    return _e(_ms(peer.timing.median) + (f" ({speedup:.2f}×)" if speedup else ""))


def bench_section(record: LoadedRecord) -> str:
    bench = record.bench
    groups: dict[tuple, list[BenchRow]] = {}
    for row in bench.rows:
        groups.setdefault((row.op, row.variant, row.case, row.mode, json.dumps(row.config, sort_keys=True)),
                          []).append(row)
    peers = sorted({r.impl for r in bench.rows if not r.primary})
    cells = []
    for rows in groups.values():
        ours = next((r for r in rows if r.primary), rows[0])
        timing = ours.timing
        time = "—" if timing is None else f"{_ms(timing.median)} ±{100 * timing.rel_ci:.1f}%"
        check = ("skip" if ours.skip else "" if ours.check_passed is None else
                 '<span class="pass">ok</span>' if ours.check_passed else '<span class="fail">FAIL</span>')
        by_impl = {r.impl: r for r in rows if not r.primary}
        cells.append([_e(f"{ours.op}/{ours.variant}"), _e(ours.case), _e(ours.mode), _e(time), _bound(ours), check,
                      *[_peer_cell(by_impl.get(p), ours) for p in peers],
                      _e(" ".join(f"{k}={v}" for k, v in ours.config.items()))])
    gpu = record_gpu(bench.meta, bench.ceilings)
    note = (f"{_e(gpu.label)}; ceilings measured in this run: {_ceilings_text(gpu.ceilings)}" if not gpu.host
            else "CPU run (no GPU): the torch backend timed on the host with perf_counter, a smoke test of the tool, "
                 "not kernel performance; no ceilings")
    return (f"<h2>bench: {_e(record.label)}</h2><p class=\"note\">{note}. Time = median ± its 95% CI; the "
            "rate is the one nearer its ceiling, with its share. Peers are timed in the same interleaved "
            "rounds on the same inputs.</p>"
            + _table(["op", "case", "mode", f"{bench.primary} (ours)", "rate (% ceiling)", "check",
                      *[f"{p} (ours ×faster)" for p in peers], "config"], cells) + _charts(bench))


def _ceilings_text(ceilings: dict | None) -> str:
    if not ceilings:
        return "none"
    hbm = max(ceilings.get("hbm_read_gbps", 0), ceilings.get("hbm_copy_gbps", 0))
    return _e(f"HBM {hbm:,.0f} GB/s, bf16 MMA {ceilings.get('bf16_mma_tflops', 0):,.0f} TFLOP/s, "
              f"fp32 {ceilings.get('fp32_fma_tflops', 0):,.1f} TFLOP/s")


def _charts(bench: BenchRecord) -> str:
    roof = _roofline_series(bench)
    latency = [Series(label, tuple((float(p), float(t)) for p, t in points), "line", PALETTE[i % len(PALETTE)])
               for i, (label, points) in enumerate(sorted(prefix_series(bench).items()))]
    return ('<div class="charts"><div>'
            + log_chart(roof, title="roofline (measured ceilings)", x_label="FLOP per byte (cost model)",
                        y_label="achieved TFLOP/s", empty="no timed rows with FLOPs")
            + legend(roof) + "</div><div>"
            + log_chart(latency, title="latency against prefix length", x_label="prefix (tokens)",
                        y_label="median ms per call", x_base=2, empty="no rows that differ only in prefix")
            + legend(latency) + "</div></div>")


def _roofline_series(bench: BenchRecord) -> list[Series]:
    groups = roofline_points(bench)
    series = [Series(label, tuple((x, y) for x, y, _ in points), "points", PALETTE[i % len(PALETTE)])
              for i, (label, points) in enumerate(sorted(groups.items()))]
    flagged = tuple((x, y) for points in groups.values() for x, y, f in points if f)
    if flagged:
        series.append(Series("above a ceiling: a measurement error", flagged, "ring"))
    ceilings = bench.ceilings
    xs = [x for s in series for x, _ in s.points]
    if ceilings is None or not xs:
        return series
    low, high = min(xs) / 3, max(xs) * 3
    bandwidth = ceilings.bandwidth_gbps / 1e3        # TB/s: TFLOP/s per FLOP/byte
    used = {r.compute_unit for r in bench.rows}
    units = [u for u in COMPUTE_UNITS if u in ("bf16_mma", "fp32_fma") or u in used]
    for unit, dash in zip(units, ("", "6 3", "2 3")):
        peak = ceilings.compute_tflops(unit)
        knee = min(max(peak / bandwidth, low), high)
        points = tuple((x, min(peak, bandwidth * x)) for x in (low, knee, high))
        series.append(Series(f"{unit} {peak:,.0f} TFLOP/s, HBM {bandwidth:.2f} TB/s (measured)", points,
                             "roof", dash=dash))
    return series


# -- across records -------------------------------------------------------------------------------
def gpu_section(records: Sequence[LoadedRecord]) -> str:
    benches = [r for r in records if r.bench is not None]
    if len(benches) < 2:
        return ""
    from .gpu_compare import compare_gpus

    try:
        comparison = compare_gpus([r.bench for r in benches], [r.label for r in benches])
    except UsageError as err:
        return f'<h2>GPUs side by side</h2><p class="note">not compared: {_e(err)}</p>'
    header = ["op", "case", "impl", "mode"]
    for index in range(1, len(comparison.gpus) + 1):
        header += [f"[{index}] time", f"[{index}] rate", f"[{index}] % own ceiling"]
        header += [f"[{index}] speed"] if index > 1 else []
    cells = []
    for row in comparison.rows:
        line = [_e(f"{row.op}/{row.variant}"), _e(row.case), _e(row.impl), _e(row.mode)]
        for index, figure in enumerate(row.figures):
            if figure is None:
                line += ["—"] * (4 if index else 3)
                continue
            line += [_e(_ms(figure.median_ms)), _e(f"{_num(figure.throughput)} {row.unit}"), _e(_pct(figure.share))]
            if index:
                line.append(_e(f"{figure.speed:.2f}×"))
        cells.append(line)
    names = "".join(f"<li>[{i}] {_e(label)}: {_e(gpu.label)}; {_ceilings_text(gpu.ceilings)}</li>"
                    for i, (label, gpu) in enumerate(zip(comparison.labels, comparison.gpus), 1))
    return (f'<h2>GPUs side by side</h2><ul>{names}</ul><p class="note">The same cases (case name, '
            "implementation, mode and every parameter), each against its own GPU's ceilings measured in its own "
            "run; speed = [1]'s time / this one's.</p>" + _table(header, cells))


def provenance_section(records: Sequence[LoadedRecord]) -> str:
    parts = ["<h2>provenance</h2>"]
    for record in records:
        meta = record.meta
        command = meta.get("command_line") or " ".join(map(str, meta.get("argv") or ())) or meta.get("command")
        commit = f"{meta.get('commit')}{' (dirty)' if meta.get('dirty') else ''}"
        gpu = record_gpu(meta, record.bench.ceilings if record.bench else None)
        facts = [("record", record.label), ("kind", record.kind), ("command", command), ("commit", commit),
                 ("sources_sha256", meta.get("sources_sha256")), ("GPU", gpu.label),
                 ("ceilings", None if gpu.host else _ceilings_text(gpu.ceilings)),
                 ("kdtree", meta.get("kdtree")), ("started", meta.get("started")), ("shard", meta.get("shard"))]
        parts.append('<dl class="prov">' + "".join(
            f"<dt>{_e(name)}</dt><dd>{value if name == 'ceilings' else _e(value)}</dd>"
            for name, value in facts if value is not None) + "</dl>")
    return "".join(parts)


def html_report(records: Sequence[LoadedRecord]) -> str:
    """The page: per record its tables and plots, then the GPU comparison and every provenance."""
    if not records:
        raise UsageError("--html needs at least one record")
    body = [section for record in records
            for section in ([bench_section(record)] if record.bench is not None else [verify_section(record)])]
    title = "kdtree report: " + ", ".join(r.label for r in records)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{_e(title)}</h1>" + "".join(body) + gpu_section(records) + provenance_section(records)
            + "</body></html>\n")


def write_html_report(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Read the records, write the page atomically (a bad record: UsageError, nothing written)."""
    page = html_report(load_records(paths))
    atomic_write(out, page)
    return Path(out)
