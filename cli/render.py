"""Rich rendering for the CLI: tables and data to stdout, diagnostics and progress to stderr.

Colour is off with NO_COLOR or when the stream is not a terminal (rich's own rules). Everything
printed is literal: the consoles parse no markup and no emoji (a case named `[/x]` or a spec
`f.py:accept` prints as written), styles come only from `styled`, and control characters (terminal
escape codes among them) print as visible escapes (`\x1b`). `plain` is the same for print() lines.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kdtr.records.report import visible

PIPE_WIDTH = 200               # tables written to a file or pipe are not squeezed to 80 columns


class LiteralConsole(Console):
    """A console that prints every string as written: no markup, no emoji, control characters visible."""

    def __init__(self, **kwargs):
        super().__init__(markup=False, emoji=False, highlight=False, soft_wrap=True, **kwargs)

    def render_str(self, text: str, **kwargs) -> Text:     # every str a print or a table cell renders
        return super().render_str(visible(text), **kwargs)


def styled(text: str, style: str) -> Text:
    """`text`, literally, in `style`: the one way a view colours something."""
    return Text(visible(text), style=style)


def plain(text: str) -> None:
    """One print() line (quiet mode, shell loops), control characters made visible."""
    print(visible(text), flush=True)


out = LiteralConsole(width=None if sys.stdout.isatty() else PIPE_WIDTH)
err = LiteralConsole(stderr=True)
T = TypeVar("T")


def error(message: str) -> None:
    """The one error line on stderr. It cannot fail on what the message holds: the message is
    printed literally, its control characters and newlines escaped."""
    text = visible(message, one_line=True)
    if err.is_terminal:
        err.print(Text.assemble(styled("kdtree: error:", "bold red"), " ", text))
    else:
        err.file.write(f"kdtree: error: {text}\n")
        err.file.flush()


def progress(items: Iterable[T], total: int, label: str, *, quiet: bool,
             line: Callable[[T], str | None]) -> Iterator[T]:
    """A progress bar on stderr (terminals only); with --quiet, one plain stdout line per item."""
    with progress_bar(label, quiet=quiet, line=line) as advance:
        for item in items:
            advance(item, total)
            yield item


@contextlib.contextmanager
def progress_bar(label: str, *, quiet: bool, line: Callable[[T], str | None]) -> Iterator[Callable[[T, int], None]]:
    """progress() for a library that reports by callback: yields `advance(item, total)`."""
    if quiet:
        def say(item: T, total: int) -> None:
            text = line(item)
            if text:
                plain(text)
        yield say
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)
    with bar:
        task = bar.add_task(label, total=None)

        def advance(item: T, total: int) -> None:
            bar.update(task, total=total, advance=1)
        yield advance


def _num(value: float) -> str:
    return "0" if value == 0 else f"{value:.2e}"


def _config(config: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


# -- gen-refs ------------------------------------------------------------------------------------
def gen_line(result) -> str:
    return f"{result.status.upper():7} {result.path}"


def gen_summary(results, seconds: float, *, quiet: bool) -> None:
    written = sum(r.status == "written" for r in results)
    fresh = len(results) - written
    size = sum(r.nbytes for r in results) / 1e6
    message = (f"gen-refs: {written} written, {fresh} fresh (skipped), {len(results)} bundles, "
               f"{size:.1f} MB, {seconds:.1f} s")
    (plain if quiet else out.print)(message)


# -- verify --------------------------------------------------------------------------------------
def _no_golden(row) -> bool:
    """A golden's row (trial 0) compared with a reference computed here: the bundle stores none."""
    return not row.trial and row.expected_from != "golden"


def _row_name(row) -> str:
    return row.case + (f" #{row.trial}" if row.trial else "") + (" (captured)" if row.captured else "") \
        + ("†" if _no_golden(row) else "")


def _verdict(row) -> str:
    return "SKIP" if row.skipped is not None else ("PASS" if row.passed else "FAIL")


