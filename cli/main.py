"""The `kdtree` command line: thin commands over the kdtr library, rendered with rich.

Exit codes everywhere: 0 all passed, 1 a case failed (or a bench regression), 2 bad usage or input,
130 interrupted.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from kdtr import __version__
from kdtr.errors import KdtreeError

from . import render

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Validate and benchmark the CUDA kernels of DDTree speculative decoding "
                       "(tree_build, verify_attn, tree_accept) against exact golden bundles.")

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
_state = {"debug": False}


def guarded(command):
    """Map kdtree's errors to one stderr line and exit 2, Ctrl-C to exit 130 (tracebacks: --debug)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KdtreeError as err:
            if _state["debug"]:
                raise
            render.error(str(err))
            raise typer.Exit(EXIT_INPUT) from None
        except KeyboardInterrupt:
            render.error("interrupted; no partial file was left under a final name")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    return wrapper


def _version(value: bool):
    if value:
        typer.echo(f"kdtree {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
):
    _state["debug"] = debug


JsonOpt = typer.Option(None, "--json", help="Write a machine-readable record here ('-' = stdout).")
PatternOpt = typer.Option(None, "-k", help="Only cases whose name contains PATTERN (or matches a * ? glob).")
QuietOpt = typer.Option(False, "--quiet", "-q", help="One plain line per case (for shell loops).")
ShardOpt = typer.Option(None, "--shard", help="Run only shard I of N (1-based, e.g. 2/4): a stable split "
                                              "by case-name hash, so N CI jobs cover the suite exactly once.")
DevicesOpt = typer.Option(None, "--devices", help="One worker process per GPU: 'all' or indices like 0,1 "
                                                  "(cases spread by estimated cost, one merged table).")


