"""The `kdtree` command line: assembles the command modules on the shared app and runs it.

Command modules (gen_refs, verify, info, bench, e2e) import `app`, `guarded` and the shared options
from `cli.app` and register their commands there; views live in `cli.render` and friends.
"""

from __future__ import annotations

import gc
import signal

from . import bench, e2e, gen_refs, info, verify  # noqa: F401  (each registers its commands)
from .app import app

HANGUPS = (signal.SIGTERM, signal.SIGHUP)     # a kill or a closed terminal: treated like Ctrl-C


def _terminate(signum, frame):
    """SIGTERM and SIGHUP take the Ctrl-C path: temp files are removed, exit 130."""
    raise KeyboardInterrupt


def main() -> None:
    for sig in HANGUPS:
        signal.signal(sig, _terminate)
    try:
        app()
    finally:
        # The interpreter's last collection would walk every object torch created on import:
        # 0.25 s of CPU at each exit of a torch command on the 2-core box. Frozen, it skips them.
        # Nothing of ours relies on a finalizer at exit: files close in `with` blocks and temp
        # files go on the Ctrl-C path above.
        gc.freeze()