def _reason(row) -> str:
    if row.skipped is not None:
        return f"skipped: {row.skipped}"
    return row.error or "; ".join(f"{o.name}: {o.reason}" for o in row.outputs if not o.passed)


def _measured(row) -> bool:
    """Whether the row has figures: outputs were compared (an error or a skip compared none)."""
    return bool(row.outputs) or row.skipped is None and row.error is None


def verify_lines(rows) -> str | None:
    lines = []
    for row in rows:
        reason = "" if row.passed else " " + _reason(row)
        share = _tol_share(row)
        figures = (f" max_abs={_num(row.worst('max_abs'))} rel_l2={_num(row.worst('rel_l2'))}"
                   + ("" if share is None else f" tol_share={_share(share)}")) if _measured(row) else ""
        lines.append(f"{_verdict(row)} {row.op}/{row.variant} {_row_name(row)}"
                     + (f" [{row.impl}]" if row.impl else "") + figures
                     + (" loosened" if getattr(row, "loosened", False) else "") + reason)
    return "\n".join(lines) or None


def _share(value: float | None) -> str:
    """A tolerance share: <= 1 passes; inf where a NaN/Inf (or an exact output) mismatches."""
    if value is None:
        return "—"
    return "0" if value == 0 else ("inf" if value == float("inf") else f"{value:.3g}")


def _tol_share(row) -> float | None:
    # kdtr.ops.compare.OutputCheck.tol_share is new; bundles verified by an older kdtr lack it
    shares = [s for s in (getattr(o, "tol_share", None) for o in row.outputs) if s is not None]
    return max(shares, default=None)


def verify_summary(rows, not_run=()) -> str:
    passed, failed = sum(r.passed for r in rows), sum(r.failed for r in rows)
    skipped = sum(r.skipped is not None for r in rows)
    return (f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
            + (f", {len(not_run)} bundles not run" if not_run else ""))


def verify_table(rows, *, quiet: bool, verbose: bool, not_run=()) -> None:
    from kdtr.verify import DEVICE_REFERENCE

    summary = verify_summary(rows, not_run)
    if quiet:
        for row in rows:
            if getattr(row, "invariance", None):
                cells = "  ".join(f"{name}={_invariance_cell(v)}" for name, v in row.invariance.items())
                plain(f"INVARIANCE {_row_name(row)} {row.impl or row.backend}: {cells}")
        for line in not_run:
            plain(f"NOT RUN {line}")
        plain(summary)
        return
    impls = list(dict.fromkeys(r.impl for r in rows if r.impl and not r.captured))
    title = f"implementation{'s' if len(impls) > 1 else ''} {', '.join(impls)}" if impls \
        else f"backend {rows[0].backend if rows else '?'}"
    caption = ("tol share = max |x−r| / (atol + rtol·|r|, or the gate: docs/numerics.md), at most 1 passes; "
               "* = the bundle's tolerance is looser than the op's default")
    if any(map(_no_golden, rows)):
        caption += "; † = compared with the reference computed here (the bundle stores no golden)"
    if any(r.expected_from == DEVICE_REFERENCE for r in rows):
        caption += "; trials (and † rows) of ops with a float64 torch reference were compared with it, on the GPU"
    table = Table(title=f"kdtree verify — {title}", title_justify="left", caption=caption, caption_justify="left")
    columns = ["case"] + (["impl"] if any(r.impl for r in rows) else []) + ["op", "variant", "config", "max_abs",
                                                                          "tol share", "‖x−r‖/‖r‖"]
    columns += ["max_rel"] if verbose else []
    for name in columns + ["mismatches", "det", "verdict"]:
        table.add_column(name, justify="left" if name in ("case", "impl", "op", "variant", "config") else
                         "center" if name in ("det", "verdict") else "right", no_wrap=name in ("case", "verdict"))
    for row in rows:
        det = "" if row.deterministic is None else ("yes" if row.deterministic else "NO")
        style = "green" if row.passed else ("yellow" if row.skipped is not None else "bold red")
        loosened = "*" if getattr(row, "loosened", False) else ""
        cells = [_row_name(row)] + ([row.impl or row.backend] if "impl" in columns else [])
        figures = [_num(row.worst("max_abs")), _share(_tol_share(row)) + loosened, _num(row.worst("rel_l2"))]
        figures += [_num(row.worst("max_rel"))] if verbose else []
        figures += [str(row.mismatches)]
        cells += [row.op, row.variant, _config(row.config), *(figures if _measured(row) else ["—"] * len(figures))]
        table.add_row(*cells, det, styled(_verdict(row), style))
    out.print(table)
    if any(r.parity is not None for r in rows):
        parity_table(rows)
    if any(getattr(r, "invariance", None) for r in rows):
        invariance_table(rows)
    for row in rows:
        if row.passed:
            continue
        if row.skipped is not None:
            out.print(Text.assemble(styled("SKIP", "yellow"), visible(
                f" {row.file} ({_row_name(row)}{', ' + row.impl if row.impl else ''}): {row.skipped}")))
            continue
        out.print(Text.assemble(styled("FAIL", "bold red"), visible(
            f" {row.file} ({_row_name(row)}{', ' + row.impl if row.impl else ''}):")))
        if row.error:
            out.print(f"  {row.error}")
        for check in row.outputs:
            if check.passed:
                continue
            out.print(f"  {check.name}: {check.reason}")
            if verbose:
                for e in check.worst:
                    out.print(f"    [{', '.join(map(str, e.index))}] got {e.got!r} expected {e.expected!r}")
    nondet = [r for r in rows if r.deterministic is False]
    if nondet:
        out.print(Text.assemble(styled("not deterministic:", "yellow"),
                                visible(f" {', '.join(_row_name(r) for r in nondet)}")))
    for line in not_run:
        out.print(f"not run: {line}")
    out.print(summary)


