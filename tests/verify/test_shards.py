"""`--shard auto` from the schedulers' variables and `--balance-from`: real CLI runs on small goldens."""

from __future__ import annotations

import json
import zlib

import pytest

from kdtr.config import REPO_ROOT, SCHEDULER_VARIABLES
from kdtr.errors import ConfigError, UsageError
from kdtr.scaleout.parallel import Shard, balanced_owners, shard_items
from kdtr.scaleout.shards import resolve_shard, scheduler_shard
from tests.helpers import kdtree_env, run_kdtree


def kdtree(*args, env_vars=None, cwd=REPO_ROOT):
    """A real `kdtree` process with only the scheduler variables given here."""
    return run_kdtree(*args, cwd=cwd, env=kdtree_env(*SCHEDULER_VARIABLES, **(env_vars or {})))


def bundle_names(folder):
    return sorted(f"{p.parent.name}/{p.stem}" for p in folder.rglob("*.kdtr"))


@pytest.mark.parametrize("first", [0, 1])
def test_slurm_array_shards_cover_the_goldens_once_and_merge(goldens, tmp_path, first):  # noqa: F811
    """An array may start at any index: IDs first and first+1 of COUNT=2 are shards 1/2 and 2/2."""
    records = []
    for task in (first, first + 1):
        record = tmp_path / f"shard{task}.json"
        run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "auto", "--json", record,
                     env_vars={"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": str(first),
                               "SLURM_ARRAY_TASK_COUNT": "2"})
        assert run.returncode == 0, run.stderr
        records.append(record)
    metas = [json.loads(r.read_text())["meta"]["shard"] for r in records]
    assert metas == ["1/2", "2/2"]
    covered = [f"{row['op']}/{row['case']}" for r in records for row in json.loads(r.read_text())["rows"]]
    assert sorted(covered) == bundle_names(goldens)          # every bundle, none twice
    merged = tmp_path / "merged.json"
    run = kdtree("report", *records, "--merge", merged)
    assert run.returncode == 0, run.stderr
    assert json.loads(merged.read_text())["summary"]["passed"] == len(covered)


def test_shard_auto_without_a_scheduler_is_one_line_and_exit_2(goldens):  # noqa: F811
    run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "auto")
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "no scheduler variable is set" in run.stderr


def test_inconsistent_scheduler_values_exit_2(goldens):  # noqa: F811
    run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "auto",
                 env_vars={"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "2"})
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN = 4" in run.stderr


@pytest.mark.parametrize("variables, count, expected", [
    ({"BUILDKITE_PARALLEL_JOB": "2", "BUILDKITE_PARALLEL_JOB_COUNT": "3"}, None, Shard(3, 3)),
    ({"CIRCLE_NODE_INDEX": "0", "CIRCLE_NODE_TOTAL": "4"}, None, Shard(1, 4)),
    ({"JOB_COMPLETION_INDEX": "1"}, 2, Shard(2, 2)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "3"}, None, Shard(3, 3)),
])
def test_each_scheduler_maps_its_zero_based_index(monkeypatch, variables, count, expected):
    for name in SCHEDULER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert scheduler_shard(count) == expected


@pytest.mark.parametrize("variables, count, fault", [
    ({"JOB_COMPLETION_INDEX": "1"}, None, "--shard-count"),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}, None, "SLURM_ARRAY_TASK_MIN is not"),
    ({"CIRCLE_NODE_INDEX": "1"}, None, "CIRCLE_NODE_TOTAL is not"),
    ({"CIRCLE_NODE_INDEX": "0", "CIRCLE_NODE_TOTAL": "2"}, 3, "disagrees"),
    ({"BUILDKITE_PARALLEL_JOB": "0", "BUILDKITE_PARALLEL_JOB_COUNT": "0"}, None, "not in"),
])
def test_inconsistent_variables_are_refused(monkeypatch, variables, count, fault):
    for name in SCHEDULER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=fault):
        scheduler_shard(count)


def test_a_non_integer_variable_names_itself(monkeypatch):
    monkeypatch.setenv("CIRCLE_NODE_INDEX", "one")
    with pytest.raises(ConfigError, match="CIRCLE_NODE_INDEX='one'"):
        scheduler_shard()


def test_shard_options_that_need_shard_are_refused():
    with pytest.raises(UsageError, match="--shard-count needs --shard"):
        resolve_shard(None, 2)
    with pytest.raises(UsageError, match="--shard-count goes with --shard auto"):
        resolve_shard("1/2", 2)


