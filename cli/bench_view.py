"""Views of bench records and comparisons: the tables, plain lines and footers of `kdtree bench`
and `kdtree report` (rendering only; the commands are in cli/bench.py and cli/report.py)."""

from __future__ import annotations

from typing import Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .render import plain as plain_line, styled, visible


def fmt_time(ms: Optional[float]) -> str:
    if ms is None:
        return "—"
    us = ms * 1e3
    if us < 100:
        return f"{us:.2f} µs"
    if us < 1000:
        return f"{us:.1f} µs"
    if ms < 1000:
        return f"{ms:.3f} ms"
    return f"{ms / 1e3:.3f} s"


def _fig(value: Optional[float], digits: int = 1) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if value >= 100 else f"{value:.3g}"


def _pct(value: Optional[float]) -> str | Text:
    if value is None:
        return "—"
    text = f"{100 * value:.0f}%" if value >= 0.1 else f"{100 * value:.1f}%"
    return styled(f"{text}!", "bold red") if value > 1.0 else text


def _config(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _how(timing) -> str:
    if timing is None:
        return ""
    k = f"×{timing.calls_per_sample}" if timing.calls_per_sample > 1 else ""
    return (timing.mode if timing.method == timing.mode else f"{timing.mode} {timing.method}") + k


def _check(row) -> str | Text:
    if row.skip:
        return styled("skip", "dim")
    if row.check_passed is None:
        return ""
    return styled("ok", "green") if row.check_passed else styled("FAIL", "bold red")


def _header(record) -> list[str | Text]:
    meta, device = record.meta, record.meta.get("device") or {}
    lines = []
    if record.settings.get("gpu"):
        after = meta.get("clocks_after") or {}
        clock = (f"SM clock {after.get('sm')} at the end" if after.get("sm")
                 else f"SM clock {device.get('clock_sm')} at the start")
        lines.append(Text.assemble(
            styled(str(device.get("gpu")), "bold"),
            visible(f" ({device.get('capability')}, driver {device.get('driver')}, {clock}, max "
                    f"{device.get('clock_sm_max')}), torch {device.get('torch')}, NVRTC {device.get('nvrtc')}, "
                    f"commit {str(meta.get('commit'))[:12]}{' (dirty)' if meta.get('dirty') else ''}")))
        if meta.get("ran_as"):
            lines.append(Text.assemble(styled(f"ran as {meta['ran_as']}", "bold yellow"),
                                       " (KDTREE_GPU: kernels chosen for that GPU)"))
    else:
        lines.append(styled("CPU run (no GPU): the torch backend timed on the host with perf_counter — "
                            "a smoke test of the tool, not kernel performance", "bold yellow"))
    timing = record.settings.get("timing", {})
    lines.append(f"timer: {record.settings.get('timer')}; modes: {', '.join(record.settings.get('modes', []))}; "
                 f"budget {timing.get('budget_s')} s per implementation, target ±{100 * float(timing.get('target', 0)):.1f}%"
                 + (f"; implementations interleaved in rounds (at least {timing['min_rounds']}), ± = the larger of "
                    "the median's CI and the round-to-round CI" if timing.get("min_rounds") else ""))
    c = record.ceilings
    if c is not None:
        lines.append(f"ceilings measured in this run: HBM read {c.hbm_read_gbps:,.0f} GB/s, copy {c.hbm_copy_gbps:,.0f} "
                     f"GB/s (r+w), bf16 MMA {c.bf16_mma_tflops:,.0f} TFLOP/s, fp32 {c.fp32_fma_tflops:,.1f} TFLOP/s; "
                     f"L2 {c.l2_bytes / 2 ** 20:.0f} MiB (flush buffer 2x)"
                     + ("; fp32 on bf16 tensor cores (six products an fp32 product) against a sixth of bf16 MMA, "
                        f"{c.compute_tflops('bf16_mma_x6'):,.0f} TFLOP/s"
                        if any(r.compute_unit == "bf16_mma_x6" for r in record.rows) else ""))
    return lines


def sanity_table(rows) -> Table:
    table = Table(title="sanity cases (each timed twice, interleaved)", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("case", "impl", "how", "time ± noise", "again", "agree", "GB/s", "% HBM", "note"):
        table.add_column(name, justify="left" if name in ("case", "impl", "how", "note") else "right",
                         no_wrap=name == "case")
    for r in rows:
        t = r.timing
        table.add_row(r.case, r.impl, _how(t), f"{fmt_time(t.median)} ±{100 * t.rel_ci:.1f}%" if t else "—",
                      fmt_time(r.repeat.median if r.repeat else None),
                      "" if r.repeat_agrees is None else ("yes" if r.repeat_agrees else styled("no", "red")),
                      _fig(r.gbps, 0), _pct(r.pct_bandwidth), r.check or "")
    return table


def bench_view(record, *, verbose: bool = False, quiet: bool = False, wide: bool = False,
               console: Optional[Console] = None) -> None:
    """The record's table: by default one line per case and mode of ours within 120 columns (case,
    kernel, time ± noise, the bound throughput as % of its ceiling, the best baseline and our
    speedup over it); --wide every column; --verbose the baselines' own rows too."""
    from . import render

    out = console or render.out
    if quiet:
        _plain_lines(record, verbose)
        _footer(record, plain=True, console=out)
        return
    for line in _header(record):
        out.print(line)
    if record.sanity:
        out.print(sanity_table(record.sanity), width=None if wide else min(out.width, TABLE_WIDTH))
    if wide:
        out.print(_wide_table(record, verbose))
    else:
        out.print(_table(record, verbose), width=min(out.width, TABLE_WIDTH))
    _footer(record, plain=False, console=out)


def _plain_lines(record, verbose: bool) -> None:
    for r in record.sanity:
        t = r.timing
        plain_line(f"sanity {r.case} {r.impl} {_how(t)} median={fmt_time(t.median if t else None)} "
              f"again={fmt_time(r.repeat.median if r.repeat else None)} agree={r.repeat_agrees} "
              f"pct_bw={'' if r.pct_bandwidth is None else f'{100 * r.pct_bandwidth:.0f}%'}")
    from kdtr.bench.notes import row_telemetry

    for r in record.rows if verbose else [r for r in record.rows if r.primary]:
        t = r.headline                       # the slower of interleaved and back to back
        speed = " ".join(f"vs_{k}={v:.2f}x" for k, v in r.speedups.items())
        status = f"skip ({r.skip})" if r.skip else ("ok" if r.check_passed else f"FAIL ({r.check})")
        kernel = f" kernel={picked}" if (picked := _kernel(r, with_grid=False)) else ""
        if grid := _launch_grid(r):
            kernel += f" grid={'x'.join(map(str, grid))}"
        plain_line(f"{r.impl} {r.op}/{r.variant} {r.case} {r.mode}{kernel} median={fmt_time(t.median if t else None)} "
              f"noise={'' if t is None else f'{100 * t.rel_ci:.1f}%'} tflops={_fig(r.tflops)} "
              f"gbps={_fig(r.gbps, 0)} {speed} {status}".rstrip()
              + (f" interleaved={fmt_time(r.timing.median)} alone={fmt_time(r.alone.median)}" if r.alone else "")
              + (f" {tel}" if (tel := row_telemetry(r.timing)) else ""))


def _groups(record) -> dict:
    by_case: dict = {}
    for r in record.rows:
        by_case.setdefault((r.op, r.variant, r.case, r.mode), []).append(r)
    return by_case


TABLE_WIDTH = 120               # the default table's limit (issue 22); --wide has none


def _table(record, verbose: bool) -> Table:
    """Per op/variant section: case, kernel, time ± noise (or why it has none: FAIL, skip),
    throughput (% of the bound ceiling), our speedup over the fastest checked baseline (named);
    "vs 1st" where kernels were forced by name. Names fold within their caps; figures never do."""
    modes = len({r.mode for r in record.rows}) > 1
    forced = any(r.kernel is not None for r in record.rows)
    table = Table(title=f"kdtree bench — {record.primary} vs baselines (speedup = baseline median / ours)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    caps = {"case": 30 if not forced else 26, "kernel": 14 if not forced else 22, "time ± noise": None,
            "throughput": None, "speedup (best baseline)": 27, "vs 1st": None}
    for name, cap in caps.items():
        if name != "vs 1st" or forced:
            table.add_column(name, justify="left" if cap else "right", overflow="fold", no_wrap=cap is None,
                             max_width=cap)
    section = None
    for (op, variant, case, mode), rows in _groups(record).items():
        if (op, variant) != section:
            section = (op, variant)
            table.add_row(styled(f"{op}/{variant}", "bold"), *[""] * (len(table.columns) - 1))
        first = next((o for o in rows if o.kernel is not None), None)
        for r in rows if verbose else [r for r in rows if r.primary]:
            t = r.headline                  # the slower of interleaved and back to back
            best = _best_baseline(r, rows)
            cells = [f"  {case}" + (f" ({mode})" if modes else "") if r.primary else f"    {r.impl}",
                     _kernel(r) or (r.impl if r.primary else ""),
                     f"{fmt_time(t.median)} ±{100 * t.rel_ci:.1f}%" if t else _check(r) or "—", _throughput(r),
                     f"{r.speedups[best]:.2f}× {best}" if best else _baseline_state(r, rows)]
            if forced:
                cells.append(f"{r.speedups[first.impl]:.2f}×" if first is not None and first.impl in r.speedups
                             else "")
            table.add_row(*cells)
    return table


def _wide_table(record, verbose: bool) -> Table:
    """Every column: config, how it was timed, TFLOP/s and GB/s with both percentages, every baseline."""
    baselines = list(dict.fromkeys(r.impl for r in record.rows if not r.primary))
    forced = list(dict.fromkeys(r.impl for r in record.rows if r.kernel is not None))[:1]
    table = Table(title=f"kdtree bench — {record.primary} vs baselines (speedup = baseline median / ours)",
                  title_justify="left")
    columns = ["case", "config", "impl", "kernel", "how", "time", "±", "TFLOP/s", "GB/s", "% peak", "% HBM"] \
        + [f"vs {b}" for b in [*forced, *baselines]] + ["check"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("case", "config", "impl", "kernel", "how") else "right",
                         no_wrap=name == "case")
    for (op, variant, case, mode), rows in _groups(record).items():
        for r in rows if verbose else [r for r in rows if r.primary]:
            t = r.headline
            cells = [f"{op}/{variant} {case}" if r.primary or not verbose else f"  {case}", _config(r.config),
                     r.impl, _kernel(r) or "", _how(t), fmt_time(t.median if t else None),
                     f"{100 * t.rel_ci:.1f}%" if t else "", _fig(r.tflops), _fig(r.gbps, 0), _pct(r.pct_compute),
                     _pct(r.pct_bandwidth)]
            for b in [*forced, *baselines]:
                other = next((o for o in rows if o.impl == b), None)
                if not r.primary or other is None or other is r:
                    cells.append("")
                elif b in r.speedups:
                    cells.append(f"{r.speedups[b]:.2f}×")
                else:
                    cells.append(_state(other))
            cells.append(_check(r))
            table.add_row(*cells)
    return table


def _throughput(r) -> str:
    """The figure nearer its ceiling (the bound), with its percentage: "412 TFLOP/s 52%"."""
    compute = (r.pct_compute or 0.0, f"{_fig(r.tflops)} TFLOP/s", r.pct_compute) if r.tflops is not None else None
    memory = (r.pct_bandwidth or 0.0, f"{_fig(r.gbps, 0)} GB/s", r.pct_bandwidth) if r.gbps is not None else None
    options = [o for o in (compute, memory) if o is not None]
    if not options:
        return "—"
    _, text, pct = max(options, key=lambda o: o[0])
    return text if pct is None else Text.assemble(text, " ", _pct(pct))


def _best_baseline(r, rows) -> Optional[str]:
    """The fastest baseline our row has a speedup over (the toughest comparison), or None."""
    over = [o.impl for o in rows if not o.primary and o.impl in r.speedups]
    return min(over, key=lambda name: r.speedups[name]) if r.primary and over else None


def _baseline_state(r, rows) -> str:
    others = [o for o in rows if not o.primary]
    if not r.primary or not others:
        return ""
    return _state(others[0]) if len({str(_state(o)) for o in others}) == 1 else "—"


def _state(other) -> str | Text:
    if other.skip:
        return styled("skip", "dim")
    if other.check_passed is False:
        return styled("FAIL", "red")
    return "—"


def _kernel(r, with_grid: bool = True) -> Optional[str]:
    """The kernel of our row: forced by name (with its defines), or the one our launch picked (GPU
    runs), then the grid it launched (the launch's shape-dependent choices: row tiles, B, splits)."""
    if r.kernel is not None:
        return r.impl                  # its label: the name, and a knob build's defines
    picked = (r.extra or {}).get("kernel") if r.impl == "cuda" else None
    grid = _launch_grid(r) if with_grid else None
    return f"{picked} {'×'.join(map(str, grid))}" if picked and grid else picked


def _launch_grid(r) -> Optional[list]:
    """The grid our launch picked for its own kernel (GPU runs; a forced build's row has none)."""
    return (r.extra or {}).get("grid") if r.kernel is None and r.impl == "cuda" else None


def _footer(record, *, plain: bool, console: Console) -> None:
    from kdtr.bench.record import TIME_LIMIT_SKIP

    emit = plain_line if plain else console.print
    flagged = [r for r in (*record.sanity, *record.rows) if r.flagged]
    if flagged:
        emit(f"! {len(flagged)} figure(s) above 100% of a measured ceiling: measurement errors (e.g. data served "
             "by the L2 in hot mode), not results: " + ", ".join(f"{r.case}/{r.impl}" for r in flagged[:8])
             + (" ..." if len(flagged) > 8 else ""))
    for r in record.rows:
        if r.check_passed is False:
            emit(f"FAIL {r.op}/{r.variant} {r.case} {r.impl} ({r.mode}): {r.check}")
    reasons = {}
    for r in record.rows:
        if r.skip:
            reasons.setdefault((r.impl, r.skip), []).append(r.case)
    for (impl, why), cases in reasons.items():
        emit(f"skipped {impl} in {len(cases)} case(s): {why}"
             + (f": {', '.join(cases)}" if why == TIME_LIMIT_SKIP else ""))
    repeats = [r for r in record.rows if r.repeat_agrees is not None]
    if repeats:
        disagree = [r for r in repeats if not r.repeat_agrees]
        worst = max(repeats, key=lambda r: abs(r.repeat.median / r.timing.median - 1))
        emit(f"repeat: {len(repeats) - len(disagree)} of {len(repeats)} second timings agree with the first "
             "within the reported noise" + (": not " + ", ".join(
                 f"{r.case} ({100 * (r.repeat.median / r.timing.median - 1):+.1f}%, ±{100 * r.timing.rel_ci:.1f}% "
                 f"and ±{100 * r.repeat.rel_ci:.1f}%)" for r in disagree) if disagree else "")
             + f"; largest difference {100 * (worst.repeat.median / worst.timing.median - 1):+.2f}% ({worst.case})")
    stops = {}
    for r in record.rows:
        if r.primary and r.timing is not None:
            stops[r.timing.stop_reason] = stops.get(r.timing.stop_reason, 0) + 1
    from kdtr.bench.notes import timing_notes

    for line in timing_notes(record):
        emit(line)
    if stops:
        emit("rounds stopped: " + ", ".join(f"{n} {why}" for why, n in sorted(stops.items(), key=lambda kv: -kv[1]))
             + " (converged: every noise under the target; budget: the time budget ran out)")
    for message in record.errors:
        emit(f"error: {message}")
    if record.not_run:
        emit(f"not run (time limit): {len(record.not_run)} case(s): {', '.join(record.not_run)}")
    primary = [r for r in record.rows if r.primary]
    timed = sum(r.timing is not None for r in primary)
    failed = sum(r.check_passed is False for r in primary)
    emit(f"{len(primary)} case-modes: {timed} timed, {failed} failed, {len(primary) - timed - failed} not timed; "
         f"{record.meta.get('seconds', 0):.0f} s" + ("" if record.complete else " (incomplete)"))


def compare_view(comparison, old_name: str, new_name: str, *, verbose: bool, quiet: bool) -> None:
    from . import render

    rows = [r for r in comparison.rows if verbose or r.primary]
    summary = (f"compare {old_name} -> {new_name}: {comparison.count('faster')} faster, "
               f"{comparison.count('slower')} slower, {comparison.count('same')} same, "
               f"{comparison.count('ambiguous')} ambiguous, {comparison.count('failed')} newly failing, "
               f"{comparison.count('missing')} missing, {comparison.count('new')} new; "
               f"{len(comparison.regressions)} regression(s) beyond {100 * comparison.threshold:.0f}%")
    if quiet:
        for r in rows:
            change = "" if r.ratio is None else f"{100 * (r.ratio - 1):+.1f}%"
            plain_line(f"{r.verdict.upper()} {r.op}/{r.variant} {r.case} {r.impl} {r.mode} {change}"
                  + (" REGRESSION" if r.regression else ""))
        for note in comparison.notes:
            plain_line(f"note: {note}")
        plain_line(summary)
        return
    table = Table(title="kdtree bench --compare (new / old, judged against the measured noise)", title_justify="left")
    for name in ("case", "impl", "mode", "old", "new", "change", "noise", "verdict"):
        table.add_column(name, justify="left" if name in ("case", "impl", "mode", "verdict") else "right")
    style = {"faster": "green", "slower": "red", "failed": "bold red", "ambiguous": "yellow"}
    for r in rows:
        verdict = r.verdict + (" REGRESSION" if r.regression else "")
        table.add_row(f"{r.op}/{r.variant} {r.case}", r.impl, r.mode, fmt_time(r.old_ms), fmt_time(r.new_ms),
                      "" if r.ratio is None else f"{100 * (r.ratio - 1):+.1f}%",
                      "" if r.noise is None else f"±{100 * r.noise:.1f}%",
                      styled(verdict, style[r.verdict]) if r.verdict in style else verdict)
    render.out.print(table)
    for note in comparison.notes:
        render.out.print(f"note: {note}")
    render.out.print(summary)