@app.command("gen-refs")
@guarded
def gen_refs_cmd(
    specs: List[Path] = typer.Argument(None, help="YAML suites or folders of them \\[default: specs/*.yaml]."),
    out: Path = typer.Option(Path("goldens"), "-o", "--out", help="Folder for goldens/<op>/<case>.kdtr."),
    pattern: Optional[str] = PatternOpt,
    force: bool = typer.Option(False, "--force", help="Rewrite bundles even when their provenance is unchanged."),
    prune: bool = typer.Option(False, "--prune", help="Remove stale bundles: ones in -o that no suite's case names."),
    mem_limit: Optional[str] = typer.Option(None, "--mem-limit", help="Refuse a case whose memory estimate is over "
                                            "this (e.g. 8G) \\[default: half of MemAvailable]."),
    shard: Optional[str] = ShardOpt,
    quiet: bool = QuietOpt,
    json_path: Optional[str] = JsonOpt,
):
    """Generate golden bundles from YAML suites (exact numpy references); skips fresh ones."""
    from kdtr import parallel, refs, report, spec

    shard_spec = parallel.Shard.parse(shard) if shard else None
    suites = spec.load_suites(specs or [spec.DEFAULT_SPECS])
    cases = [(s, c) for s in suites for c in spec.select(s.cases, pattern)]
    cases = parallel.shard_items(cases, lambda sc: f"{sc[1].op}/{sc[1].name}", shard_spec)
    if not cases:
        raise KdtreeError(f"no case matches -k {pattern!r}" if pattern else "the suites hold no cases")
    started = time.perf_counter()
    limit = refs.parse_bytes(mem_limit) if mem_limit else refs.default_mem_limit()
    results = list(render.progress(refs.gen_refs(cases, out, force=force, mem_limit=limit), len(cases),
                                   "gen-refs", quiet=quiet, line=render.gen_line))
    render.gen_summary(results, time.perf_counter() - started, quiet=quiet)
    stale = refs.stale_bundles(out, suites)
    for path in refs.prune(stale) if prune else stale:
        render.err.print(f"{'removed' if prune else 'stale'}: {path} (no suite names this case"
                         + (")" if prune else "; --prune removes it)"), markup=False)
    if json_path:
        _emit_json(json_path, {"meta": report.record_meta("gen-refs"), "results": results})


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
    determinism: bool = typer.Option(False, "--determinism", help="Run twice and report whether outputs are bitwise equal."),
    pattern: Optional[str] = PatternOpt,
    shard: Optional[str] = ShardOpt,
    devices: Optional[str] = DevicesOpt,
    kernel: List[str] = typer.Option([], "--kernel", help="Force this CUDA kernel (repeatable; an unknown name "
                                     "gets the list of known ones) for the cases whose op and variant have "
                                     "it, e.g. a fallback the launch would not pick on this GPU; other cases "
                                     "run the launch's own choice. The table's config shows the kernel."),
    sanitize: Optional[str] = typer.Option(None, "--sanitize", help="Run the cuda backend under compute-sanitizer "
                                           "(memcheck, racecheck, synccheck or initcheck); any report fails its case."),
    quiet: bool = QuietOpt,
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show the worst elements of failing outputs."),
    keep_worst: bool = typer.Option(False, "--keep-worst", help="Keep passing outputs' worst elements too."),
    json_path: Optional[str] = JsonOpt,
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
):
    """Run each bundle's case on a backend and compare every output with the golden."""
    from kdtr import backends, parallel, report, spec
    from kdtr.atomic import atomic_write
    from kdtr.verify import (Options, check_kernels, crashed, find_bundles, shard_key, suite_digest,
                             verify_file, verify_record)

    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not value >= 0:
            raise typer.BadParameter(f"{name} must be >= 0", param_hint=name)
    shard_spec = parallel.Shard.parse(shard) if shard else None
    selected = [f for f in find_bundles(paths or [Path("goldens")]) if spec.name_matches(f.stem, pattern)]
    files = parallel.shard_items(selected, shard_key, shard_spec)
    resolved = backends.resolve_backend("cuda" if sanitize else backend)
    forced = check_kernels(kernel, resolved)
    if resolved == "cuda" and files and not devices:
        from kdtr.device import require_gpu

        require_gpu()                      # one line and exit 2 up front, not one per bundle
    if not files and (sanitize or not selected):   # an empty shard of a suite: an empty record
        raise KdtreeError("no bundles to verify" + (f" match -k {pattern!r}" if pattern else
                                                     " in this shard" if shard_spec else
                                                     " (run `kdtree gen-refs` first?)"))
    if sanitize:
        _sanitized_verify(sanitize, files, atol, rtol, trials, forced, quiet, json_path)
    options = Options(backend=resolved, atol=atol, rtol=rtol, trials=trials, determinism=determinism,
                      kernels=forced, keep_worst=keep_worst)
    device_list = parallel.parse_devices(devices, _gpu_count())
    if device_list:
        groups = parallel.balance(files, lambda f: f.stat().st_size, len(device_list))
        outcomes = (result for _, result in parallel.map_on_devices(
            device_list, groups, functools.partial(verify_file, options=options), crashed))
    else:
        outcomes = (verify_file(file, options) for file in files)
    rows, errors = [], []
    label = f"verify ({options.backend}" + (f", {len(device_list)} workers)" if device_list else ")")
    for batch, problem in render.progress(outcomes, len(files), label, quiet=quiet,
                                          line=lambda outcome: render.verify_lines(outcome[0])):
        rows.extend(batch)
        if problem:
            errors.append(problem)
            render.error(problem)
    render.verify_table(rows, quiet=quiet, verbose=verbose)
    kernels = _kernel_report() if options.backend == "cuda" and not device_list else None
    if kernels is not None:
        hits = sum(k["cache_hit"] for k in kernels)
        print(f"kernels: {len(kernels)} loaded, {len(kernels) - hits} compiled, {hits} from the cubin cache")
    record = verify_record(rows, errors, suite=suite_digest(selected), shard=shard_spec, kernels=kernels)
    if json_path:
        _emit_json(json_path, record)
    if junit:
        atomic_write(junit, report.junit_xml(record))
    code = EXIT_INPUT if errors else (EXIT_FAILED if any(not r.passed for r in rows) else EXIT_OK)
    raise typer.Exit(code)


