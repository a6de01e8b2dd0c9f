"""gen-refs: which suites the default and a folder read, stale bundles and --prune, memory bounds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from kdtr.config import REPO_ROOT
from kdtr.ops import get_op
from kdtr.ops.base import Case


def kdtree(*args, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO_ROOT))
    base.pop("KDTREE_MEM_LIMIT", None)
    env = base | (env or {})
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


def test_a_case_over_the_memory_limit_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "s.yaml").write_text("op: verify_attn\ncases:\n  - {name: small, batch: 1, heads: 4}\n"
                                     "  - {name: big, variant: fp32, batch: 2, heads: 16, prefix: 100000}\n")
    done = kdtree("gen-refs", "s.yaml", "-o", "g", "--mem-limit", "64M", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("kdtree: error: s.yaml:4: case verify_attn/big needs about ")
    assert "GiB to generate, over the memory limit of 64.00 MiB" in line
    assert not (tmp_path / "g").exists() or not list((tmp_path / "g").rglob("*.kdtr"))
    bad = kdtree("gen-refs", "s.yaml", "-o", "g", "--mem-limit", "lots", cwd=tmp_path)
    assert bad.returncode == 2 and "--mem-limit 'lots'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_memory_limit_comes_from_kdtree_mem_limit_when_no_option_is_given(tmp_path):
    (tmp_path / "s.yaml").write_text("op: verify_attn\ncases:\n"
                                     "  - {name: big, variant: fp32, batch: 2, heads: 16, prefix: 100000}\n")
    done = kdtree("gen-refs", "s.yaml", "-o", "g", cwd=tmp_path, env={"KDTREE_MEM_LIMIT": "64M"})
    assert done.returncode == 2 and "over the memory limit of 64.00 MiB" in done.stderr, done.stderr
    wins = kdtree("gen-refs", "s.yaml", "-o", "g", "--mem-limit", "32M", cwd=tmp_path, env={"KDTREE_MEM_LIMIT": "64M"})
    assert wins.returncode == 2 and "over the memory limit of 32.00 MiB" in wins.stderr, wins.stderr
    bad = kdtree("gen-refs", "s.yaml", "-o", "g", cwd=tmp_path, env={"KDTREE_MEM_LIMIT": "lots"})
    assert bad.returncode == 2 and "KDTREE_MEM_LIMIT 'lots'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("op, variant, params", [
    ("verify_attn", "fp32", {"batch": 2, "heads": 8, "prefix": 30000, "budget": 16}),
    ("verify_attn", "bf16_paged", {"batch": 2, "heads": 8, "prefix": 30000, "budget": 16}),
    ("tree_build", "default", {"batch": 32, "depth": 16, "vocab": 32768, "budget": 64}),
])
def test_the_memory_estimate_bounds_the_measured_peak(op, variant, params):
    """tracemalloc sees numpy's buffers: the estimate must cover generate + reference's peak and not
    overstate it more than fourfold (or it would refuse cases that fit)."""
    implementation = get_op(op)
    full = {p.name: p.default for p in implementation.params} | params
    case = Case("m", op, variant, 5, full)
    tracemalloc.start()
    try:
        generated = implementation.generate(case)
        implementation.reference(variant, generated.inputs, generated.params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = implementation.estimate_bytes(variant, full)
    assert peak <= estimate <= 4 * peak, (peak, estimate)


def test_gen_refs_in_worker_processes_writes_the_same_bytes_in_the_same_order(tmp_path):
    from kdtr import refs, spec

    suite_file = tmp_path / "tree_accept.yaml"
    suite_file.write_text("op: tree_accept\nseed: 5\ncases:\n  - {batch: 3, budget: 6}\n  - {batch: 2, budget: 9}\n"
                          "  - {batch: 4, budget: 5}\n")
    cases = [(s, c) for s in spec.load_suites([suite_file]) for c in s.cases]
    alone = list(refs.gen_refs(cases, tmp_path / "one", jobs=1))
    pooled = list(refs.gen_refs(cases, tmp_path / "pool", jobs=2, mem_limit=1 << 40))
    assert [r.case for r in pooled] == [c.name for _, c in cases] == [r.case for r in alone]
    for a, b in zip(alone, pooled):
        assert b.status == "written" and a.path.read_bytes() == b.path.read_bytes()
