"""The one atomic writer: bundles, records, sidecars and cache entries all go through it.

A temp file in the destination's folder, named `.<name>.<pid>.<random>.tmp` (the pid lets a later
run tell a dead writer's leftovers from a live one's), created with mode 0666 so the umask decides
the final permissions, fsynced, then `os.replace`d over the final name: readers see the old file or
the new one, never half of one. A failure removes the temp file and re-raises (an OSError as a
WriteError naming the path: a full disk is bad input to the CLI, exit 2). A writer killed
outright (SIGKILL, power loss) cannot clean up; the next writer into that folder removes the temp
files whose pid is no longer alive.
"""

from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from .errors import UsageError, WriteError

TEMP_RE = re.compile(r"\..+\.(\d+)\.[0-9a-f]{8}\.tmp")


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def pid_alive(pid: int) -> bool:
    """True unless no process has this pid (a pid in use by another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the temp files of dead writers in `folder` (not below it); the paths removed."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = TEMP_RE.fullmatch(entry.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        with suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


@contextmanager
def atomic_open(path: str | Path, *, sweep: bool = True) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block ends without an exception. `sweep` first
    removes dead writers' temp files from the folder: a scan of the whole folder, which a writer
    of many files into one folder (gen-refs) does once before it starts, not once per file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if sweep:
        remove_stale_temps(path.parent)
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with open(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError) and not isinstance(err, WriteError):
            raise WriteError(f"cannot write: {err.strerror or err}", file=path) from err
        raise


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write `data` (str as UTF-8) to `path` atomically."""
    with atomic_open(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


def check_writable(path: str | Path, what: str) -> None:
    """Refuse, before any work, a path that cannot become a file: a directory, a file we may not
    replace, or a folder (or its nearest existing ancestor) we may not create files in. `what`
    names it in the one-line UsageError (an option such as `--json`, or "the CSV")."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{what} {target}: is a directory, expected a file path")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{what} {target}: not writable")
    parent = target.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{what} {target}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {target}: cannot create files in {parent}")


def check_not_input(path: str | Path | None, what: str, inputs: Iterable[str | Path]) -> None:
    """Refuse, before any work, an output path (`what`: its option) that names one of the command's
    inputs, the same file by any name: the record would replace what the run reads. A folder among
    `inputs` stands for the files below it; `-` (stdout) and an absent option pass."""
    if path is None or str(path) == "-" or not Path(path).exists():
        return                     # a file not there yet is no input
    target = Path(path)
    for given in inputs:
        for source in (Path(given).rglob("*") if Path(given).is_dir() else [Path(given)]):
            if _same_file(source, target):
                raise UsageError(f"{what} {target}: is one of the inputs ({source}); choose another output path")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
