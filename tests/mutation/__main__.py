"""`python -m tests.mutation [PATH ...]`: the mutation suite's kill table over the goldens under
PATH (default: goldens/), as Markdown on stdout; exit 1 where a mutant that should be killed
survived or an honest variant failed (tests/mutation/suite.py; docs/numerics.md)."""

from __future__ import annotations

import sys
import time

from tests.mutation.suite import run_suite, sound, table


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    groups = run_suite(argv or ["goldens"])
    print(table(groups))
    print(f"\n{sum(g.goldens for g in groups.values())} goldens in {time.perf_counter() - started:.0f} s")
    return 0 if sound(groups) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