def _invariance_cell(verdict: dict) -> str:
    """kdtr.verify.invariance.Verdict.to_plain() in a few words: yes, n/a (why), or the worst difference."""
    if verdict.get("holds") is None:
        return f"n/a ({verdict.get('reason')})"
    if verdict["holds"]:
        return "yes"
    worst = verdict.get("worst")
    if not worst:
        return f"no ({verdict.get('reason')})"
    from kdtr.verify.invariance import ulps_text

    ulps = worst["ulps"]
    ulps = ulps_text(ulps) if isinstance(ulps, (int, float)) else str(ulps)
    return f"no: {ulps} ulp in {worst['output']}, request {worst['request']} at {worst['index']}"


def invariance_table(rows) -> None:
    """--invariance: per case and implementation, which invariances hold bitwise."""
    table = Table(title="invariance — bitwise against the batched run (ulps: of the output's dtype at the "
                        "element's magnitude, floored at the output's RMS; at: row, then element, within the "
                        "request)", title_justify="left")
    names = ("batch", "order", "split")
    for name in ("case", "impl") + names:
        table.add_column(name, justify="left", overflow="fold")
    for row in rows:
        if getattr(row, "invariance", None):
            table.add_row(_row_name(row), row.impl or row.backend,
                          *(_invariance_cell(row.invariance[n]) for n in names if n in row.invariance))
    out.print(table, markup=False)


def _where(position: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in position.items())


