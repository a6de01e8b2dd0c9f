"""Verify as a library (kdtr.verify.run_verify, verify_item) and the records of the branch point
(639ceb5, before the verify package and the record base) still loading, field for field."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from kdtr.bench import load_record, write_record
from kdtr.errors import KdtreeError
from kdtr.impl import ImplRef, resolve
from kdtr.verify import NothingRan, Options, Selection, load_verify, run_verify, verify_bundle, verify_item

RECORDS = Path(__file__).parents[1] / "data" / "records"


def test_run_verify_is_the_command_without_the_terminal(goldens):
    seen = []
    record = run_verify(Selection((goldens,)), Options(backend="numpy"), progress=seen.append)
    assert record.summary["cases"] == record.summary["passed"] == 5 and not record.errors
    assert [d.done for d in seen] == [1, 2, 3, 4, 5] and {d.total for d in seen} == {5}
    assert record.meta["shard"] == "1/1" and record.meta["suite_sha256"]
    with pytest.raises(KdtreeError, match=re.escape("no bundles to verify match -k 'nothing_*'")):
        run_verify(Selection((goldens,), pattern="nothing_*"), Options(backend="numpy"))


def test_nothing_ran_is_an_error_that_carries_the_record(goldens):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: cuda runs")
    with pytest.raises(NothingRan, match="nothing ran: cuda: ") as caught:
        run_verify(Selection((goldens / "tree_accept",)), Options(impls=(ImplRef("cuda", "cuda"),)))
    (row,) = caught.value.record.rows
    assert row.skipped and not row.passed and not row.failed


def test_verify_item_gives_the_rows_of_kdtree_verify(goldens):
    """One bundle, one resolved implementation: the rows `kdtree verify --impl torch` makes."""
    bundle = sorted((goldens / "verify_attn").glob("*.kdtr"))[0]
    options = Options(trials=1)
    direct = verify_item(bundle, resolve("torch"), options)
    as_command = verify_bundle(bundle, Options(trials=1, impls=(ImplRef("torch", "torch"),)))
    strip = [{k: v for k, v in r.to_plain().items() if k != "seconds"} for r in direct]
    assert strip == [{k: v for k, v in r.to_plain().items() if k != "seconds"} for r in as_command]
    assert [r.trial for r in direct] == [0, 1] and all(r.impl == "torch" for r in direct)
    assert verify_item(bundle, ImplRef("torch", "torch"), options)[0].passed
    assert verify_item(bundle, resolve("tree_accept=math:sqrt"), options) == []     # not served: no rows


def test_a_verify_record_of_the_branch_point_loads_field_for_field():
    data = json.loads((RECORDS / "verify-639ceb5.json").read_text())
    record = load_verify(RECORDS / "verify-639ceb5.json")
    assert record.to_plain() == data


def test_a_bench_record_of_the_branch_point_loads_and_writes_back(tmp_path):
    for name in ("bench-639ceb5.json", "bench-639ceb5.samples.npz"):
        shutil.copy(RECORDS / name, tmp_path / name)
    data = json.loads((tmp_path / "bench-639ceb5.json").read_text())
    record = load_record(tmp_path / "bench-639ceb5.json")
    assert record.rows[0].timing.n == len(record.rows[0].timing.samples_ms) > 0     # samples from the sidecar
    write_record(tmp_path / "again.json", record)
    again = json.loads((tmp_path / "again.json").read_text())
    assert {k: v for k, v in again.items() if k != "samples_file"} == \
        {k: v for k, v in data.items() if k != "samples_file"}
    assert load_record(tmp_path / "again.json") == record
