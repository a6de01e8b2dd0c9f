"""gen-refs: which suites the default and a folder read, stale bundles and --prune, memory bounds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kdtr.config import REPO_ROOT


def kdtree(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO_ROOT))
    env.pop("KDTREE_MEM_LIMIT", None)
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_specs_folder_and_the_default_read_the_same_suites(tmp_path):
    shutil.copytree(REPO_ROOT / "specs", tmp_path / "specs")    # with specs/bench/ inside
    by_default = kdtree("gen-refs", "-k", "root_only_q1", "-o", "a", "-q", cwd=tmp_path)
    by_folder = kdtree("gen-refs", "specs", "-k", "root_only_q1", "-o", "b", "-q", cwd=tmp_path)
    assert by_default.returncode == 0, by_default.stderr
    assert by_folder.returncode == 0, by_folder.stderr
    listed = sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*.kdtr"))
    assert listed == ["tree_accept/root_only_q1.kdtr"]
    assert sorted(p.relative_to(tmp_path / "b").as_posix() for p in (tmp_path / "b").rglob("*.kdtr")) == listed


SUITE = """\
op: tree_accept
seed: 3
cases:
  - {{name: {first}, budget: 8}}
  - {{name: kept, budget: 4}}
"""


def test_a_renamed_cases_old_bundle_is_listed_as_stale_and_pruned(tmp_path):
    (tmp_path / "s.yaml").write_text(SUITE.format(first="old_name"))
    assert kdtree("gen-refs", "s.yaml", "-o", "g", "-q", cwd=tmp_path).returncode == 0
    (tmp_path / "s.yaml").write_text(SUITE.format(first="new_name"))
    listed = kdtree("gen-refs", "s.yaml", "-o", "g", "-q", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    old = Path("g") / "tree_accept" / "old_name.kdtr"
    assert listed.stderr.splitlines() == [f"stale: {old} (no suite names this case; --prune removes it)"]
    assert (tmp_path / old).is_file(), "listing must not remove anything"
    pruned = kdtree("gen-refs", "s.yaml", "-o", "g", "-q", "--prune", cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stderr.splitlines() == [f"removed: {old} (no suite names this case)"]
    assert sorted(p.name for p in (tmp_path / "g" / "tree_accept").iterdir()) == ["kept.kdtr", "new_name.kdtr"]
    again = kdtree("gen-refs", "s.yaml", "-o", "g", "-q", cwd=tmp_path)
    assert again.returncode == 0 and again.stderr == ""
