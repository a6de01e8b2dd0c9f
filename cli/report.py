"""`kdtree report`: verify and bench records read back (kdtr.records.record tells their kind) and rendered
again: the table, a CSV and a plot of a bench record, shards merged, GPUs compared, an HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kdtr.errors import UsageError

from . import render
from .app import EXIT_FAILED, EXIT_INPUT, EXIT_OK, app, check_writable, flag, guarded, refuse_overwriting_inputs


@app.command("report")
@guarded
def report_cmd(
    record_paths: List[Path] = typer.Argument(..., metavar="RECORD.json...",
                                              help="Records written by `kdtree bench --json` or `kdtree verify "
                                                   "--json`."),
    merge: Optional[Path] = typer.Option(None, "--merge", help="Join the records (e.g. of --shard jobs) into "
                                                               "this one file; exit 1 if a merged case failed."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: roofline (achieved TFLOP/s against "
                                                             "intensity, measured ceilings) and latency against prefix."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV line per row here."),
    compare_gpus: bool = flag("--compare-gpus", help="Bench records of different GPUs side by side: the cases the "
                              "first shares with another (matched on case name, implementation, mode and every "
                              "parameter), each "
                              "one's time, TFLOP/s or GB/s and % of its own GPU's ceilings measured in its own "
                              "run, and the speed ratio to the first record. A record timed on the host CPU "
                              "(no GPU, no ceilings) is refused (exit 2)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write one self-contained HTML page (inline CSS and "
                                        "SVG, no network) of these verify and bench records: tables, roofline, "
                                        "latency against prefix, peers, the GPU comparison of several bench "
                                        "records, and each record's provenance."),
    verbose: bool = flag("-v", "--verbose", help="Show every baseline's own row (verify: the worst elements)."),
    wide: bool = flag("--wide", help="Every column (config, timer, TFLOP/s and GB/s, each baseline)."),
    quiet: bool = flag("--quiet", "-q", help="One plain line per case."),
):
    """Show a verify or bench record's table again; plot a bench record (matplotlib), write its CSV,
    merge shards' records, compare GPUs or write an HTML report."""
    refuse_overwriting_inputs({"--merge": merge, "--csv": csv_path, "--plot": plot, "--html": html}, record_paths)
    for option, path in (("--merge", merge), ("--csv", csv_path), ("--plot", plot)):
        check_writable(path, option)
    if plot:
        from kdtr.reports.plot import require_matplotlib

        require_matplotlib()           # before the CSV is written, not after
    if merge:
        _merge(record_paths, merge)
    check_writable(html, "--html")
    if compare_gpus:
        _compare_gpus(record_paths)
    if html:
        _html(record_paths, html)
    if compare_gpus or html:
        return
    if len(record_paths) != 1:
        raise UsageError("give one record (or several with --merge OUT.json, --compare-gpus or --html)")
    from kdtr import bench
    from kdtr.records.record import load_any
    from kdtr.verify import VerifyRecord

    record = load_any(record_paths[0])
    if isinstance(record, VerifyRecord):
        for option, given in (("--csv", csv_path), ("--plot", plot)):
            if given:
                raise UsageError(f"{option} is for bench records; this is a verify record", file=record_paths[0])
        _verify_view(record, verbose=verbose, quiet=quiet)
        return
    from .bench_view import bench_view

    bench_view(record, verbose=verbose, quiet=quiet, wide=wide)
    if csv_path:
        from kdtr.atomic import atomic_write

        atomic_write(csv_path, bench.bench_csv(record))
    if plot:
        from kdtr.reports.plot import plot_record

        plot_record(record, plot)
        render.err.print(f"plot: {plot}", markup=False, highlight=False)


def _verify_view(record, *, verbose: bool, quiet: bool) -> None:
    """A verify record as `kdtree verify` printed it: its lines (--quiet) or table, the bundles that
    could not be verified, the kernels loaded."""
    rows = list(record.rows)
    if quiet and rows:
        render.plain(render.verify_lines(rows))
    for problem in record.errors:
        render.plain(f"ERROR {problem}")
    if rows or record.not_run:
        render.verify_table(rows, quiet=quiet, verbose=verbose, not_run=list(record.not_run))
    if record.kernels is not None:
        render.kernel_summary(list(record.kernels))


def _compare_gpus(paths: List[Path]) -> None:
    from kdtr import bench
    from kdtr.records import report
    from kdtr.reports.gpu_compare import compare_gpus

    from .gpu_view import gpu_comparison_view

    gpu_comparison_view(compare_gpus([bench.load_record(p) for p in paths], [report.portable(p) for p in paths]))


def _html(paths: List[Path], out: Path) -> None:
    from kdtr.reports.html_report import write_html_report

    write_html_report(paths, out)
    render.err.print(f"html: {out}", markup=False, highlight=False)


def _merge(paths: List[Path], out: Path) -> None:
    """Verify records merge into a verify record, bench records into a bench record; never both."""
    from kdtr import bench
    from kdtr.records import report
    from kdtr.records.record import BENCH_KIND, VERIFY_KIND, read_json, record_kind

    kinds = {record_kind(read_json(path), path) for path in paths}
    if kinds == {VERIFY_KIND}:
        from kdtr.verify import merge_verify

        merged = merge_verify(paths)
        report.write_json(out, merged)
        summary = merged.summary
        render.plain(f"merged {len(paths)} verify records (shards {', '.join(merged.meta['shards'])}): "
                     f"{summary['passed']} passed, {summary['failed']} failed, "
                     f"{len(summary['errors'])} input errors -> {out}")
        raise typer.Exit(EXIT_FAILED if summary["failed"] else (EXIT_INPUT if summary["errors"] else EXIT_OK))
    if kinds == {BENCH_KIND}:
        merged_bench = bench.merge_shards([bench.load_record(p) for p in paths], [report.portable(p) for p in paths])
        bench.write_record(out, merged_bench)
        render.plain(f"merged {len(paths)} bench records (shards {', '.join(merged_bench.meta['shards'])}): "
                     f"{len(merged_bench.rows)} rows -> {out}")
        raise typer.Exit(EXIT_OK)
    raise UsageError(f"--merge takes records of one kind (verify or bench); got {sorted(kinds)}")