def parity_table(rows) -> None:
    """--against: per row and output, how far the other implementation is from ours."""
    first = next(r.parity for r in rows if r.parity is not None)
    table = Table(title=f"parity — {rows[0].backend} vs {first['theirs']} (ulps: of bf16 at the "
                        "reference's magnitude)", title_justify="left")
    for name in ("case", "output", "max ulps", "mean |a−b|", "‖a−b‖/‖r‖", "worst at", "ours", "theirs"):
        table.add_column(name, justify="left" if name in ("case", "output", "worst at") else "right")
    for row in rows:
        found = row.parity
        if found is None:
            continue
        if found.get("reason"):
            table.add_row(_row_name(row), "—", found["reason"], "", "", "", "", "")
            continue
        for o in found["outputs"]:
            if o["reason"]:
                table.add_row(_row_name(row), o["name"], o["reason"], "", "", "", "", "")
            elif o["exact"]:
                table.add_row(_row_name(row), o["name"], f"{o['mismatches']} unequal", "", "",
                              _where(o["worst_position"]) or str(o["worst_index"] or ""),
                              _stat(o["worst_ours"]), _stat(o["worst_theirs"]))
            else:
                table.add_row(_row_name(row), o["name"], f"{o['max_ulps']:.3g}", _num(o["mean_abs"]),
                              _num(o["rel_l2"]), _where(o["worst_position"]) or str(o["worst_index"] or ""),
                              _stat(o["worst_ours"]), _stat(o["worst_theirs"]))
    out.print(table)


def kernel_summary(kernels: list[dict]) -> None:
    hits = sum(k["cache_hit"] for k in kernels)
    plain(f"kernels: {len(kernels)} loaded, {len(kernels) - hits} compiled, {hits} from the cubin cache")


def sanitize_view(cases, result, *, quiet: bool) -> None:
    """Each case's line as the sanitized child reports it, its sanitizer reports, then the total."""
    for case in cases:
        if not quiet or not case.passed:
            plain(("" if case.passed else "SANITIZER ") + case.line)
        for line in case.reports:
            plain(f"    {line}")
    for line in result.unattributed:
        plain(f"    (no case) {line}")
    plain(f"compute-sanitizer {result.tool}: {result.errors if result.errors is not None else 'no'} errors "
          f"reported; {sum(c.passed for c in result.cases)} passed, {sum(not c.passed for c in result.cases)} "
          f"failed; child exit {result.returncode}")


# -- inspect / doctor / build ----------------------------------------------------------------------
def _stat(value: Any) -> str:
    return "—" if value is None else f"{value:.6g}"


META_SHOWN = 64 << 10          # characters of meta JSON shown; the rest is in --json


def inspect_view(summary: dict) -> None:
    import json

    out.print(Text.assemble(styled(str(summary["file"]), "bold"),
                            f"  KDTR v{summary['version'][0]}.{summary['version'][1]}, {summary['size']} bytes"))
    meta = json.dumps(summary["meta"], indent=2, allow_nan=False)
    if len(meta) > META_SHOWN:      # a huge header must not cost rich's rendering memory
        meta = meta[:META_SHOWN] + f"\n… ({len(meta) - META_SHOWN} more characters: use --json -)"
    out.file.write(meta + "\n")
    table = Table(title="tensors", title_justify="left")
    for name in ("name", "role", "dtype", "shape", "min", "max", "mean", "NaN", "Inf"):
        table.add_column(name, justify="left" if name in ("name", "role", "dtype", "shape") else "right")
    for t in summary["tensors"]:
        table.add_row(t["name"], t["role"], t["dtype"], str(t["shape"]), _stat(t["min"]), _stat(t["max"]),
                      _stat(t["mean"]), str(t["nan"]), str(t["inf"]))
    out.print(table)


