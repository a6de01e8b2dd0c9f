"""Walking a folder the way a user means it: symbolic links to folders are followed, each folder once."""

from __future__ import annotations

import os
from fnmatch import fnmatch
from pathlib import Path


def files_below(folder: str | Path, pattern: str) -> list[Path]:
    """Every non-folder entry matching `pattern` below `folder`, sorted. Symbolic links to folders
    are followed (a linked subfolder of goldens is part of it); a folder reached again (a link
    cycle, two links to one folder) is walked once. Entries are not checked: a dangling link or a
    FIFO is the caller's to report."""
    seen: set[tuple[int, int]] = set()
    found: list[Path] = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        status = os.stat(root)
        if (status.st_dev, status.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((status.st_dev, status.st_ino))
        found += [Path(root) / name for name in files if fnmatch(name, pattern)]
    return sorted(found)
