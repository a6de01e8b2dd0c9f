"""gen-refs: which suites the default and a folder read, stale bundles and --prune, memory bounds."""

from __future__ import annotations

import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from kdtr.config import REPO_ROOT
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.helpers import kdtree_env, run_kdtree


def kdtree(*args, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """kdtree in a real process, without the KDTREE_MEM_LIMIT this run may have inherited: `env` alone sets it."""
    return run_kdtree(*args, cwd=cwd, env=kdtree_env("KDTREE_MEM_LIMIT", **env))


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
    done = kdtree("gen-refs", "s.yaml", "-o", "g", cwd=tmp_path, KDTREE_MEM_LIMIT="64M")
    assert done.returncode == 2 and "over the memory limit of 64.00 MiB" in done.stderr, done.stderr
    wins = kdtree("gen-refs", "s.yaml", "-o", "g", "--mem-limit", "32M", cwd=tmp_path, KDTREE_MEM_LIMIT="64M")
    assert wins.returncode == 2 and "over the memory limit of 32.00 MiB" in wins.stderr, wins.stderr
    bad = kdtree("gen-refs", "s.yaml", "-o", "g", cwd=tmp_path, KDTREE_MEM_LIMIT="lots")
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
    from kdtr.bundle import refs, spec

    suite_file = tmp_path / "tree_accept.yaml"
    suite_file.write_text("op: tree_accept\nseed: 5\ncases:\n  - {batch: 3, budget: 6}\n  - {batch: 2, budget: 9}\n"
                          "  - {batch: 4, budget: 5}\n")
    cases = [(s, c) for s in spec.load_suites([suite_file]) for c in s.cases]
    alone = list(refs.gen_refs(cases, tmp_path / "one", jobs=1))
    pooled = list(refs.gen_refs(cases, tmp_path / "pool", jobs=2, mem_limit=1 << 40))
    assert [r.case for r in pooled] == [c.name for _, c in cases] == [r.case for r in alone]
    for a, b in zip(alone, pooled):
        assert b.status == "written" and a.path.read_bytes() == b.path.read_bytes()


def test_a_shipped_suite_writes_the_same_bytes_from_any_folder_and_by_any_path(tmp_path):
    """Issue 30 row 12: provenance.spec held the suite's path as given, so the wheel (whose suites
    are an absolute site-packages path) and the checkout wrote different goldens of one suite."""
    relative = kdtree("gen-refs", "specs/tree_accept.yaml", "-k", "root_only_q1", "-o", tmp_path / "a", "-q",
                      cwd=REPO_ROOT)
    absolute = kdtree("gen-refs", REPO_ROOT / "specs" / "tree_accept.yaml", "-k", "root_only_q1", "-o", "b", "-q",
                      cwd=tmp_path)
    assert relative.returncode == 0 and absolute.returncode == 0, relative.stderr + absolute.stderr
    (a,), (b,) = (tmp_path / "a").rglob("*.kdtr"), (tmp_path / "b").rglob("*.kdtr")
    assert a.read_bytes() == b.read_bytes()
    from kdtr.bundle.format import read_bundle

    assert read_bundle(b).meta["provenance"]["spec"] == "specs/tree_accept.yaml"


def test_prune_removes_only_what_the_given_suites_left(tmp_path):
    """Issue 30 row 15: `gen-refs specs/bench/tree_accept.yaml --prune` deleted the default
    tree_accept goldens (same op folder, another suite). A bundle another suite (or no suite:
    a captured one) left is not stale for this one."""
    (tmp_path / "s.yaml").write_text(SUITE.format(first="mine"))
    (tmp_path / "other.yaml").write_text("op: tree_accept\ncases:\n  - {name: theirs, budget: 4}\n")
    assert kdtree("gen-refs", "s.yaml", "other.yaml", "-o", "g", "-q", cwd=tmp_path).returncode == 0
    from kdtr.bundle.capture import save_bundle
    from kdtr.bundle.format import read_bundle

    theirs = read_bundle(tmp_path / "g" / "tree_accept" / "theirs.kdtr")
    save_bundle(tmp_path / "g" / "tree_accept" / "captured.kdtr", "tree_accept", theirs.meta["variant"],
                theirs.arrays("input"), params=theirs.meta["params"])
    (tmp_path / "s.yaml").write_text(SUITE.format(first="renamed"))
    pruned = kdtree("gen-refs", "s.yaml", "-o", "g", "-q", "--prune", cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    old = Path("g") / "tree_accept" / "mine.kdtr"
    assert pruned.stderr.splitlines() == [f"removed: {old} (no suite names this case)"]
    assert sorted(p.name for p in (tmp_path / "g" / "tree_accept").iterdir()) == \
        ["captured.kdtr", "kept.kdtr", "renamed.kdtr", "theirs.kdtr"]


def test_jobs_beyond_the_cores_are_capped_and_said(tmp_path):
    """Issue 30 row 14: `--jobs 10000` started one process per case (97 for 120 cases)."""
    (tmp_path / "s.yaml").write_text(SUITE.format(first="a"))
    done = kdtree("gen-refs", "s.yaml", "-o", "g", "-q", "--jobs", "10000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    from kdtr.scaleout.parallel import cpu_count

    assert done.stderr.splitlines() == [f"--jobs 10000: capped at the {cpu_count()} cores this process may run on"]


def test_gen_refs_scans_its_folders_once_not_once_per_bundle(tmp_path, monkeypatch):
    """Issue 30 row 14: each bundle's write rescanned its folder for dead writers' temp files, so
    a 50,000-case suite slowed from 380 to 50 cases/s. gen_refs sweeps each folder once, before
    (and after an interruption); its writes do not."""
    from kdtr import atomic
    from kdtr.bundle import refs, spec

    scans = []
    sweep = atomic.remove_stale_temps
    monkeypatch.setattr(atomic, "remove_stale_temps", lambda folder: scans.append(folder) or sweep(folder))
    (tmp_path / "s.yaml").write_text("op: tree_accept\nsweep: {budget: [1, 2, 3, 4, 5, 6]}\n")
    cases = [(s, c) for s in spec.load_suites([tmp_path / "s.yaml"]) for c in s.cases]
    assert [r.status for r in refs.gen_refs(cases, tmp_path / "g", jobs=1)] == ["written"] * 6
    assert scans == []


@pytest.mark.parametrize("command", ["gen-refs-suite", "gen-refs-bundle", "inspect"])
def test_a_json_record_onto_an_input_is_refused(tmp_path, command):
    """Issue 30 row 16: `inspect victim.kdtr --json victim.kdtr` (and gen-refs onto its suite or
    a bundle it writes) replaced the input with the record."""
    (tmp_path / "s.yaml").write_text(SUITE.format(first="a"))
    assert kdtree("gen-refs", "s.yaml", "-o", "g", "-q", cwd=tmp_path).returncode == 0
    victim = {"gen-refs-suite": "s.yaml", "gen-refs-bundle": "g/tree_accept/kept.kdtr",
              "inspect": "g/tree_accept/a.kdtr"}[command]
    original = (tmp_path / victim).read_bytes()
    args = ["inspect", victim] if command == "inspect" else ["gen-refs", "s.yaml", "-o", "g", "-q", "--force"]
    done = kdtree(*args, "--json", f"./{victim}", cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "--json" in done.stderr and "is one of the inputs" in done.stderr
    assert (tmp_path / victim).read_bytes() == original


def test_inline_logits_that_contradict_the_declared_depth_are_refused(tmp_path):
    """Issue 30 row 19: one row of inline logits with `depth: 2` was written as a depth-1 golden."""
    (tmp_path / "s.yaml").write_text("op: tree_build\ncases:\n  - name: two_d\n    depth: 2\n    vocab: 3\n"
                                     "    budget: 3\n    inputs:\n      logits: [[1.0, 2.0, 3.0]]\n")
    done = kdtree("gen-refs", "s.yaml", "-o", "g", "-q", cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr == ("kdtree: error: s.yaml:4: cases[0].depth: depth: 2 declared, but the inline inputs "
                           "(logits [1, 3]) make depth 1\n")


@pytest.mark.parametrize("beside", ["", ", root_token: [3]", ", start: [7]", ", root_token: [3], start: [7]"],
                         ids=["logits", "root_token", "start", "both"])
def test_inline_logits_beside_root_or_start_that_contradict_the_depth_are_refused(tmp_path, beside):
    """Issue 36: with `root_token:` or `start:` given inline too, the same case was written with
    params.depth 1 and case_params.depth 2 (the declared params were hidden by a loop variable)."""
    from kdtr.errors import SpecError
    from kdtr.bundle.spec import load_suite

    path = tmp_path / "s.yaml"
    path.write_text("op: tree_build\ncases:\n  - name: two_d\n    depth: 2\n    vocab: 3\n    budget: 3\n"
                    f"    inputs: {{logits: [[1.0, 2.0, 3.0]]{beside}}}\n")
    with pytest.raises(SpecError, match=r"s\.yaml:4: cases\[0\]\.depth: depth: 2 declared, but the inline inputs "
                                        r"\(logits \[1, 3\].*\) make depth 1"):
        load_suite(path)
    assert not (tmp_path / "g").exists()


def test_trials_of_an_inline_input_golden_are_refused_with_the_reason(tmp_path):
    """Issue 30 row 19: `--trials` on a golden whose inputs the suite gave inline drew unrelated
    shapes from the case's params (a B=1 Q=7 golden, B=4 Q=17 trials) and called them its trials."""
    import json

    assert kdtree("gen-refs", REPO_ROOT / "specs" / "tree_accept.yaml", "-k", "example_b", "-o", "g", "-q",
                  cwd=tmp_path).returncode == 0
    done = kdtree("verify", "g", "--trials", "2", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [(row.get("trial", 0), row.get("skipped")) for row in rows] == [
        (0, None), (1, "no trials: its inputs (parents, target_ids, tokens) were given inline, and its "
                       "generator cannot draw others in their shapes")]
