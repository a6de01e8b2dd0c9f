"""The one atomic writer: bundles, records, sidecars and cache entries all go through it.

A temp file in the destination's folder, named `.<name>.<pid>.<random>.tmp` (the pid lets a later
run tell a dead writer's leftovers from a live one's), created with mode 0666 so the umask decides
the final permissions, fsynced, then `os.replace`d over the final name: readers see the old file or
the new one, never half of one. A failure removes the temp file and re-raises.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Iterator


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block ends without an exception."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with open(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            tmp.unlink()
        raise


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write `data` (str as UTF-8) to `path` atomically."""
    with atomic_open(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
