"""Verify records: one frozen type, compact, portable, and merges that join whole runs only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kdtr.records import report
from kdtr.config import REPO_ROOT
from kdtr.bundle.format import read_bundle, write_bundle
from kdtr.scaleout.parallel import Shard
from kdtr.bundle.refs import gen_refs
from kdtr.bundle.spec import load_suites
from kdtr.verify import (Options, VerifyRecord, find_bundles, load_verify, suite_digest, verify_bundle,
                         verify_record)
from tests.helpers import run_kdtree as kdtree


MAX_RECORD_BYTES = 1 << 20      # issue 19: a default-suite record with --trials 20 stays under 1 MB
TRIALS = 20


def test_a_default_suite_record_with_20_trials_stays_under_1_mb(tmp_path):
    """The default suites' goldens, verified on torch for real (trial 0: real metrics of every
    output); the 20 trials of each are those rows again with their trial and seed, the count and
    structure `verify --trials 20` writes (a trial differs only in its numbers)."""
    suites = load_suites([REPO_ROOT / "specs"])
    list(gen_refs([(s, c) for s in suites for c in s.cases], tmp_path / "goldens"))
    files = find_bundles([tmp_path / "goldens"])
    assert len(files) == 54
    rows = []
    for file in files:
        (row,) = verify_bundle(file, Options(backend="torch"))
        rows += [row] + [dataclasses.replace(row, trial=t, seed=2**31 - t) for t in range(1, TRIALS + 1)]
    assert len(rows) == 54 * 21
    out = tmp_path / "verify.json"
    report.write_json(out, verify_record(rows, [], suite=suite_digest(files)))
    assert out.stat().st_size < MAX_RECORD_BYTES, out.stat().st_size
    back = load_verify(out)                     # seconds are kept to the microsecond
    assert back.rows == tuple(dataclasses.replace(r, seconds=round(r.seconds, 6)) for r in rows)
    assert back.summary["passed"] == len(rows)


def test_a_record_round_trips_as_frozen_dataclasses_and_feeds_junit(goldens, tmp_path):  # noqa: F811
    bad = tmp_path / "bad" / "tree_accept" / "broken.kdtr"
    source = read_bundle(sorted((goldens / "tree_accept").glob("*.kdtr"))[0])
    tensors = [(e.name, e.role, source.array(e.name).copy()) for e in source.entries]
    for name, role, array in tensors:
        if role == "output" and name == "accept_len":
            array += 1                                      # every request's length off by one
    write_bundle(bad, source.meta | {"case": "broken"}, tensors)
    files = find_bundles([goldens, bad.parent.parent])
    rows = [row for f in files for row in verify_bundle(f, Options(backend="numpy", trials=1))]
    record = verify_record(rows, ["x.kdtr: unreadable"], suite=suite_digest(files))
    path = tmp_path / "r.json"
    report.write_json(path, record)
    back = load_verify(path)
    assert isinstance(back, VerifyRecord) and back.errors == record.errors
    assert back.rows == tuple(dataclasses.replace(r, seconds=round(r.seconds, 6)) for r in record.rows)
    failing = [r for r in back.rows if not r.passed]
    assert [(r.case, r.trial) for r in failing] == [("broken", 0)]      # trial 1: fresh inputs, passes
    (check,) = [o for o in failing[0].outputs if o.name == "accept_len"]
    assert check.worst and check.tol_share == float("inf"), "a failing output keeps its worst elements"
    assert all(not o.worst for r in back.rows for o in r.outputs if o.passed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.rows = ()                                      # type: ignore[misc]
    xml = report.junit_xml(back)
    assert xml.count("<failure") == 1 and 'errors="1"' in xml and "accept_len:" in xml


def test_keep_worst_keeps_passing_outputs_worst_elements(goldens):  # noqa: F811
    file = sorted((goldens / "verify_attn").glob("*.kdtr"))[0]
    (kept,) = verify_bundle(file, Options(backend="torch", keep_worst=True))
    (default,) = verify_bundle(file, Options(backend="torch"))
    assert kept.passed and all(len(o.worst) == 5 for o in kept.outputs)
    assert all(o.worst == () for o in default.outputs)


def test_a_record_names_no_absolute_folder(goldens, tmp_path):  # noqa: F811
    out = tmp_path / "abs.json"
    done = kdtree("verify", goldens, "--backend", "numpy", "-q", f"--json={out}", "--junit", tmp_path / "j.xml",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert str(tmp_path) not in text and str(REPO_ROOT) not in text
    data = json.loads(text)
    assert data["meta"]["argv"][:2] == ["kdtree", "verify"]
    assert data["meta"]["argv"][2] == "goldens" and "--json=abs.json" in data["meta"]["argv"]
    assert {row["file"].split("/")[0] for row in data["rows"]} == {"goldens"}


def shard_records(goldens: Path, tmp_path: Path, count: int, *extra: str) -> list[Path]:  # noqa: F811
    """Every shard's record (a shard the selection leaves empty too: --allow-empty-shard)."""
    paths = []
    for index in range(1, count + 1):
        path = tmp_path / f"s{index}of{count}{'_'.join(extra)}.json"
        done = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", f"{index}/{count}",
                      "--json", path, "--allow-empty-shard", *extra, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        paths.append(path)
    return paths