def test_balanced_split_equalises_time_deterministically():
    """Longest first onto the least loaded shard: 8+1+1 | 5+4+1 (10 each) from times that a name
    hash would split anyhow; a key the record lacks counts the median (here 1.5)."""
    costs = {"a": 8.0, "b": 5.0, "c": 4.0, "d": 1.0, "e": 1.0, "f": 1.0, "g": 2.0, "h": 1.0}
    owners = balanced_owners(list("abcdefh"), costs, 2)
    loads = [sum(costs[k] for k, o in owners.items() if o == shard) for shard in (0, 1)]
    assert sorted(loads) == [10.0, 11.0] and owners == balanced_owners(list("hfedcba"), costs, 2)
    with_new = balanced_owners(list("abcdefh") + ["new"], costs, 2)
    assert set(with_new) == set("abcdefh") | {"new"}


def _verify_record(path, seconds):
    rows = [{"op": key.split("/")[0], "case": key.split("/")[1], "seconds": s} for key, s in seconds.items()]
    path.write_text(json.dumps({"kind": "kdtree.verify", "rows": rows}))
    return path


def test_balance_from_a_record_gives_every_case_to_one_shard(tmp_path):
    names = [f"op/case{i}" for i in range(9)]
    record = _verify_record(tmp_path / "r.json", {n: float(i + 1) for i, n in enumerate(names)})
    shards = [resolve_shard(f"{i}/3", None, record) for i in (1, 2, 3)]
    parts = [shard_items(names, str, shard) for shard in shards]
    assert sorted(n for part in parts for n in part) == names
    # Longest first by hand: 9|8|7, then 6->7, 5->8, 4->9 (13 each), 3->shard 1, 2->shard 2, 1->shard 3.
    assert [sum(int(n[-1]) + 1 for n in part) for part in parts] == [16, 15, 14]


def test_balance_from_a_bench_record_reads_its_case_seconds(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"kind": "kdtree.bench", "case_seconds": {"verify_attn/fp32 x": 3.0,
                                                                          "tree_build/default y": 1.0}}))
    assert dict(resolve_shard("1/2", None, path).costs) == {"verify_attn/x": 3.0, "tree_build/y": 1.0}


@pytest.mark.parametrize("content, fault", [
    ("{", "not JSON"), ('{"kind": "other"}', "not a verify or bench"),
    ('{"kind": "kdtree.verify", "rows": []}', "no case times"),
    # issue 35: rows without seconds read as 0 s each, and every case went to shard 1
    ('{"kind": "kdtree.verify", "rows": [{"op": "a", "case": "b"}]}', r"rows\[0\] \(a/b\) has no seconds"),
    ('{"kind": "kdtree.verify", "rows": [{"op": "a", "case": "b", "seconds": null}]}', "has no seconds"),
    ('{"kind": "kdtree.verify", "rows": [{"op": "a", "case": "b", "seconds": 0}]}', "no case times"),
    ('{"kind": "kdtree.bench", "case_seconds": {"a/x b": 0}}', "no case times"),
])
def test_a_bad_balance_record_is_refused(tmp_path, content, fault):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=fault):
        resolve_shard("1/2", None, path)


def test_verify_balanced_from_an_earlier_record_covers_the_goldens_and_merges(goldens, tmp_path):  # noqa: F811
    earlier = tmp_path / "earlier.json"
    assert kdtree("verify", goldens, "--backend", "numpy", "-q", "--json", earlier).returncode == 0
    covered, records = [], []
    for index in (1, 2):
        record = tmp_path / f"b{index}.json"
        run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", f"{index}/2",
                     "--balance-from", earlier, "--json", record)
        assert run.returncode == 0, run.stderr
        covered += [f"{row['op']}/{row['case']}" for row in json.loads(record.read_text())["rows"]]
        records.append(record)
    assert sorted(covered) == bundle_names(goldens)
    assert json.loads(records[0].read_text())["meta"]["shard"].startswith("1/2@")
    assert kdtree("report", *records, "--merge", tmp_path / "merged.json").returncode == 0
    hashed = tmp_path / "hashed.json"           # shard 2/2 of the name-hash split: another split
    kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "2/2", "--json", hashed)
    mixed = kdtree("report", records[0], hashed, "--merge", tmp_path / "mixed.json")
    assert mixed.returncode == 2 and "by name hash" in mixed.stderr and "--balance-from" in mixed.stderr
    assert not (tmp_path / "mixed.json").exists()


