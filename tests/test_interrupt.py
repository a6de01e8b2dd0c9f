"""Interrupted and concurrent runs never leave a broken bundle under a final name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdtr.config import REPO_ROOT
from kdtr.format import read_bundle

SLOW_SUITE = """\
op: verify_attn
seed: 1
sweep:
  batch: [2]
  heads: [16]
  prefix: [1500, 1600, 1700, 1800, 1900, 2000, 2100, 2200, 2300, 2400, 2500, 2600]
  budget: [16]
"""


def kdtree(*args, cwd):
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen([sys.executable, "-m", "cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_only_valid_bundles(folder: Path) -> int:
    leftovers = [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".kdtr")]
    assert leftovers == [], leftovers
    bundles = list(folder.rglob("*.kdtr"))
    for bundle in bundles:
        read_bundle(bundle)                     # raises on any broken file
    return len(bundles)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupted_gen_refs_exits_130_and_leaves_no_partial_file(tmp_path, sig):
    (tmp_path / "slow.yaml").write_text(SLOW_SUITE)
    proc = kdtree("gen-refs", "slow.yaml", "-o", "goldens", "-q", cwd=tmp_path)
    deadline = time.time() + 60
    while not list((tmp_path / "goldens").rglob("*.kdtr")) and time.time() < deadline:
        time.sleep(0.05)                        # wait until it is mid-run: one bundle written
    time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.strip().count("\n") == 0 and "interrupted" in err and "Traceback" not in err
    written = assert_only_valid_bundles(tmp_path / "goldens")
    assert 1 <= written < 12


def test_two_concurrent_gen_refs_produce_valid_identical_bundles(tmp_path):
    (tmp_path / "slow.yaml").write_text(SLOW_SUITE.replace("1500, 1600, 1700, 1800, 1900, 2000, 2100, 2200, 2300, 2400, 2500, 2600", "100, 200, 300, 400, 500, 600"))
    procs = [kdtree("gen-refs", "slow.yaml", "-o", "goldens", "--force", "-q", cwd=tmp_path) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert assert_only_valid_bundles(tmp_path / "goldens") == 6
    first = {p.name: p.read_bytes() for p in (tmp_path / "goldens").rglob("*.kdtr")}
    proc = kdtree("gen-refs", "slow.yaml", "-o", "again", "-q", cwd=tmp_path)
    proc.communicate(timeout=120)
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").rglob("*.kdtr")} == first