def test_merges_join_whole_runs_and_refuse_duplicate_missing_and_foreign_shards(goldens, tmp_path):  # noqa: F811
    s1, s2 = shard_records(goldens, tmp_path, 2)
    _, k2 = shard_records(goldens, tmp_path, 2, "-k", "fp32")      # another selection: another suite
    merged = tmp_path / "all.json"
    joined = kdtree("report", s1, s2, "--merge", merged, cwd=tmp_path)
    assert joined.returncode == 0, joined.stderr
    assert "(shards 1/2, 2/2): 5 passed, 0 failed" in joined.stdout
    assert load_verify(merged).meta["shards"] == ["1/2", "2/2"]
    for args, words in (((s1, s1), "s1of2.json: shard 1/2 again (also s1of2.json)"),
                        ((s1,), "shard(s) 2/2 missing"),
                        ((s1, k2), "s2of2-k_fp32.json: suite")):
        done = kdtree("report", *args, "--merge", tmp_path / "bad.json", cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert words in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert not (tmp_path / "bad.json").exists()


def test_check_shards_for_any_record_kind():
    meta = {"suite_sha256": "a" * 64}
    assert report.check_shards([meta | {"shard": "1/1"}]) == []
    assert report.check_shards([meta | {"shard": "2/3"}, meta | {"shard": "1/3"}, meta | {"shard": "3/3"}]) == []
    assert report.check_shards([meta | {"shard": "1/2"}, meta | {"shard": "1/3"}], ["a", "b"]) == \
        ["b: shard 1/3 is not one of 2 like a's"]
    assert report.check_shards([{"shard": "1/1"}], ["old.json"]) == \
        ["old.json: no shard or suite digest in its meta (re-run it with this kdtree)"]


def test_the_suite_digest_names_the_selection_and_its_bytes(goldens, tmp_path):  # noqa: F811
    files = find_bundles([goldens])
    assert suite_digest(files) == suite_digest(list(reversed(files)))
    assert suite_digest(files[1:]) != suite_digest(files)
    first = read_bundle(files[0])
    tensors = [(e.name, e.role, first.array(e.name).copy()) for e in first.entries]
    tensors[0][2].reshape(-1)[0] += 1
    write_bundle(files[0], first.meta, tensors)
    assert suite_digest(files) != suite_digest([*files[1:], tmp_path / "none" / files[0].name])
    assert Shard(1, 2).owns("x") != Shard(2, 2).owns("x")


def test_a_row_says_when_a_tolerance_is_looser_than_the_ops_default(goldens, tmp_path):  # noqa: F811
    file = sorted((goldens / "verify_attn").glob("fp32_*.kdtr"))[0]
    bundle = read_bundle(file)
    default = bundle.meta["tolerance"]["out"]
    tensors = [(e.name, e.role, bundle.array(e.name)) for e in bundle.entries]
    loose = tmp_path / "verify_attn" / "loose.kdtr"
    write_bundle(loose, bundle.meta | {"tolerance": {"out": default | {"atol": default["atol"] * 10}}}, tensors)
    tight = tmp_path / "verify_attn" / "tight.kdtr"
    write_bundle(tight, bundle.meta | {"tolerance": {"out": default | {"atol": default["atol"] / 10, "rtol": 0.0}}},
                 tensors)                               # (dropping the default's l2 bound would loosen it)
    assert [r.loosened for r in verify_bundle(file, Options(backend="torch"))] == [False]
    assert [r.loosened for r in verify_bundle(loose, Options(backend="torch"))] == [True]
    assert [r.loosened for r in verify_bundle(tight, Options(backend="torch"))] == [False]
    assert [r.loosened for r in verify_bundle(file, Options(backend="torch", rtol=1.0))] == [True]
    exact = sorted((goldens / "tree_accept").glob("*.kdtr"))[0]
    meta = read_bundle(exact).meta
    relaxed = tmp_path / "tree_accept" / "relaxed.kdtr"
    write_bundle(relaxed, meta | {"tolerance": meta["tolerance"] | {"bonus": {"atol": 1}}},
                 [(e.name, e.role, read_bundle(exact).array(e.name)) for e in read_bundle(exact).entries])
    assert [r.loosened for r in verify_bundle(relaxed, Options(backend="numpy"))] == [True]


def test_a_merge_checks_the_bundles_not_only_the_meta(goldens, tmp_path):  # noqa: F811
    """Issue 35: shard 1/2's record copied and its meta.shard edited to 2/2, or another selection's
    shard with its suite digest edited to this suite's, merged as a whole run ("two cases twice,
    the others missing"). Each record lists its shard's bundles; the merge checks them."""
    s1, s2 = shard_records(goldens, tmp_path, 2)
    _, k2 = shard_records(goldens, tmp_path, 2, "-k", "fp32")
    relabelled = json.loads(s1.read_text())
    relabelled["meta"]["shard"] = "2/2"
    (tmp_path / "relabelled.json").write_text(json.dumps(relabelled))
    foreign = json.loads(k2.read_text())
    foreign["meta"]["suite_sha256"] = json.loads(s2.read_text())["meta"]["suite_sha256"]
    (tmp_path / "foreign.json").write_text(json.dumps(foreign))
    stale = json.loads(s2.read_text())
    del stale["meta"]["bundles"]
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    for second, words in (("relabelled.json", "is also in s1of2.json"),
                          ("foreign.json", "not the suite their digest names"),
                          ("stale.json", "no list of its bundles in its meta")):
        done = kdtree("report", s1, tmp_path / second, "--merge", tmp_path / "bad.json", cwd=tmp_path)
        assert done.returncode == 2 and words in done.stderr, (second, done.stderr)
        assert done.stderr.count("\n") == 1 and not (tmp_path / "bad.json").exists()
    rows_moved = json.loads(s2.read_text())
    rows_moved["rows"] += json.loads(s1.read_text())["rows"]        # s1's rows, copied into s2's record
    (tmp_path / "moved.json").write_text(json.dumps(rows_moved))
    done = kdtree("report", s1, tmp_path / "moved.json", "--merge", tmp_path / "bad.json", cwd=tmp_path)
    assert done.returncode == 2 and "not among its bundles" in done.stderr, done.stderr
