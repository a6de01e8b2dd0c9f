"""The typer app and what every command shares: the error -> exit-code map, options, JSON output.

Command modules import from here and register on `app`; `cli.main` imports them all and runs it.
Exit codes everywhere: 0 all passed, 1 a case failed (or a bench regression), 2 bad usage or input,
130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import typer

from kdtr import __version__
from kdtr.errors import KdtreeError, UsageError

from . import render

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Validate and benchmark the CUDA kernels of DDTree speculative decoding "
                       "(tree_build, verify_attn, tree_accept) against exact golden bundles.")

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
_state = {"debug": False, "debug_in_argv": False}


def set_debug(on: bool) -> None:
    """`--debug` found anywhere on the command line (cli.main takes it out before typer parses)."""
    _state["debug_in_argv"] = on


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
    debug: bool = flag("--debug", help="Show tracebacks for errors (anywhere on the command line)."),
):
    _state["debug"] = debug or _state["debug_in_argv"]


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
    """--shard, --shard-count and --balance-from as one kdtr.scaleout.parallel.Shard (None: no sharding)."""
    from kdtr.scaleout.shards import resolve_shard

    return resolve_shard(shard, shard_count, balance_from)


MemLimitOpt = typer.Option(None, "--mem-limit", help="Refuse a case whose memory estimate is over this (e.g. 8G) "
                                                     "\\[default: KDTREE_MEM_LIMIT, else half of MemAvailable].")


def mem_limit_bytes(text: str | None) -> int | None:
    """--mem-limit in bytes, or gen-refs' default bound (None: no bound known)."""
    from kdtr.bundle import refs

    return refs.parse_bytes(text) if text else refs.default_mem_limit()


def check_writable(path: str | Path | None, option: str) -> None:
    """`kdtr.atomic.check_writable` for an output option that may be absent; `-` (stdout) is for
    --json alone (`--junit -` and `--csv -` are refused: one stream cannot carry two documents)."""
    if path is None or str(path) == "-" and option == "--json":
        return
    if str(path) == "-":
        raise UsageError(f"{option} -: only --json writes to stdout; give {option} a file path")
    from kdtr.atomic import check_writable as check

    check(path, option)


def refuse_overwriting_inputs(outputs: dict[str, Any], inputs: Iterable[str | Path]) -> None:
    """Each output option (`--json`, `--junit`, `--csv`, `--merge`, ...) checked against the
    command's inputs before any work (kdtr.atomic.check_not_input)."""
    from kdtr.atomic import check_not_input

    for option, path in outputs.items():
        check_not_input(path, option, inputs)


def note(message: str) -> None:
    """One stderr line saying what kdtree did with an odd input (deduplicated, run on the CPU, ...)."""
    render.err.print(f"kdtree: note: {message}")


def deduplicated(values: list[str], option: str) -> list[str]:
    """A repeated option value (`--impl torch --impl torch`) counted once, and said so."""
    unique = list(dict.fromkeys(values))
    if len(unique) != len(values):
        note(f"{option} given more than once with the same value: each runs once")
    return unique


def parse_devices_option(text: str | None, backend: str) -> list[str] | None:
    """--devices: the worker list; where no GPU is visible the workers run on the CPU, and it says so
    (`backend` resolved: the cuda backend's run refuses that itself, in one line)."""
    if text is None:
        return None
    from kdtr.scaleout.parallel import parse_devices

    available = gpu_count()
    devices = parse_devices(text, available)
    if devices and not available and backend != "cuda":
        note(f"--devices {text}: no GPU is visible here; {len(devices)} worker processes run on the CPU")
    return devices


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

    from kdtr.records import report

    if path == "-":
        write_stdout(json.dumps(report.plain(record), separators=(",", ":"), allow_nan=False) + "\n", "--json -",
                     stdout)
    else:
        report.write_json(path, record)


def write_stdout(text: str, option: str, stdout=None) -> None:
    """A document for stdout (`--json -`); a failed write (stdout redirected to a full disk, a
    closed pipe), now or earlier (StdoutGuard), is a WriteError: one line, exit 2, like a file's."""
    from kdtr.errors import WriteError

    stream = stdout or sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except OSError as err:
        raise WriteError(f"{option}: cannot write to stdout: {err.strerror or err}") from None
    failure = getattr(stream, "failure", None)
    if failure is not None:
        raise WriteError(f"{option}: cannot write to stdout: {failure.strerror or failure}")


class StdoutGuard(io.TextIOBase):
    """sys.stdout for a command's run: a write or flush that fails (the reader gone: a broken pipe;
    a full disk) is remembered in `failure`, never raised, and later output is dropped, so the run
    goes on and still writes its record; `cli.main` turns the failure into its exit code and line.
    File descriptor 1 then points at /dev/null, so that the interpreter's own flush at exit of
    what the stream still buffers cannot fail again."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream
        self.failure: OSError | None = None

    def write(self, text: str) -> int:
        if self.failure is None:
            try:
                self.stream.write(text)
            except OSError as err:
                self._failed(err)
        return len(text)

    def flush(self) -> None:
        if self.failure is None:
            try:
                self.stream.flush()
            except OSError as err:
                self._failed(err)

    def _failed(self, err: OSError) -> None:
        self.failure = err
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return self.stream.encoding

    @property
    def errors(self) -> str | None:
        return self.stream.errors

    def writable(self) -> bool:
        return True


def gpu_count() -> int:
    from kdtr.runtime.device import gpu_available

    if not gpu_available():
        return 0
    import torch

    return torch.cuda.device_count()


def default_specs_dir() -> Path:
    """The suites a command runs when given none: ./specs where it exists, else kdtree's own."""
    from kdtr.config import config

    local = Path("specs")
    return local if local.is_dir() else config().specs_dir
