"""kdtr.atomic: the one writer, and the clean-up of temp files that killed writers left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kdtr.atomic import atomic_open, atomic_write, remove_stale_temps
from tests.helpers import run_kdtree


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture()
def leftovers(tmp_path):
    """A dead writer's temp file and a live one's (this process's parent: alive for the test)."""
    dead = tmp_path / f".x.kdtr.{dead_pid()}.0123abcd.tmp"
    live = tmp_path / f".y.kdtr.{os.getppid()}.4567cdef.tmp"
    other = tmp_path / ".notes.tmp"                 # not a name the writer makes: never touched
    for path in (dead, live, other):
        path.write_bytes(b"\0" * 1024)
    return dead, live, other


def test_a_write_removes_dead_writers_temps_and_keeps_live_ones(tmp_path, leftovers):
    dead, live, other = leftovers
    atomic_write(tmp_path / "record.json", "{}\n")
    assert not dead.exists()
    assert live.exists() and other.exists()
    assert (tmp_path / "record.json").read_text() == "{}\n"


def test_remove_stale_temps_names_what_it_removed(tmp_path, leftovers):
    dead, live, _ = leftovers
    assert remove_stale_temps(tmp_path) == [dead]
    assert remove_stale_temps(tmp_path) == []
    assert live.exists()


def test_temp_name_carries_the_pid_and_a_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_open(target) as handle:
            handle.write(b"half")
            (tmp_name,) = [p.name for p in tmp_path.iterdir()]
            assert tmp_name.startswith(f".out.bin.{os.getpid()}.") and tmp_name.endswith(".tmp")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


SUITE = """\
op: tree_accept
seed: 3
cases:
  - {name: one, budget: 8}
"""


def test_gen_refs_removes_a_dead_writers_temp_even_when_every_bundle_is_fresh(tmp_path):
    (tmp_path / "s.yaml").write_text(SUITE)
    args = ("gen-refs", "s.yaml", "-o", "goldens", "-q")
    first = run_kdtree(*args, cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    stale = tmp_path / "goldens" / "tree_accept" / f".one.kdtr.{dead_pid()}.89abcdef.tmp"
    stale.write_bytes(b"\0" * 4096)
    second = run_kdtree(*args, cwd=tmp_path, timeout=120)
    assert second.returncode == 0, second.stderr
    assert not stale.exists()
    assert (tmp_path / "goldens" / "tree_accept" / "one.kdtr").is_file()
