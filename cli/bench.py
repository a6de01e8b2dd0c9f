"""`kdtree bench` (timings, ceilings, baselines, records, the regression gate) and `kdtree report`."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from kdtr.errors import UsageError

from .main import EXIT_FAILED, EXIT_OK, DevicesOpt, ShardOpt, _emit_json, _gpu_count, app, guarded

BENCH_HELP = (
    "Time our kernels and their baselines on the same inputs in one run, against ceilings measured "
    "in that run; print the table, optionally save a record (--json, --save) and CSV.\n\n"
    "How: CUDA events around replays of a captured CUDA graph (eager where capture is impossible). "
    "Every implementation's outputs on the timed inputs are checked against the reference first; "
    "then ours and the baselines of a case (ours twice with --repeat) are timed in interleaved "
    "turns, each running right after every other equally often (A C B C A B | ...), so drift of "
    "the GPU's clocks and temperature, and what one leaves behind for the next, hit all alike. A "
    "figure is the median of its samples; its noise (±) is the larger of that median's 95% CI and "
    "the 95% CI of its rounds' medians (the round-to-round variation). Rounds stop (at least 5) when "
    "every noise is under --target, or the --budget per implementation is spent (the record says "
    "which: stop_reason). Cold mode (default) flushes the L2 with a 2x-L2 buffer or rotates input "
    "copies; hot mode reuses the same inputs. Speedup = baseline median / our median. Figures above "
    "100% of a measured ceiling are flagged as measurement errors.\n\n"
    "Without a GPU, the torch backend runs on the CPU timed with perf_counter: a degraded smoke run, "
    "labelled as such (no ceilings, no device baselines). --backend cuda without a GPU exits 2.\n\n"
    "--compare OLD.json: after the run, judge each case faster / slower / same against the measured "
    "noise; with one NEW.json as the argument, compare the two records without running.\n\n"
    "Exit codes: 0 all checks passed (and no regression); 1 our kernel failed its check, a case "
    "errored, or --compare found a case slower by more than --threshold beyond the noise; 2 bad "
    "usage or input."
)


def _default_specs() -> list[Path]:
    from kdtr.config import REPO_ROOT

    local = Path("specs/bench")
    return [local if local.is_dir() else REPO_ROOT / "specs" / "bench"]


def _items(paths: list[Path], pattern: Optional[str], quick: bool, shard: Optional[str]):
    from kdtr import bench, parallel

    items = parallel.shard_items(bench.collect_items(paths, pattern, quick), _key,
                                 parallel.Shard.parse(shard) if shard else None)
    if not items:
        raise UsageError(f"no case matches -k {pattern!r}" if pattern else "no cases to bench")
    return items


def _key(item) -> str:
    return f"{item.op}/{item.name}"


def _run_on_devices(devices, items, paths, pattern, quick, settings, progress):
    """One spawned worker per GPU, cases spread by size; the records merge into one. A worker that
    crashes fails its cases (listed in the record's errors), never the whole run silently."""
    from kdtr import bench, parallel

    groups = parallel.balance(items, bench.estimated_cost, len(devices))
    jobs = [[bench.WorkerJob(tuple(map(str, paths)), pattern, quick, tuple(map(_key, group)), settings)]
            for group in groups]
    records, crashed = [], []
    for job, result in parallel.map_on_devices(devices, jobs, bench.run_worker, lambda job, why: why):
        if isinstance(result, str):
            crashed.append(f"{result}: its cases {', '.join(job.names)} were not timed")
        else:
            records.append(result)
        progress(f"worker done ({len(records) + len(crashed)}/{len(devices)})", len(records) + len(crashed),
                 len(devices))
    if not records:
        raise UsageError("every bench worker crashed: " + "; ".join(crashed))
    merged = bench.merge_records(records)
    return replace(merged, errors=merged.errors + tuple(crashed), complete=merged.complete and not crashed)


class _Progress:
    """A transient progress bar on a terminal; elsewhere (CI logs, tee) one stderr line per case."""

    def __init__(self, quiet: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from . import render

        self.err = render.err
        self.quiet = quiet
        self.started = time.perf_counter()
        self.bar = None
        self.last = None
        if self.err.is_terminal and not quiet:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.err, transient=True)
            self.task = None

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task("bench", total=None)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"bench {what}"[:100], completed=done, total=total)
        elif not self.quiet and (":" in what or done == 0) and (done, what.split(":")[0]) != self.last:
            self.last = (done, what.split(":")[0])
            self.err.print(f"bench [{done}/{total}] {time.perf_counter() - self.started:7.1f}s {what}",
                           markup=False, highlight=False)


