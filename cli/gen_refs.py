"""`kdtree gen-refs`: golden bundles from YAML suites, skipping the ones whose provenance is unchanged."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from kdtr.errors import KdtreeError

from . import render
from .app import (BalanceFromOpt, JsonOpt, JsonOut, PatternOpt, QuietOpt, ShardCountOpt, ShardOpt, app,
                  default_specs_dir, flag, guarded, shard_spec)


@app.command("gen-refs")
@guarded
def gen_refs_cmd(
    specs: List[Path] = typer.Argument(None, help="YAML suites or folders of them \\[default: specs/*.yaml, "
                                                  "else the suites kdtree ships]."),
    out: Path = typer.Option(Path("goldens"), "-o", "--out", help="Folder for goldens/<op>/<case>.kdtr."),
    pattern: Optional[str] = PatternOpt,
    force: bool = flag("--force", help="Rewrite bundles even when their provenance is unchanged."),
    prune: bool = flag("--prune", help="Remove stale bundles: ones in -o that these suites wrote and no "
                                       "case of theirs names now."),
    mem_limit: Optional[str] = typer.Option(None, "--mem-limit", help="Refuse a case whose memory estimate is over "
                                            "this (e.g. 8G) \\[default: KDTREE_MEM_LIMIT, else half of MemAvailable]."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Generate this many cases at once, in "
                                       "worker processes, at most one per core (never more at once than their "
                                       "memory estimates fit in --mem-limit) \\[default: the CPU count]."),
    shard: Optional[str] = ShardOpt,
    shard_count: Optional[int] = ShardCountOpt,
    balance_from: Optional[Path] = BalanceFromOpt,
    quiet: bool = QuietOpt,
    json_path: Optional[str] = JsonOpt,
):
    """Generate golden bundles from YAML suites (exact numpy references); skips fresh ones."""
    from kdtr.scaleout import parallel
    from kdtr.bundle import refs, spec
    from kdtr.records import report

    json_out = JsonOut(json_path)
    if out.exists() and not out.is_dir():
        raise KdtreeError(f"-o {out}: not a folder")
    this_shard = shard_spec(shard, shard_count, balance_from)
    suites = spec.load_suites(specs or [default_specs_dir()])
    cases = [(s, c) for s in suites for c in spec.select(s.cases, pattern)]
    cases = parallel.shard_items(cases, lambda sc: f"{sc[1].op}/{sc[1].name}", this_shard)
    if not cases:
        raise KdtreeError(f"no case matches -k {pattern!r}" if pattern else "the suites hold no cases")
    if json_path and json_path != "-":
        from kdtr.atomic import check_not_input

        check_not_input(json_path, "--json", [s.path for s in suites]
                        + [refs.bundle_path(out, case) for s in suites for case in s.cases])
    started = time.perf_counter()
    limit = refs.parse_bytes(mem_limit) if mem_limit else refs.default_mem_limit()
    cores = parallel.cpu_count()
    if jobs is not None and jobs > cores:
        render.err.print(f"--jobs {jobs}: capped at the {cores} cores this process may run on", markup=False)
    with json_out.tables():
        work = refs.gen_refs(cases, out, force=force, mem_limit=limit, jobs=min(jobs or cores, cores))
        results = list(render.progress(work, len(cases),
                                       "gen-refs", quiet=quiet, line=render.gen_line))
        render.gen_summary(results, time.perf_counter() - started, quiet=quiet)
    stale = refs.stale_bundles(out, suites)
    for path in refs.prune(stale) if prune else stale:
        render.err.print(f"{'removed' if prune else 'stale'}: {path} (no suite names this case"
                         + (")" if prune else "; --prune removes it)"), markup=False)
    json_out.write(lambda: {"meta": report.record_meta("gen-refs"), "results": results})
