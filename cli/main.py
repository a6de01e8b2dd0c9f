"""The kdtree command line: assembles the command modules on the shared app and runs it.

Command modules (gen_refs, verify, info, bench, report, e2e) import `app`, `guarded` and the shared options
from `cli.app` and register their commands there; views live in `cli.render` and friends.
"""

from __future__ import annotations

import gc
import signal
import sys

import typer

from . import bench, report  # noqa: F401,I001  (each registers its commands; this order is --help's)
from . import e2e, gen_refs, info, verify  # noqa: F401
from . import render
from .app import EXIT_INPUT, EXIT_INTERRUPTED, StdoutGuard, app, set_debug

try:                                     # typer 0.2x vendors click; older ones use the package
    from typer import _click as click
except ImportError:                      # pragma: no cover - depends on the typer installed
    import click

HANGUPS = (signal.SIGTERM, signal.SIGHUP)     # a kill or a closed terminal: treated like Ctrl-C
DEBUG = "--debug"


def _terminate(signum, frame):
    """SIGTERM and SIGHUP take the Ctrl-C path: temp files are removed, exit 130."""
    raise KeyboardInterrupt


def take_debug(args: list[str]) -> tuple[list[str], bool]:
    """`--debug` anywhere before a `--` (not only before the subcommand): removed, and whether it was there."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != DEBUG] + args[end:]
    return kept, len(kept) != len(args)


def usage_line(error) -> str:
    """typer's usage error (unknown option, bad value) as one line, with the command's help hint."""
    message = " ".join(error.format_message().split())
    ctx = getattr(error, "ctx", None)
    return message + (f" (see '{ctx.command_path} --help')" if ctx is not None else "")


def run(args: list[str]) -> int:
    """The app on `args`; the exit code. Usage errors are one line on stderr, exit 2, not boxes."""
    args, debug = take_debug(args)
    set_debug(debug)
    try:
        code = app(args=args, prog_name="kdtree", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as error:    # bare `kdtree`: the help, as before
        error.show()
        return EXIT_INPUT
    except click.exceptions.ClickException as error:
        render.error(usage_line(error))
        return error.exit_code if error.exit_code else EXIT_INPUT
    except typer.Abort:
        render.error("interrupted")
        return EXIT_INTERRUPTED
    return code if isinstance(code, int) else 0


def stdout_verdict(code: int, failure: OSError | None) -> int:
    """The exit code once stdout failed during the run (StdoutGuard): the records were written all
    the same. A reader that went away (a broken pipe: `| head`) is no failure of the run: its own
    code stands. Any other fault (a full disk) lost the tables: one line, exit 2 (unless the run
    already ended with an error line of its own: `--json -` says it could not write)."""
    if failure is None or isinstance(failure, BrokenPipeError) or code in (EXIT_INPUT, EXIT_INTERRUPTED):
        return code
    render.error(f"stdout: cannot write: {failure.strerror or failure} (the tables were lost; "
                 "the files asked for were written)")
    return EXIT_INPUT


def main() -> None:
    for sig in HANGUPS:
        signal.signal(sig, _terminate)
    sys.stdout = guard = StdoutGuard(sys.stdout)
    try:
        code = stdout_verdict(run(sys.argv[1:]), guard.failure)
    finally:
        # The interpreter's last collection would walk every object torch created on import:
        # 0.25 s of CPU at each exit of a torch command on the 2-core box. Frozen, it skips them.
        # Nothing of ours relies on a finalizer at exit: files close in `with` blocks and temp
        # files go on the Ctrl-C path above.
        gc.freeze()
    sys.exit(code)