@app.command("inspect")
@guarded
def inspect_cmd(
    file: Path = typer.Argument(..., help="A .kdtr bundle."),
    json_path: Optional[str] = JsonOpt,
):
    """A bundle's header, and per tensor: role, dtype, shape, min/max/mean, NaN/Inf counts."""
    from kdtr.summary import summarize

    _show(summarize(file), json_path, render.inspect_view)


@app.command("doctor")
@guarded
def doctor_cmd(json_path: Optional[str] = JsonOpt):
    """Versions, NVRTC, CUDA headers, GPUs and the cache folder: what kdtree can do here."""
    from kdtr import doctor

    _show(doctor.facts(), json_path, render.doctor_view)


@app.command("build")
@guarded
def build_cmd(
    arch: List[str] = typer.Option(["sm_90"], "--arch", help="Target architecture(s), e.g. sm_90 sm_90a sm_120."),
    json_path: Optional[str] = JsonOpt,
):
    """Compile every kernel with NVRTC (no GPU needed) and report registers, shared memory, spills."""
    from kdtr import nvrtc, report

    modules = []
    for source in nvrtc.kernel_files():
        for target in arch:
            modules.append(nvrtc.compile_kernel(source, target))
    render.build_table(modules)
    if json_path:
        _emit_json(json_path, {"meta": report.record_meta("build"), "nvrtc": list(nvrtc.nvrtc_version()),
                               "modules": [{"source": m.source.name, "arch": m.arch, "cache_hit": m.cache_hit,
                                            "resources": m.resources} for m in modules]})


def _sanitized_verify(tool, files, atol, rtol, trials, kernels, quiet, json_path) -> None:
    """verify under compute-sanitizer in a child process; exits with the combined verdict."""
    from kdtr import report, sanitize

    args = [str(f) for f in files] + [f"--trials={trials}"] + [f"--kernel={k}" for k in kernels]
    args += [f"--atol={atol}"] if atol is not None else []
    args += [f"--rtol={rtol}"] if rtol is not None else []
    result = sanitize.SanitizeResult(tool)
    for case in sanitize.run(tool, args, result):
        if not quiet or not case.passed:
            print(("" if case.passed else "SANITIZER ") + case.line, flush=True)
        for line in case.reports:
            print(f"    {line}", flush=True)
    for line in result.unattributed:
        print(f"    (no case) {line}", flush=True)
    summary = (f"compute-sanitizer {tool}: {result.errors if result.errors is not None else 'no'} errors reported; "
               f"{sum(c.passed for c in result.cases)} passed, {sum(not c.passed for c in result.cases)} failed; "
               f"child exit {result.returncode}")
    print(summary)
    if json_path:
        _emit_json(json_path, {"meta": report.record_meta(f"verify --sanitize {tool}"), "result": result})
    if result.errors is None and not result.cases:
        raise KdtreeError(f"compute-sanitizer {tool} produced no summary (child exit {result.returncode})")
    raise typer.Exit(EXIT_OK if result.passed else EXIT_FAILED)


def _kernel_report() -> list[dict]:
    from kdtr.device import loaded_kernels

    return loaded_kernels()


def _gpu_count() -> int:
    from kdtr.device import gpu_available

    if not gpu_available():
        return 0
    import torch

    return torch.cuda.device_count()


def _show(data, json_path: str | None, view) -> None:
    """The JSON record where asked, and the rich view unless the JSON took stdout."""
    if json_path:
        _emit_json(json_path, data)
    if json_path != "-":
        view(data)


def _emit_json(path: str, record) -> None:
    from kdtr import report

    if path == "-":
        import json

        sys.stdout.write(json.dumps(report.plain(record), indent=2, allow_nan=False) + "\n")
    else:
        report.write_json(path, record)


from . import e2e as _e2e  # noqa: E402,F401  (registers e2e)


def _terminate(signum, frame):
    """A kill (SIGTERM) takes the Ctrl-C path: temp files are removed, exit 130."""
    raise KeyboardInterrupt

from . import bench as _bench  # noqa: E402,F401  (registers bench, report)


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    app()