@app.command("bench", help=BENCH_HELP)
@guarded
def bench_cmd(
    paths: List[Path] = typer.Argument(None, help="YAML suites, folders of them, or .kdtr bundles "
                                                  "\\[default: specs/bench/]; with --compare, one NEW.json record."),
    pattern: Optional[str] = typer.Option(None, "-k", help="Only cases whose name contains PATTERN (or matches a * ? glob)."),
    shard: Optional[str] = ShardOpt,
    devices: Optional[str] = DevicesOpt,
    quick: bool = typer.Option(False, "--quick", help="Smoke run for CI: the first 2 cases of each suite, a "
                                                     "0.1 s budget, 5% target, no compiler baselines."),
    mode: str = typer.Option("cold", "--mode", help="cold (L2 flushed or inputs rotated), hot (same inputs again), both."),
    backend: str = typer.Option("auto", "--backend", "-b",
                                help="cuda (our kernels, needs a GPU), torch (the torch backend), auto (cuda "
                                     "where a GPU exists, else torch on the CPU, host-timed)."),
    baseline: Optional[List[str]] = typer.Option(None, "--baseline", help="Only these baselines (repeatable): "
                                                 "torch, torch_compile, sdpa, cpu_heap; verify_attn bf16_paged: "
                                                 "torch_bf16, torch_compile_bf16, torch_fp32, torch_compile_fp32 "
                                                 "(not run unless named), sdpa."),
    no_baselines: bool = typer.Option(False, "--no-baselines", help="Time only our implementation."),
    budget: Optional[float] = typer.Option(None, "--budget", help="Seconds of samples per implementation: a "
                                                                  "case's rounds stop after budget x its implementations "
                                                                  "\\[0.5; --quick 0.1]."),
    target: Optional[float] = typer.Option(None, "--target", help="Stop the rounds when every implementation's "
                                                                  "relative noise is below this \\[0.01; --quick 0.05]."),
    repeat: bool = typer.Option(False, "--repeat", help="Time our kernel a second time in the same interleaved "
                                                       "rounds; report whether the two medians agree within the noise."),
    no_sanity: bool = typer.Option(False, "--no-sanity", help="Skip the empty-kernel and copy sanity cases."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds for the whole run, checked before "
                                                                         "each case and baseline: later ones are listed as "
                                                                         "not run / skipped (exit still 0 if all ran passed)."),
    json_path: Optional[str] = typer.Option(None, "--json", help="Write the record here ('-' = stdout); "
                                                                 "rewritten after every case while running."),
    save: bool = typer.Option(False, "--save", help="Also write the record to results/bench-<UTC time>.json."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV line per row here."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="OLD.json: judge this run (or NEW.json) against it."),
    threshold: float = typer.Option(0.10, "--threshold", help="--compare: slower by more than this fraction "
                                                              "(beyond the noise) is a regression."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show every baseline's own row and timing details."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="One plain line per case (for shell loops)."),
):
    from kdtr import bench
    from kdtr.errors import UsageError

    if mode not in bench.MODES:
        raise UsageError(f"--mode {mode!r}: choose one of {', '.join(bench.MODES)}")
    if not threshold > 0:
        raise UsageError("--threshold must be > 0")
    old = bench.load_record(compare) if compare else None
    paths = list(paths or [])
    if old is not None and len(paths) == 1 and paths[0].suffix == ".json":
        comparison = bench.compare_records(old, bench.load_record(paths[0]), threshold)
        compare_view(comparison, str(compare), str(paths[0]), verbose=verbose, quiet=quiet)
        if json_path:
            _emit_json(json_path, comparison)
        raise typer.Exit(EXIT_FAILED if comparison.regressions else EXIT_OK)
    if any(p.suffix == ".json" for p in paths):
        raise UsageError("a .json argument is only read with --compare OLD.json NEW.json")

    timing = bench.QUICK_TIMING if quick else bench.TimingOptions()
    if budget is not None:
        timing = replace(timing, budget_s=budget)
    if target is not None:
        timing = replace(timing, target=target)
    timing.check()
    if time_limit is not None and not time_limit > 0:
        raise UsageError("--time-limit must be > 0")
    settings = bench.BenchSettings(backend=backend, mode=mode, timing=timing,
                                   baselines=() if no_baselines else (tuple(baseline) if baseline else None),
                                   quick=quick, repeat=repeat, sanity=not no_sanity, time_limit_s=time_limit)
    items = _items(paths or _default_specs(), pattern, quick, shard)
    targets = [p for p in (json_path if json_path and json_path != "-" else None,
                           bench.default_record_path() if save else None) if p]

    def partial(record):
        for path in targets:
            bench.write_record(path, record)

    from kdtr import parallel

    device_list = parallel.parse_devices(devices, _gpu_count())
    with _Progress(quiet) as progress:
        if device_list:
            record = _run_on_devices(device_list, items, paths or _default_specs(), pattern, quick, settings,
                                     progress)
        else:
            record = bench.run_bench(items, settings, progress=progress, on_partial=partial if targets else None)
    if json_path != "-":
        bench_view(record, verbose=verbose, quiet=quiet)
    for path in targets:
        bench.write_record(path, record)
    if json_path == "-":
        _emit_json("-", record)
    if csv_path:
        from kdtr.atomic import atomic_write

        atomic_write(csv_path, bench.bench_csv(record))
    from . import render

    if targets and not quiet:
        render.err.print(f"record: {', '.join(map(str, targets))}", markup=False, highlight=False)
    code = bench.exit_status(record)
    if old is not None:
        comparison = bench.compare_records(old, record, threshold)
        compare_view(comparison, str(compare), "this run", verbose=verbose, quiet=quiet)
        if comparison.regressions:
            code = EXIT_FAILED
    raise typer.Exit(code)


@app.command("report")
@guarded
def report_cmd(
    record_paths: List[Path] = typer.Argument(..., metavar="RECORD.json...",
                                              help="Records written by `kdtree bench --json` (or, with --merge, "
                                                   "by `kdtree verify --json`)."),
    merge: Optional[Path] = typer.Option(None, "--merge", help="Join the records (e.g. of --shard jobs) into "
                                                               "this one file; exit 1 if a merged case failed."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: roofline (achieved TFLOP/s against "
                                                             "intensity, measured ceilings) and latency against prefix."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV line per row here."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show every baseline's own row."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="One plain line per case."),
):
    """Show a bench record's table again; plot it (matplotlib), write its CSV, or merge shards' records."""
    from kdtr import bench
    from kdtr.atomic import atomic_write

    if merge:
        _merge(record_paths, merge)
    if len(record_paths) != 1:
        raise UsageError("give one record (or several with --merge OUT.json)")
    record = bench.load_record(record_paths[0])
    bench_view(record, verbose=verbose, quiet=quiet)
    if csv_path:
        atomic_write(csv_path, bench.bench_csv(record))
    if plot:
        from kdtr.plot import plot_record

        plot_record(record, plot)
        from . import render

        render.err.print(f"plot: {plot}", markup=False, highlight=False)


def _merge(paths: List[Path], out: Path) -> None:
    """Verify records merge into a verify record, bench records into a bench record; never both."""
    import json

    from kdtr import bench, report

    kinds = []
    for path in paths:
        try:
            kinds.append(json.loads(path.read_text(encoding="utf-8")).get("kind"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
            raise UsageError(f"not a kdtree record: {err}", file=path) from None
    if set(kinds) == {report.VERIFY_KIND}:
        from kdtr.verify import merge_verify

        merged = merge_verify(paths)
        report.write_json(out, merged)
        summary = merged.summary
        print(f"merged {len(paths)} verify records (shards {', '.join(merged.meta['shards'])}): "
              f"{summary['passed']} passed, {summary['failed']} failed, "
              f"{len(summary['errors'])} input errors -> {out}")
        raise typer.Exit(1 if summary["failed"] else (2 if summary["errors"] else 0))
    if set(kinds) == {bench.RECORD_KIND}:
        merged_bench = bench.merge_records([bench.load_record(p) for p in paths])
        bench.write_record(out, merged_bench)
        print(f"merged {len(paths)} bench records: {len(merged_bench.rows)} rows -> {out}")
        raise typer.Exit(0)
    raise UsageError(f"--merge takes records of one kind (verify or bench); got {sorted(map(str, set(kinds)))}")


# -- rendering ------------------------------------------------------------------------------------

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


def _pct(value: Optional[float]) -> str:
    if value is None:
        return "—"
    text = f"{100 * value:.0f}%" if value >= 0.1 else f"{100 * value:.1f}%"
    return f"[bold red]{text}![/]" if value > 1.0 else text


def _config(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _how(timing) -> str:
    if timing is None:
        return ""
    k = f"×{timing.calls_per_sample}" if timing.calls_per_sample > 1 else ""
    return (timing.mode if timing.method == timing.mode else f"{timing.mode} {timing.method}") + k


def _check(row) -> str:
    if row.skip:
        return "[dim]skip[/]"
    if row.check_passed is None:
        return ""
    return "[green]ok[/]" if row.check_passed else "[bold red]FAIL[/]"


def _header(record) -> list[str]:
    meta, device = record.meta, record.meta.get("device") or {}
    lines = []
    if record.settings.get("gpu"):
        after = meta.get("clocks_after") or {}
        clock = (f"SM clock {after.get('sm')} at the end" if after.get("sm")
                 else f"SM clock {device.get('clock_sm')} at the start")
        lines.append(f"[bold]{device.get('gpu')}[/] ({device.get('capability')}, driver {device.get('driver')}, "
                     f"{clock}, max {device.get('clock_sm_max')}), torch "
                     f"{device.get('torch')}, NVRTC {device.get('nvrtc')}, commit {str(meta.get('commit'))[:12]}"
                     f"{' (dirty)' if meta.get('dirty') else ''}")
    else:
        lines.append("[bold yellow]CPU run (no GPU): the torch backend timed on the host with perf_counter — "
                     "a smoke test of the tool, not kernel performance[/]")
    timing = record.settings.get("timing", {})
    lines.append(f"timer: {record.settings.get('timer')}; modes: {', '.join(record.settings.get('modes', []))}; "
                 f"budget {timing.get('budget_s')} s per implementation, target ±{100 * float(timing.get('target', 0)):.1f}%"
                 + (f"; implementations interleaved in rounds (at least {timing['min_rounds']}), ± = the larger of "
                    "the median's CI and the round-to-round CI" if timing.get("min_rounds") else ""))
    c = record.ceilings
    if c is not None:
        lines.append(f"ceilings measured in this run: HBM read {c.hbm_read_gbps:,.0f} GB/s, copy {c.hbm_copy_gbps:,.0f} "
                     f"GB/s (r+w), bf16 MMA {c.bf16_mma_tflops:,.0f} TFLOP/s, fp32 {c.fp32_fma_tflops:,.1f} TFLOP/s; "
                     f"L2 {c.l2_bytes / 2 ** 20:.0f} MiB (flush buffer 2x)")
    return lines


def sanity_table(rows) -> Table:
    table = Table(title="sanity cases (each timed twice, interleaved)", title_justify="left")
    for name in ("case", "impl", "how", "time", "±", "again", "agree", "GB/s", "% HBM", "note"):
        table.add_column(name, justify="left" if name in ("case", "impl", "how", "note") else "right")
    for r in rows:
        t = r.timing
        table.add_row(r.case, r.impl, _how(t), fmt_time(t.median if t else None),
                      f"{100 * t.rel_ci:.1f}%" if t else "", fmt_time(r.repeat.median if r.repeat else None),
                      "" if r.repeat_agrees is None else ("yes" if r.repeat_agrees else "[red]no[/]"),
                      _fig(r.gbps, 0), _pct(r.pct_bandwidth), r.check or "")
    return table


def bench_view(record, *, verbose: bool = False, quiet: bool = False) -> None:
    from . import render

    out = render.out
    primary_rows = [r for r in record.rows if r.primary]
    baselines = []
    for r in record.rows:
        if not r.primary and r.impl not in baselines:
            baselines.append(r.impl)
    if quiet:
        for r in record.sanity:
            t = r.timing
            print(f"sanity {r.case} {r.impl} {_how(t)} median={fmt_time(t.median if t else None)} "
                  f"again={fmt_time(r.repeat.median if r.repeat else None)} agree={r.repeat_agrees} "
                  f"pct_bw={'' if r.pct_bandwidth is None else f'{100 * r.pct_bandwidth:.0f}%'}")
        for r in record.rows if verbose else primary_rows:
            t = r.timing
            speed = " ".join(f"vs_{k}={v:.2f}x" for k, v in r.speedups.items())
            status = f"skip ({r.skip})" if r.skip else ("ok" if r.check_passed else f"FAIL ({r.check})")
            kernel = f" kernel={picked}" if (picked := _kernel(r)) else ""
            print(f"{r.impl} {r.op}/{r.variant} {r.case} {r.mode}{kernel} median={fmt_time(t.median if t else None)} "
                  f"noise={'' if t is None else f'{100 * t.rel_ci:.1f}%'} tflops={_fig(r.tflops)} "
                  f"gbps={_fig(r.gbps, 0)} {speed} {status}".rstrip())
        _footer(record, plain=True)
        return
    for line in _header(record):
        out.print(line)
    if record.sanity:
        out.print(sanity_table(record.sanity))
    by_case = {}
    for r in record.rows:
        by_case.setdefault((r.op, r.variant, r.case, r.mode), []).append(r)
    table = Table(title=f"kdtree bench — {record.primary} vs baselines (speedup = baseline median / ours)",
                  title_justify="left")
    columns = ["case", "config", "impl" if verbose else None, "how", "time", "±", "TFLOP/s", "GB/s", "% peak",
               "% HBM"] + [f"vs {b}" for b in baselines] + ["check"]
    for name in filter(None, columns):
        table.add_column(name, justify="left" if name in ("case", "config", "impl", "how") else "right",
                         no_wrap=name == "case")
    for (op, variant, case, mode), rows in by_case.items():
        shown = rows if verbose else [r for r in rows if r.primary]
        for r in shown:
            t = r.timing
            config = _config(r.config) + (f" · {picked}" if (picked := _kernel(r)) else "")
            cells = [f"{op}/{variant} {case}" if r.primary or not verbose else f"  {case}", config]
            if verbose:
                cells.append(r.impl)
            cells += [_how(t), fmt_time(t.median if t else None), f"{100 * t.rel_ci:.1f}%" if t else "",
                      _fig(r.tflops), _fig(r.gbps, 0), _pct(r.pct_compute), _pct(r.pct_bandwidth)]
            for b in baselines:
                other = next((o for o in rows if o.impl == b), None)
                if not r.primary or other is None:
                    cells.append("")
                elif b in r.speedups:
                    cells.append(f"{r.speedups[b]:.2f}×")
                elif other.skip:
                    cells.append("[dim]skip[/]")
                elif other.check_passed is False:
                    cells.append("[red]FAIL[/]")
                else:
                    cells.append("—")
            cells.append(_check(r))
            table.add_row(*cells)
    out.print(table)
    _footer(record, plain=False)


def _kernel(r) -> str | None:
    """The kernel our launch picked for this case (recorded by GPU runs), on our own rows only."""
    return (r.extra or {}).get("kernel") if r.impl == "cuda" else None


def _footer(record, *, plain: bool) -> None:
    from kdtr.bench import TIME_LIMIT_SKIP

    from . import render

    emit = print if plain else (lambda text: render.out.print(text, markup=False, highlight=False))
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
            print(f"{r.verdict.upper()} {r.op}/{r.variant} {r.case} {r.impl} {r.mode} {change}"
                  + (" REGRESSION" if r.regression else ""))
        for note in comparison.notes:
            print(f"note: {note}")
        print(summary)
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
                      f"[{style[r.verdict]}]{verdict}[/]" if r.verdict in style else verdict)
    render.out.print(table)
    for note in comparison.notes:
        render.out.print(f"note: {note}", markup=False, highlight=False)
    render.out.print(summary, markup=False, highlight=False)
