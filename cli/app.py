"""The typer app and what every command shares: the error -> exit-code map, options, JSON output.

Command modules import from here and register on `app`; `cli.main` imports them all and runs it.
Exit codes everywhere: 0 all passed, 1 a case failed (or a bench regression), 2 bad usage or input,
130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any, Callable, Iterator

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


def flag(*names: str, help: str) -> Any:
    """A boolean option that takes no value; the empty metavar keeps typer's help from showing
    `<bool>` after it, which reads as if the option wanted `true` or `false`."""
    return typer.Option(False, *names, help=help, metavar="")


def _version(value: bool):
    if value:
        typer.echo(f"kdtree {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                 help="Print the version and exit."),
    debug: bool = flag("--debug", help="Show tracebacks for errors."),
):
    _state["debug"] = debug


JsonOpt = typer.Option(None, "--json", help="Write a machine-readable record here ('-' = stdout: "
                                            "then tables and lines go to stderr).")
PatternOpt = typer.Option(None, "-k", help="Only cases whose name contains PATTERN (or matches a * ? glob).")
QuietOpt = flag("--quiet", "-q", help="One plain line per case (for shell loops).")
ShardOpt = typer.Option(None, "--shard", help="Run only shard I of N (1-based, e.g. 2/4): a stable split "
                                              "by case-name hash, so N CI jobs cover the suite exactly once. "
                                              "'auto': I and N from the scheduler (Slurm array, Buildkite or "
                                              "CircleCI parallelism, Kubernetes Indexed Job with --shard-count).")
ShardCountOpt = typer.Option(None, "--shard-count", min=1, help="With --shard auto under a Kubernetes Indexed "
                                                                "Job (JOB_COMPLETION_INDEX): the number of shards.")
BalanceFromOpt = typer.Option(None, "--balance-from", help="With --shard: split by the case times of this earlier "
                                                           "verify or bench record (longest first), so shards take "
                                                           "equal time; every shard must be given the same file.")
DevicesOpt = typer.Option(None, "--devices", help="One worker process per GPU: 'all' or indices like 0,1 "
                                                  "(cases spread by estimated cost, one merged table).")


def shard_spec(shard: str | None, shard_count: int | None, balance_from: Path | None):
    """--shard, --shard-count and --balance-from as one kdtr.parallel.Shard (None: no sharding)."""
    from kdtr.shards import resolve_shard

    return resolve_shard(shard, shard_count, balance_from)


def check_writable(path: str | Path | None, option: str) -> None:
    """`kdtr.atomic.check_writable` for an output option that may be absent or `-` (stdout)."""
    if path is None or str(path) == "-":
        return
    from kdtr.atomic import check_writable as check

    check(path, option)


class JsonOut:
    """Where a command's `--json` record goes. With `-`, stdout carries the JSON alone: the
    command's tables and plain lines are sent to stderr for as long as `tables()` is open."""

    def __init__(self, path: str | None):
        check_writable(path, "--json")
        self.path = path
        self.stdout = sys.stdout

    @property
    def to_stdout(self) -> bool:
        return self.path == "-"

    @contextmanager
    def tables(self) -> Iterator[None]:
        if not self.to_stdout:
            yield
            return
        with redirect_stdout(sys.stderr):     # print() and render.out both follow sys.stdout
            yield

    def write(self, record: Callable[[], Any]) -> None:
        """Build the record (its meta block asks git and the device: not free) only when asked for."""
        if self.path:
            emit_json(self.path, record(), self.stdout)


def emit_json(path: str, record, stdout=None) -> None:
    """The record as compact JSON to `path` (atomically; mode from the umask) or, for `-`, to stdout."""
    import json

    from kdtr import report

    if path == "-":
        (stdout or sys.stdout).write(json.dumps(report.plain(record), separators=(",", ":"), allow_nan=False) + "\n")
        (stdout or sys.stdout).flush()
    else:
        report.write_json(path, record)


def gpu_count() -> int:
    from kdtr.device import gpu_available

    if not gpu_available():
        return 0
    import torch

    return torch.cuda.device_count()


def default_specs_dir() -> Path:
    """The suites a command runs when given none: ./specs where it exists, else kdtree's own."""
    from kdtr.config import config

    local = Path("specs")
    return local if local.is_dir() else config().specs_dir
