"""Interrupted and concurrent runs never leave a broken bundle under a final name."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kdtr.bundle.format import read_bundle
from tests.helpers import kdtree_command, kdtree_env

SLOW_SUITE = """\
op: verify_attn
seed: 1
sweep:
  batch: [2]
  heads: [16]
  prefix: [{prefixes}]
  budget: [16]
"""


def kdtree(*args, cwd):
    """`python -m cli ARGS` as a terminal would start it: with Ctrl-C's default action even where
    this test run inherited SIGINT ignored (a background job of a non-interactive shell does)."""
    return subprocess.Popen(kdtree_command(*args), cwd=cwd, env=kdtree_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def assert_only_valid_bundles(folder: Path) -> int:
    leftovers = [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".kdtr")]
    assert leftovers == [], leftovers
    bundles = list(folder.rglob("*.kdtr"))
    for bundle in bundles:
        read_bundle(bundle)                     # raises on any broken file
    return len(bundles)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupted_gen_refs_exits_130_and_leaves_no_partial_file(tmp_path, sig):
    (tmp_path / "slow.yaml").write_text(SLOW_SUITE.format(prefixes=", ".join(map(str, range(1500, 3900, 100)))))
    proc = kdtree("gen-refs", "slow.yaml", "-o", "goldens", "-q", cwd=tmp_path)
    deadline = time.time() + 60
    while not list((tmp_path / "goldens").rglob("*.kdtr")) and time.time() < deadline:
        time.sleep(0.05)                        # wait until it is mid-run: one bundle written
    time.sleep(0.05)                        # gen-refs writes a bundle in ~0.1 s: signal well before the last
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.strip().count("\n") == 0 and "interrupted" in err and "Traceback" not in err
    written = assert_only_valid_bundles(tmp_path / "goldens")
    assert 1 <= written < 24


def test_two_concurrent_gen_refs_produce_valid_identical_bundles(tmp_path):
    (tmp_path / "slow.yaml").write_text(SLOW_SUITE.format(prefixes="100, 200, 300, 400, 500, 600"))
    procs = [kdtree("gen-refs", "slow.yaml", "-o", "goldens", "--force", "-q", cwd=tmp_path) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert assert_only_valid_bundles(tmp_path / "goldens") == 6
    first = {p.name: p.read_bytes() for p in (tmp_path / "goldens").rglob("*.kdtr")}
    proc = kdtree("gen-refs", "slow.yaml", "-o", "again", "-q", cwd=tmp_path)
    proc.communicate(timeout=120)
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").rglob("*.kdtr")} == first


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds the workers through /proc (Linux)")
def test_gen_refs_workers_die_with_a_killed_parent_and_write_nothing_after(tmp_path):
    """Issue 30 row 7: with --jobs 2, SIGKILL of gen-refs left both workers running; they wrote
    their bundles minutes later and idled on. Now they go within seconds, and their temp files
    with them."""
    (tmp_path / "slow.yaml").write_text(SLOW_SUITE.format(prefixes=", ".join(map(str, range(1500, 2700, 100)))))
    proc = kdtree("gen-refs", "slow.yaml", "-o", "goldens", "-q", "--jobs", "2", "--force", cwd=tmp_path)
    deadline = time.time() + 60
    workers: list[int] = []
    while len(workers) < 2 and time.time() < deadline and proc.poll() is None:
        workers = [pid for pid in _children(proc.pid)
                   if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
        time.sleep(0.05)
    assert len(workers) == 2, f"the two workers never started: {proc.poll()}"
    time.sleep(0.5)                               # mid-case: each worker is generating one
    proc.kill()
    proc.wait(timeout=30)                         # not communicate(): a live worker holds the pipes
    before = {p.name for p in (tmp_path / "goldens").rglob("*")}
    gone_by = time.time() + 5
    while any(map(_alive, workers)) and time.time() < gone_by:
        time.sleep(0.05)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:                         # a failing run must not leave them behind
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert survivors == [], "the workers outlived their parent"
    time.sleep(1.0)
    after = {p.name for p in (tmp_path / "goldens").rglob("*")}
    assert after <= before, f"written after the parent died: {sorted(after - before)}"
    assert [name for name in after if not name.endswith(".kdtr") and "." in name] == [], "temp files left"
