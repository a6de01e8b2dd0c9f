"""`kdtree verify`: run each bundle's case on a backend and compare every output with the golden."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from kdtr.errors import KdtreeError, UsageError

from . import render
from .app import (EXIT_FAILED, EXIT_INPUT, EXIT_OK, BalanceFromOpt, DevicesOpt, JsonOpt, JsonOut, MemLimitOpt,
                  PatternOpt, QuietOpt, ShardCountOpt, ShardOpt, app, check_writable, deduplicated, flag, guarded,
                  mem_limit_bytes, note, parse_devices_option, refuse_overwriting_inputs)
from .app import shard_spec as resolve_shard


@app.command("verify")
@guarded
def verify_cmd(
    paths: List[str] = typer.Argument(None, help="Bundles or folders (every *.kdtr below) \\[default: goldens/]."),
    backend: str = typer.Option("auto", "--backend", "-b",
                                help="cuda (our kernels), torch (CPU or GPU), numpy (the reference), "
                                     "auto (cuda where a GPU exists, else torch)."),
    atol: Optional[float] = typer.Option(None, help="Override atol of every toleranced output."),
    rtol: Optional[float] = typer.Option(None, help="Override rtol of every toleranced output."),
    trials: int = typer.Option(0, min=0, help="Also re-run each case on N fresh random inputs from its generator."),
    determinism: bool = flag("--determinism", help="Run twice and report whether outputs are bitwise equal."),
    invariance: bool = flag("--invariance", help="Also re-run each case's requests one at a time, in another "
                            "batch order, and (our cuda kernels) with the split count forced to 1, and report "
                            "per case which invariances hold bitwise (batch, order, split) and, where one does "
                            "not, the worst difference in ulps and where (docs/invariance.md)."),
    pattern: Optional[str] = PatternOpt,
    shard: Optional[str] = ShardOpt,
    shard_count: Optional[int] = ShardCountOpt,
    balance_from: Optional[Path] = BalanceFromOpt,
    allow_empty_shard: bool = flag("--allow-empty-shard", help="With --shard: a shard that holds none of the "
                                   "selected bundles (more shards than bundles) writes an empty record and "
                                   "exits 0; without it, such a shard is refused (exit 2)."),
    devices: Optional[str] = DevicesOpt,
    kernel: List[str] = typer.Option([], "--kernel", help="Force this CUDA kernel (repeatable; an unknown name "
                                     "gets the list of known ones) for the cases whose op and variant have "
                                     "it, e.g. a fallback the launch would not pick on this GPU; other cases "
                                     "run the launch's own choice. The table's config shows the kernel."),
    define: List[str] = typer.Option([], "--define", help="Force this CUDA kernel built with these compile-time "
                                     "and launch knobs, KERNEL:KNOB=VALUE\\[,KNOB=VALUE...] as bench takes them "
                                     "(e.g. bf16_wgmma2:WG2_LPT=2, the segment schedule; one build a kernel); "
                                     "with --sanitize too. The table's config shows the build."),
    impl: List[str] = typer.Option([], "--impl", help="Run this implementation instead of the backend "
                                   "(repeatable): a built-in (cuda, torch, numpy, sglang_triton, sgl_kernel, "
                                   "flashinfer_fa2), an entry point of the kdtree.implementations group, or "
                                   "OP\\[/VARIANT]=module:fn / OP\\[/VARIANT]=file.py:fn. Each runs the bundles whose "
                                   "op and variant it serves (goldens and --trials), compared as ours are; the "
                                   "others are listed as not run. One that cannot run here is skipped with the "
                                   "reason (not a pass): exit 2 when nothing ran."),
    against: Optional[str] = typer.Option(None, "--against", help="Also run this implementation (a spec as for "
                                          "--impl) on the same inputs as the backend and report parity: max "
                                          "difference in bf16 ulps, mean, rel. L2, the worst element and where "
                                          "it sits in the tree. Exit 2 when it compared no case."),
    case_timeout: Optional[float] = typer.Option(None, "--case-timeout", help="Seconds one implementation may "
                                                 "take on one case (each run of it: prepare and call); past "
                                                 "it the row fails with the reason and the run goes on."),
    sanitize: Optional[str] = typer.Option(None, "--sanitize", help="Run the cuda backend under compute-sanitizer "
                                           "(memcheck, racecheck, synccheck or initcheck); any report fails its case."),
    quiet: bool = QuietOpt,
    verbose: bool = flag("-v", "--verbose", help="Show the worst elements of failing outputs and the raw max_rel."),
    keep_worst: bool = flag("--keep-worst", help="Keep passing outputs' worst elements in the record too."),
    json_path: Optional[str] = JsonOpt,
    mem_limit: Optional[str] = MemLimitOpt,
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
):
    """Run each bundle's case on a backend and compare every output with the golden.

    The table's "tol share" is the worst element's share of its tolerance, |x−r| / (atol + rtol·|r|),
    or of the gate every implementation but numpy and cuda is held to (docs/numerics.md): at most 1
    passes."""
    from kdtr.impl import backends
    from kdtr.verify import NothingRan, Options, Selection, check_kernels, run_verify

    json_out = JsonOut(json_path)
    check_writable(junit, "--junit")
    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not value >= 0:
            raise UsageError(f"{name} {value}: must be >= 0")
    if impl and backend != "auto":
        raise UsageError(f"--backend {backend} with --impl: --impl runs the given implementations instead of "
                         "a backend; give one or the other")
    impl = deduplicated(impl, "--impl")
    if case_timeout is not None and not 0 < case_timeout < 1e9:
        raise UsageError(f"--case-timeout {case_timeout}: must be > 0 seconds (and finite)")
    selection = Selection(tuple(paths or [Path("goldens")]), pattern, resolve_shard(shard, shard_count, balance_from))
    selected, files = selection.bundles()
    if repeats := selection.repeats():
        note(f"{repeats} bundle(s) named more than once: each is verified once")
    if allow_empty_shard and selection.shard is None:
        raise UsageError("--allow-empty-shard goes with --shard")
    if selected and not files:
        from kdtr.scaleout.parallel import Shard

        empty = f"shard {Shard.label(selection.shard)} holds none of the {len(selected)} selected bundles"
        if not allow_empty_shard:
            raise UsageError(f"{empty}: nothing to verify (more shards than bundles?); give "
                             "--allow-empty-shard where an empty shard is expected")
        note(f"{empty}: an empty record (--allow-empty-shard)")
    refuse_overwriting_inputs({"--json": json_path, "--junit": junit}, selected)
    resolved = backends.resolve_backend("cuda" if sanitize else backend)
    forced, knobs = check_kernels(kernel, resolved, define)
    limit = mem_limit_bytes(mem_limit)
    from kdtr.bundle import memory

    for name in dict.fromkeys(impl or [resolved]):   # built-ins named like a backend have its estimate
        memory.check_bundles(files, name, limit)
    refs = _implementations(impl, against, kernel or define, sanitize)
    if sanitize:
        if not files:
            raise selection.nothing_selected()
        _sanitized_verify(sanitize, files, atol, rtol, trials, forced, define, quiet, json_out)
    options = Options(backend=resolved, atol=atol, rtol=rtol, trials=trials, determinism=determinism,
                      kernels=forced, defines=knobs, keep_worst=keep_worst, impls=refs if impl else (),
                      against=refs[0] if against else None, case_timeout=case_timeout,
                      invariance=invariance)
    device_list = parse_devices_option(devices, resolved)
    if device_list:
        selection = replace(selection, devices=tuple(device_list))
    names = ", ".join(ref.name for ref in options.impls) or options.backend
    label = f"verify ({names}" + (f", {len(selection.devices)} workers)" if selection.devices else ")")
    nothing = None
    with json_out.tables():
        _say_ran_as(resolved, quiet)
        with render.progress_bar(label, quiet=quiet, line=lambda done: render.verify_lines(list(done.rows))) as bar:
            def progress(done) -> None:
                bar(done, done.total)
                if done.problem:
                    render.error(done.problem)
            try:
                record = run_verify(selection, options, progress)
            except NothingRan as err:
                record, nothing = err.record, err
        if record.rows or record.not_run:          # no table of nothing: the errors said it all
            render.verify_table(list(record.rows), quiet=quiet, verbose=verbose, not_run=list(record.not_run))
        if record.kernels is not None:
            render.kernel_summary(record.kernels)
    json_out.write(lambda: record)
    if junit:
        from kdtr.records import report
        from kdtr.atomic import atomic_write

        atomic_write(junit, report.junit_xml(record))
    if nothing is not None:
        raise nothing
    raise typer.Exit(EXIT_INPUT if record.errors else
                     (EXIT_FAILED if any(r.failed for r in record.rows) else EXIT_OK))


def _say_ran_as(backend: str, quiet: bool) -> None:
    """With KDTREE_GPU, a CUDA run says which GPU its kernels were chosen for (docs/gpus.md)."""
    from kdtr.records.report import ran_as

    label = ran_as() if backend == "cuda" and not quiet else None
    if label:
        print(f"ran as {label} (KDTREE_GPU)")


def _implementations(specs, against, kernel, sanitize):
    """--impl and --against resolved once (a spec that does not resolve: one line, exit 2), up front,
    as picklable records the run carries (worker processes too)."""
    if not specs and not against:
        return ()
    from kdtr.impl import resolve_refs

    if against and specs:
        raise UsageError("--against compares the backend with one implementation; it does not combine with --impl")
    if (specs or against) and (kernel or sanitize):
        raise UsageError("--kernel, --define and --sanitize run our backend; they do not combine with --impl or "
                         "--against")
    return resolve_refs([*specs, *([against] if against else [])])


def _sanitized_verify(tool, files, atol, rtol, trials, kernels, defines, quiet, json_out: JsonOut) -> None:
    """verify under compute-sanitizer in a child process; exits with the combined verdict."""
    from kdtr.records import report
    from kdtr.runtime import sanitize

    args = [str(f) for f in files] + [f"--trials={trials}"] + [f"--kernel={k}" for k in kernels]
    args += [f"--define={d}" for d in defines]
    args += [f"--atol={atol}"] if atol is not None else []
    args += [f"--rtol={rtol}"] if rtol is not None else []
    result = sanitize.SanitizeResult(tool)
    with json_out.tables():
        render.sanitize_view(sanitize.run(tool, args, result, cli_module=__package__), result, quiet=quiet)
    json_out.write(lambda: {"meta": report.record_meta(f"verify --sanitize {tool}"), "result": result})
    if result.errors is None and not result.cases:
        raise KdtreeError(f"compute-sanitizer {tool} produced no summary (child exit {result.returncode})")
    raise typer.Exit(EXIT_OK if result.passed else EXIT_FAILED)
