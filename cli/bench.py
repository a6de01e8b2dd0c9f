"""`kdtree bench`: options parsed into a kdtr.bench.Selection and BenchSettings, `run_bench`, the record rendered
(table, JSON, CSV) and judged (the exit code, --compare)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer
from kdtr.errors import UsageError

from .app import (EXIT_FAILED, EXIT_OK, BalanceFromOpt, DevicesOpt, JsonOut, MemLimitOpt, ShardCountOpt, ShardOpt,
                  app, check_writable, deduplicated, default_specs_dir, flag, guarded, mem_limit_bytes, note,
                  parse_devices_option, refuse_overwriting_inputs, shard_spec)

MAX_SECONDS = 7 * 24 * 3600     # a --time-budget or --time-limit past a week is a typo (1e308, inf)

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
    "every noise is under --target, or the --time-budget per implementation is spent (the record says "
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
    return [default_specs_dir() / "bench"]


def _devices(text: str | None, backend: str) -> tuple[str, ...] | None:
    """--devices as the workers' list (None: this process); the cuda backend needs a GPU for them."""
    from kdtr.impl.backends import resolve_backend

    devices = parse_devices_option(text, resolve_backend(backend))
    return tuple(devices) if devices else None


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
    shard_count: Optional[int] = ShardCountOpt,
    balance_from: Optional[Path] = BalanceFromOpt,
    devices: Optional[str] = DevicesOpt,
    quick: bool = flag("--quick", help="Smoke run for CI: the first 2 cases of each suite, a "
                                                     "0.1 s budget, 5% target, no compiler baselines."),
    mode: str = typer.Option("cold", "--mode", help="cold (L2 flushed or inputs rotated), hot (same inputs again), both."),
    backend: str = typer.Option("auto", "--backend", "-b",
                                help="cuda (our kernels, needs a GPU), torch (the torch backend), auto (cuda "
                                     "where a GPU exists, else torch on the CPU, host-timed)."),
    baseline: Optional[List[str]] = typer.Option(None, "--baseline", help="Only these baselines (repeatable): "
                                                 "torch, torch_compile, sdpa, cpu_heap; verify_attn bf16_paged: "
                                                 "torch_bf16, torch_compile_bf16, torch_fp32, torch_compile_fp32 "
                                                 "(not run unless named), sdpa."),
    no_baselines: bool = flag("--no-baselines", help="Time only our implementation (and --impl ones)."),
    impl: List[str] = typer.Option([], "--impl", help="Also time this implementation (repeatable; a built-in such "
                                   "as sglang_triton, an entry point of kdtree.implementations, or "
                                   "OP\\[/VARIANT]=module:fn / file.py:fn) in the cases it serves: a row of its "
                                   "own in the same interleaved rounds, checked against the reference with the "
                                   "op's tolerances first (a failing check: untimed, with the reason), speedup "
                                   "= its median / ours; one that cannot run here is skipped with the reason."),
    kernel: List[str] = typer.Option([], "--kernel", help="Time this kernel of ours (repeatable; needs the cuda "
                                     "backend): named kernels are timed against each other in one run, the first "
                                     "the reference of their speedups (`vs 1st`); only cases of their op and "
                                     "variant run. An unknown name gets the list of known ones."),
    define: List[str] = typer.Option([], "--define", help="KERNEL:KNOB=VALUE[,KNOB=VALUE]: also time KERNEL built "
                                     "with these compile-time defines, a row of its own, e.g. "
                                     "fp32_bf16x3[FX_NREG_S=232] (repeatable; with --kernel KERNEL, a knob A/B in "
                                     "one run). Builds of one kernel must give the same bytes, or they fail; a "
                                     "launch knob (verify_attn: SPLITS=N, the KV split count) is read by the "
                                     "launch, may round differently and is checked like another kernel."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="Seconds of samples per implementation: "
                                                "a case's rounds stop after this x its implementations "
                                                "\\[0.5; --quick 0.1]."),
    target: Optional[float] = typer.Option(None, "--target", help="Stop the rounds when every implementation's "
                                                                  "relative noise is below this \\[0.01; --quick 0.05]."),
    repeat: bool = flag("--repeat", help="Time our kernel a second time in the same interleaved "
                                                       "rounds; report whether the two medians agree within the noise."),
    no_sanity: bool = flag("--no-sanity", help="Skip the empty-kernel and copy sanity cases."),
    no_back_to_back: bool = flag("--no-back-to-back", help="Skip timing each implementation again alone after "
                                 "the interleaved rounds (the table quotes the slower of the two figures)."),
    lock_clocks: bool = flag("--lock-clocks", help="Lock the SM clock at the GPU's base (TDP) clock for the run "
                             "(NVML; reset afterwards, also on Ctrl-C); refused with one line where the driver "
                             "does not allow it."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds for the whole run, checked before "
                                                                         "each case and baseline: later ones are listed as "
                                                                         "not run / skipped (exit still 0 if all ran passed)."),
    json_path: Optional[str] = typer.Option(None, "--json", help="Write the record here ('-' = stdout); "
                                                                 "rewritten after every case while running."),
    save: bool = flag("--save", help="Also write the record to results/bench-<UTC time>.json."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV line per row here."),
    mem_limit: Optional[str] = MemLimitOpt,
    compare: Optional[Path] = typer.Option(None, "--compare", help="OLD.json: judge this run (or NEW.json) against it."),
    threshold: float = typer.Option(0.10, "--threshold", help="--compare: slower by more than this fraction "
                                                              "(beyond the noise) is a regression."),
    verbose: bool = flag("-v", "--verbose", help="Show every baseline's own row and timing details."),
    wide: bool = flag("--wide", help="Every column (config, timer, TFLOP/s and GB/s, each baseline)."),
    quiet: bool = flag("--quiet", "-q", help="One plain line per case (for shell loops)."),
):
    from kdtr import bench
    from kdtr.errors import UsageError

    if mode not in bench.MODES:
        raise UsageError(f"--mode {mode!r}: choose one of {', '.join(bench.MODES)}")
    if not threshold > 0:
        raise UsageError("--threshold must be > 0")
    paths = list(paths or [])
    refuse_overwriting_inputs({"--json": json_path, "--csv": csv_path}, [*paths, *([compare] if compare else [])])
    old = bench.load_record(compare) if compare else None
    json_out = JsonOut(json_path)      # with --json -, stdout carries the JSON alone
    if old is not None and len(paths) == 1 and paths[0].suffix == ".json":
        comparison = bench.compare_records(old, bench.load_record(paths[0]), threshold)
        with json_out.tables():
            from .bench_view import compare_view

            compare_view(comparison, str(compare), str(paths[0]), verbose=verbose, quiet=quiet)
        json_out.write(lambda: comparison)
        raise typer.Exit(EXIT_FAILED if comparison.regressions else EXIT_OK)
    if any(p.suffix == ".json" for p in paths):
        raise UsageError("a .json argument is only read with --compare OLD.json NEW.json")

    for option, value in (("--time-budget", time_budget), ("--time-limit", time_limit), ("--target", target)):
        if value is not None and not 0 < value <= MAX_SECONDS:
            raise UsageError(f"{option} {value}: must be a number of seconds in (0, {MAX_SECONDS}]"
                             if option != "--target" else f"--target {value}: must be a fraction > 0")
    impl = deduplicated(impl, "--impl")
    this_shard = shard_spec(shard, shard_count, balance_from)
    timing = bench.QUICK_TIMING if quick else bench.TimingOptions()
    if time_budget is not None:
        timing = replace(timing, budget_s=time_budget)
    if target is not None:
        timing = replace(timing, target=target)
    timing.check()
    from kdtr.impl import resolve_refs

    impls = resolve_refs(impl)      # each spec resolved once (one that does not: exit 2, up front)
    settings = bench.BenchSettings(backend=backend, mode=mode, timing=timing, impls=impls,
                                   baselines=() if no_baselines else (tuple(baseline) if baseline else None),
                                   quick=quick, repeat=repeat, sanity=not no_sanity, time_limit_s=time_limit,
                                   kernels=bench.kernel_builds(kernel, define), back_to_back=not no_back_to_back,
                                   lock_clocks=lock_clocks)
    targets = [p for p in (json_path if json_path and json_path != "-" else None,
                           bench.default_record_path() if save else None) if p]
    if save:
        check_writable(targets[-1], "--save")
    if csv_path:
        check_writable(csv_path, "--csv")
    selection = bench.Selection(tuple(paths or _default_specs()), pattern, this_shard,
                                _devices(devices, settings.backend))
    limit = mem_limit_bytes(mem_limit)

    def partial(record) -> None:       # the record so far, rewritten after every case
        for path in targets:
            bench.write_record(path, record)

    with json_out.tables():
        with _Progress(quiet) as progress:
            record = bench.run_bench(selection, settings, progress, mem_limit=limit,
                                     on_partial=partial if targets else None)
        if not json_out.to_stdout:
            from .bench_view import bench_view

            bench_view(record, verbose=verbose, quiet=quiet, wide=wide)
        for path in targets:
            bench.write_record(path, record)
        if csv_path:
            from kdtr.atomic import atomic_write

            atomic_write(csv_path, bench.bench_csv(record))
        from . import render

        if targets and not quiet:
            render.err.print(f"record: {', '.join(map(str, targets))}", markup=False, highlight=False)
        code = bench.exit_status(record)
        if old is not None:
            comparison = bench.compare_records(old, record, threshold)
            from .bench_view import compare_view

            compare_view(comparison, str(compare), "this run", verbose=verbose, quiet=quiet)
            if comparison.regressions:
                code = EXIT_FAILED
    _unmatched_baselines(baseline or [], record)
    if json_out.to_stdout:             # samples inline: no sidecar beside stdout
        from .app import write_stdout

        write_stdout(bench.record_text(record), "--json -")
    raise typer.Exit(code)


def _unmatched_baselines(named: list[str], record) -> None:
    """A --baseline no case has (a typo, another op's) is said, not silently ignored."""
    from kdtr.bench.run import unmatched_baselines

    unmatched, timed = unmatched_baselines(named, record)
    if unmatched:
        note(f"--baseline {', '.join(unmatched)}: no case here has a baseline of that name "
             f"(baselines in this run: {', '.join(timed) or 'none'})")