def doctor_view(facts: dict) -> None:
    table = Table(title="kdtree doctor", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("found")
    table.add_row("kdtree", facts["kdtree"])
    table.add_row("python", f"{facts['python']} ({facts['platform']})")
    for package, version in facts["packages"].items():
        table.add_row(package, version or styled("not installed", "red"))
    table.add_row("NVRTC", facts.get("nvrtc") or Text.assemble(styled("unavailable", "red"),
                                                                visible(f" {facts.get('nvrtc_problem', '')}")))
    table.add_row("CUDA headers", facts.get("cuda_headers") or styled("not found", "red"))
    table.add_row("GPUs", ", ".join(facts["gpus"]) or "none" + (f" ({facts['gpu_problem']})"
                                                              if facts.get("gpu_problem") else ""))
    if facts.get("run_as"):
        table.add_row("run as", Text.assemble(styled(facts["run_as"], "yellow"),
                                              ": KDTREE_GPU, launches choose kernels for that GPU"))
    table.add_row("cache folder", facts["cache_dir"])
    table.add_row("kernels folder", f"{facts['kernels_dir']} (from {facts['kernels_from']})")
    table.add_row("default suites", f"{facts['specs_dir']} (from {facts['specs_from']})")
    table.add_row("sources sha256", facts["sources_sha256"])
    out.print(table)


def build_table(built) -> None:
    """(Placement, CompiledModule or None) pairs: one row per entry of a compiled kernel, one per
    kernel that does not apply to the arch."""
    table = Table(title="kdtree build — NVRTC cubins", title_justify="left")
    for name in ("source", "arch", "entry", "dynamic smem B", "serves", "registers", "static smem B",
                 "local B", "spill st/ld", "cache"):
        table.add_column(name, justify="left" if name in ("source", "arch", "entry", "serves", "cache") else "right")
    for place, module in built:
        smem = "per launch" if place.dynamic_shared_bytes is None else str(place.dynamic_shared_bytes)
        if module is None:
            table.add_row(place.source, place.arch, styled("not applicable", "dim"), smem, styled(place.why_not, "dim"),
                          "", "", "", "", "")
            continue
        serves = ", ".join(place.serves) or styled("none (KDTREE_GPU only)", "dim")
        for res in module.resources:
            spills = f"{res.spill_stores}/{res.spill_loads}"
            main = res.kernel == f"{place.op_variant.split('/')[0]}_{place.kernel}"
            table.add_row(place.source, module.arch, res.kernel, smem if main else "", serves if main else "",
                          str(res.registers), str(res.shared_bytes), str(res.local_bytes),
                          spills if spills == "0/0" else styled(spills, "red"),
                          "hit" if module.cache_hit else "compiled")
    out.print(table)


# -- e2e -----------------------------------------------------------------------------------------
def _divergence(run) -> str:
    d = run.divergence
    if d is None:
        return ""
    tie = " (a bf16 near-tie flip)" if d.near_tie else ""
    return (f"token {d.index} (position {d.position}): AR {d.ar_token} vs DDTree {d.ddtree_token}, "
            f"AR logit margin {d.margin:.3g}{tie}")


def e2e_line(run) -> str:
    verdict = "SAME" if run.identical else "DIVERGED"
    return (f"{verdict} prompt={run.prompt} {run.variant} budget={run.budget} tokens={run.tokens} "
            f"tau={run.mean_accept:.2f} tokens/forward={run.tokens_per_forward:.2f} {_divergence(run)}").rstrip()


def e2e_table(runs, *, quiet: bool) -> None:
    same = sum(r.identical for r in runs)
    summary = f"{same} identical, {len(runs) - same} diverged"
    if quiet:
        plain(summary)
        return
    backend = runs[0].backend if runs else "?"
    table = Table(title=f"kdtree e2e — DDTree vs autoregressive greedy, backend {backend}", title_justify="left")
    for name in ("prompt", "variant", "budget", "depth", "tokens", "τ (mean accept)", "tokens/forward",
                 "forwards", "seconds", "result"):
        table.add_column(name, justify="left" if name in ("variant", "result") else "right")
    for r in runs:
        result = styled("identical", "green") if r.identical else Text.assemble(
            styled("DIVERGED", "bold red"), visible(f" {_divergence(r)}"))
        table.add_row(str(r.prompt), r.variant, str(r.budget), str(r.depth), str(r.tokens), f"{r.mean_accept:.2f}",
                      f"{r.tokens_per_forward:.2f}", str(r.forwards), f"{r.seconds:.2f}", result)
    out.print(table)
    out.print(summary)
