"""`kdtree verify`: run each bundle's case on a backend and compare every output with the golden."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import List, Optional

import typer

from kdtr.errors import KdtreeError, UsageError

from . import render
from .app import (EXIT_FAILED, EXIT_INPUT, EXIT_OK, DevicesOpt, JsonOpt, JsonOut, MemLimitOpt, PatternOpt,
                  QuietOpt, ShardOpt, app, check_writable, deduplicated, flag, guarded, mem_limit_bytes, note,
                  parse_devices_option, refuse_overwriting_inputs)


@app.command("verify")
@guarded
def verify_cmd(
    paths: List[Path] = typer.Argument(None, help="Bundles or folders (every *.kdtr below) \\[default: goldens/]."),
    backend: str = typer.Option("auto", "--backend", "-b",
                                help="cuda (our kernels), torch (CPU or GPU), numpy (the reference), "
                                     "auto (cuda where a GPU exists, else torch)."),
    atol: Optional[float] = typer.Option(None, help="Override atol of every toleranced output."),
    rtol: Optional[float] = typer.Option(None, help="Override rtol of every toleranced output."),
    trials: int = typer.Option(0, min=0, help="Also re-run each case on N fresh random inputs from its generator."),
    determinism: bool = flag("--determinism", help="Run twice and report whether outputs are bitwise equal."),
    pattern: Optional[str] = PatternOpt,
    shard: Optional[str] = ShardOpt,
    devices: Optional[str] = DevicesOpt,
    kernel: List[str] = typer.Option([], "--kernel", help="Force this CUDA kernel (repeatable; an unknown name "
                                     "gets the list of known ones) for the cases whose op and variant have "
                                     "it, e.g. a fallback the launch would not pick on this GPU; other cases "
                                     "run the launch's own choice. The table's config shows the kernel."),
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

    The table's "tol share" is the worst element's share of its tolerance, |x−r| / (atol + rtol·|r|):
    at most 1 passes."""
    from kdtr import backends, parallel
    from kdtr.verify import Options, check_kernels, find_bundles, shard_key

    json_out = JsonOut(json_path)
    check_writable(junit, "--junit")
    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not value >= 0:
            raise UsageError(f"{name} {value}: must be >= 0")
    if impl and backend != "auto":
        raise UsageError(f"--backend {backend} with --impl: --impl runs the given implementations instead of "
                         "a backend; give one or the other")
    impl = deduplicated(impl, "--impl")
    shard_spec = parallel.Shard.parse(shard) if shard else None
    selected = _unique_bundles(find_bundles(paths or [Path("goldens")]))
    refuse_overwriting_inputs({"--json": json_path, "--junit": junit}, selected)
    if pattern:
        from kdtr.spec import name_matches    # YAML's import is not free: only for -k

        selected = [f for f in selected if name_matches(f.stem, pattern)]
    files = parallel.shard_items(selected, shard_key, shard_spec)
    resolved = backends.resolve_backend("cuda" if sanitize else backend)
    forced = check_kernels(kernel, resolved)
    limit = mem_limit_bytes(mem_limit)
    from kdtr import memory

    for name in dict.fromkeys(impl or [resolved]):   # built-ins named like a backend have its estimate
        memory.check_bundles(files, name, limit)
    impls = _implementations(impl, against, kernel, sanitize)
    if resolved == "cuda" and files and not devices and not impl:
        from kdtr.device import require_gpu

        require_gpu()                      # one line and exit 2 up front, not one per bundle
    if not files and (sanitize or not selected):   # an empty shard of a suite: an empty record
        raise KdtreeError("no bundles to verify" + (f" match -k {pattern!r}" if pattern else
                                                     " in this shard" if shard_spec else
                                                     " (run `kdtree gen-refs` first?)"))
    if sanitize:
        _sanitized_verify(sanitize, files, atol, rtol, trials, forced, quiet, json_out)
    options = Options(backend=resolved, atol=atol, rtol=rtol, trials=trials, determinism=determinism,
                      kernels=forced, keep_worst=keep_worst, impls=tuple(impl), against=against)
    device_list = parse_devices_option(devices)
    with json_out.tables():
        rows, errors, not_run = _run(files, options, device_list, quiet, verbose)
    _write_records(rows, errors, options, device_list, json_out, junit, selected, shard_spec, not_run, impls)
    if not errors:
        _nothing_ran(rows, options, not_run)
    raise typer.Exit(EXIT_INPUT if errors else (EXIT_FAILED if any(r.failed for r in rows) else EXIT_OK))


def _unique_bundles(files: list[Path]) -> list[Path]:
    """A bundle named twice (`verify goldens goldens`, a file and its folder) is verified once, and said so."""
    seen, unique = set(), []
    for file in files:
        key = file.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(file)
    if len(unique) != len(files):
        note(f"{len(files) - len(unique)} bundle(s) named more than once: each is verified once")
    return unique