def test_gen_refs_and_bench_take_shard_auto_too(goldens, tmp_path):  # noqa: F811
    """gen-refs under Buildkite parallelism: the two jobs write every bundle once between them."""
    specs = goldens.parent / "specs"
    written = []
    for job in ("0", "1"):
        out = tmp_path / f"job{job}"
        run = kdtree("gen-refs", specs, "-o", out, "-q", "--shard", "auto",
                     env_vars={"BUILDKITE_PARALLEL_JOB": job, "BUILDKITE_PARALLEL_JOB_COUNT": "2"})
        assert run.returncode in (0, 2), run.stderr          # 2: a shard the hash left empty says so
        written += bundle_names(out) if out.exists() else []
    assert sorted(written) == bundle_names(goldens)
    bench = kdtree("bench", "--shard", "auto", "--quick")
    assert bench.returncode == 2 and "no scheduler variable is set" in bench.stderr
    assert len(bench.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["1_0", "\u0662", "+2", " 2", "0x2"])
def test_a_slurm_variable_in_anything_but_plain_digits_is_refused(goldens, value):  # noqa: F811
    """Issue 35: int() read "1_0" as 10, Arabic-Indic "٢" and "+2" as 2; a typo must not pick a shard."""
    run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "auto",
                 env_vars={"SLURM_ARRAY_TASK_ID": value, "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "20"})
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert len(run.stderr.strip().splitlines()) == 1 and f"SLURM_ARRAY_TASK_ID={value!r}" in run.stderr


def test_a_stepped_slurm_array_is_refused(goldens):  # noqa: F811
    """Issue 35: --array=0-6:2 gives IDs 0, 2, 4, 6 and COUNT 4; the step was ignored (task 2 ran
    shard 3/4, tasks 4 and 6 none), now every task is refused."""
    run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "auto",
                 env_vars={"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "4",
                           "SLURM_ARRAY_TASK_STEP": "2"})
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "SLURM_ARRAY_TASK_STEP=2" in run.stderr


def test_balance_from_a_record_without_seconds_is_one_line_exit_2(goldens, tmp_path):  # noqa: F811
    """Issue 35: every case went to shard 1/2, shard 2/2 ran nothing and said nothing."""
    earlier = tmp_path / "earlier.json"
    assert kdtree("verify", goldens, "--backend", "numpy", "-q", "--json", earlier).returncode == 0
    data = json.loads(earlier.read_text())
    for row in data["rows"]:
        del row["seconds"]
    earlier.write_text(json.dumps(data))
    run = kdtree("verify", goldens, "--backend", "numpy", "-q", "--shard", "2/2", "--balance-from", earlier)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "has no seconds" in run.stderr


@pytest.mark.parametrize("how", ["--shard", "slurm"])
def test_an_empty_shard_is_refused_unless_allowed_and_the_merge_still_checks(goldens, tmp_path, how):  # noqa: F811
    """Issue 35: `--shard 7/40` (or SLURM_ARRAY_TASK_COUNT=100000000) over 5 bundles exited 0 with
    nothing printed and a record of 0 rows. Now one line, exit 2; with --allow-empty-shard a note,
    an empty record, exit 0, and the merge of every shard still checks every bundle is there."""
    count = 40 if how == "--shard" else 100_000_000
    owners = {(zlib.crc32(name.encode()) % count) + 1 for name in bundle_names(goldens)}
    empty = next(i for i in range(1, count + 1) if i not in owners)

    def run(index, *extra, record=None):
        args = ["verify", goldens, "--backend", "numpy", "-q", *extra, *(["--json", record] if record else [])]
        if how == "--shard":
            return kdtree(*args, "--shard", f"{index}/{count}")
        return kdtree(*args, "--shard", "auto", env_vars={"SLURM_ARRAY_TASK_ID": str(index - 1),
                                                          "SLURM_ARRAY_TASK_MIN": "0",
                                                          "SLURM_ARRAY_TASK_COUNT": str(count)})
    refused = run(empty, record=tmp_path / "refused.json")
    assert refused.returncode == 2 and refused.stdout == "" and not (tmp_path / "refused.json").exists()
    assert len(refused.stderr.strip().splitlines()) == 1
    assert f"shard {empty}/{count} holds none of the 5 selected bundles" in refused.stderr
    allowed = run(empty, "--allow-empty-shard", record=tmp_path / "empty.json")
    assert allowed.returncode == 0, allowed.stderr
    assert "holds none of the 5 selected bundles" in allowed.stderr
    assert json.loads((tmp_path / "empty.json").read_text())["rows"] == []
    if how == "--shard":         # the merge of one shard's record alone: the others are missing
        merge = kdtree("report", tmp_path / "empty.json", "--merge", tmp_path / "m.json")
        assert merge.returncode == 2 and "missing" in merge.stderr


def test_allow_empty_shard_needs_shard(goldens):  # noqa: F811
    run = kdtree("verify", goldens, "--backend", "numpy", "--allow-empty-shard")
    assert run.returncode == 2 and "--allow-empty-shard goes with --shard" in run.stderr