def _implementations(specs, against, kernel, sanitize):
    """--impl and --against resolved (a spec that does not resolve: one line, exit 2), up front."""
    if not specs and not against:
        return ()
    from kdtr.impl import resolve_all

    if against and specs:
        raise UsageError("--against compares the backend with one implementation; it does not combine with --impl")
    if (specs or against) and (kernel or sanitize):
        raise UsageError("--kernel and --sanitize run our backend; they do not combine with --impl or --against")
    return resolve_all([*specs, *([against] if against else [])])


def _nothing_ran(rows, options, not_run) -> None:
    """A skip is not a pass: --impl with nothing run, or --against with nothing compared, is exit 2."""
    if options.impls and not any(r.skipped is None for r in rows):
        reasons = list(dict.fromkeys(r.skipped for r in rows)) or [
            f"no given implementation serves any of the {len(not_run)} bundles"]
        raise KdtreeError("nothing ran: " + "; ".join(reasons))
    if options.against and rows and not any(r.parity and not r.parity.get("reason") for r in rows):
        reasons = dict.fromkeys(r.parity["reason"] for r in rows if r.parity)
        raise KdtreeError(f"--against {options.against}: compared no case: " + "; ".join(reasons))


def _run(files, options, device_list, quiet: bool, verbose: bool):
    """Every bundle through verify_file (in worker processes with --devices); rows, errors and the
    bundles no given implementation serves."""
    from kdtr import parallel, report
    from kdtr.verify import crashed, verify_file

    if device_list:
        groups = parallel.balance(files, lambda f: f.stat().st_size, len(device_list))
        outcomes = parallel.map_on_devices(device_list, groups, functools.partial(verify_file, options=options),
                                           crashed)
    else:
        outcomes = (verify_file(file, options) for file in files)
    rows, errors, not_run = [], [], []
    names = ", ".join(options.impls) or options.backend
    label = f"verify ({names}" + (f", {len(device_list)} workers)" if device_list else ")")
    for outcome in render.progress(_with_files(files, outcomes, device_list), len(files), label,
                                          quiet=quiet, line=lambda outcome: render.verify_lines(outcome[1][0])):
        file, (found, problem) = outcome
        rows.extend(found)
        if problem:
            errors.append(problem)
            render.error(problem)
        elif options.impls and not found:
            not_run.append(f"{report.portable(file)}: served by none of {names}")
    if rows or not_run:                    # no table of nothing: the errors said it all
        render.verify_table(rows, quiet=quiet, verbose=verbose, not_run=not_run)
    return rows, errors, not_run


def _with_files(files, outcomes, device_list):
    """(file, outcome) pairs: in order in-process; with --devices, outcomes come as they finish."""
    if not device_list:
        yield from zip(files, outcomes)
        return
    yield from outcomes


def _write_records(rows, errors, options, device_list, json_out: JsonOut, junit: Path | None,
                   selected, shard_spec, not_run, impls) -> None:
    kernels = None
    if options.backend == "cuda" and not device_list and not options.impls:
        from kdtr.device import loaded_kernels

        kernels = loaded_kernels()
        with json_out.tables():
            render.kernel_summary(kernels)
    if json_out.path or junit:
        from kdtr import report
        from kdtr.atomic import atomic_write
        from kdtr.verify import implementation_info, suite_digest, verify_record

        record = verify_record(rows, errors, suite=suite_digest(selected), shard=shard_spec, kernels=kernels,
                               not_run=not_run, implementations={i.name: implementation_info(i) for i in impls})
        json_out.write(lambda: record)
        if junit:
            atomic_write(junit, report.junit_xml(record))


def _sanitized_verify(tool, files, atol, rtol, trials, kernels, quiet, json_out: JsonOut) -> None:
    """verify under compute-sanitizer in a child process; exits with the combined verdict."""
    from kdtr import report, sanitize

    args = [str(f) for f in files] + [f"--trials={trials}"] + [f"--kernel={k}" for k in kernels]
    args += [f"--atol={atol}"] if atol is not None else []
    args += [f"--rtol={rtol}"] if rtol is not None else []
    result = sanitize.SanitizeResult(tool)
    with json_out.tables():
        render.sanitize_view(sanitize.run(tool, args, result, cli_module=__package__), result, quiet=quiet)
    json_out.write(lambda: {"meta": report.record_meta(f"verify --sanitize {tool}"), "result": result})
    if result.errors is None and not result.cases:
        raise KdtreeError(f"compute-sanitizer {tool} produced no summary (child exit {result.returncode})")
    raise typer.Exit(EXIT_OK if result.passed else EXIT_FAILED)
