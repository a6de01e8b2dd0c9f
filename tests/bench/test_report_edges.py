"""Records and reports at their edges (issue 36), tried as a hostile user would: each bad record is
one line naming the record and the field, exit 2, for plain `report`, `--compare-gpus` and `--html`
alike; `kdtree report` renders verify records too."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kdtr.config import REPO_ROOT
from tests.bench.fakes import h200, other_gpu
from tests.helpers import invoke

VERIFY = REPO_ROOT / "results" / "verify-cuda.json"


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def one_line(result, *words: str) -> str:
    """Exit 2, one `kdtree: error:` line holding every word, no traceback."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("kdtree: error: "), result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _gpu_ceiling(value):
    def change(data):
        data["meta"]["gpu"]["ceilings"]["hbm_copy_gbps"] = value
    return change


def _ceiling(value):
    def change(data):
        data["ceilings"]["hbm_copy_gbps"] = value
    return change


def _no_ceiling(where):
    def change(data):
        (data["meta"]["gpu"]["ceilings"] if where == "meta.gpu.ceilings" else data["ceilings"]).pop("hbm_copy_gbps")
    return change


BAD_CEILINGS = [("ceilings.hbm_copy_gbps", _ceiling(0)), ("ceilings.hbm_copy_gbps", _ceiling("fast")),
                ("ceilings.hbm_copy_gbps", _no_ceiling("ceilings")),
                ("meta.gpu.ceilings.hbm_copy_gbps", _gpu_ceiling(0)),
                ("meta.gpu.ceilings.hbm_copy_gbps", _gpu_ceiling("fast")),
                ("meta.gpu.ceilings.hbm_copy_gbps", _no_ceiling("meta.gpu.ceilings"))]


@pytest.fixture(scope="module")
def b200(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("records") / "b200.json", other_gpu(h200()))


@pytest.mark.parametrize("how", ["plain", "--compare-gpus", "--html"])
@pytest.mark.parametrize("field, change", BAD_CEILINGS,
                         ids=["zero", "string", "missing", "gpu-zero", "gpu-string", "gpu-missing"])
def test_a_ceiling_that_is_not_a_positive_number_is_one_line(tmp_path, b200, how, field, change):
    data = other_gpu(h200())
    change(data)
    bad = write(tmp_path / "bad.json", data)
    args = {"plain": [bad], "--compare-gpus": [b200, bad, how], "--html": [bad, how, tmp_path / "r.html"]}[how]
    one_line(invoke("report", *args), "bad.json", field)
    assert not (tmp_path / "r.html").exists()


def test_the_control_reads_the_same_record_whole(b200, tmp_path):
    """The records above differ from this one in the one ceiling: it renders in each mode."""
    assert invoke("report", b200, "-q").exit_code == 0
    assert invoke("report", b200, b200, "--html", tmp_path / "r.html").exit_code == 0
    twin = write(tmp_path / "twin.json", other_gpu(h200()))
    assert invoke("report", b200, twin, "--compare-gpus").exit_code == 0


def test_records_that_share_no_case_say_why(b200, tmp_path):
    renamed = other_gpu(h200())
    for row in renamed["rows"]:
        row["case"] = "other_" + row["case"]
    line = one_line(invoke("report", b200, write(tmp_path / "renamed.json", renamed), "--compare-gpus"),
                    "no case to compare", "none of its")
    other_params = other_gpu(h200())
    for row in other_params["rows"]:
        row["params"]["sm_scale"] = 0.5
    line = one_line(invoke("report", b200, write(tmp_path / "params.json", other_params), "--compare-gpus"),
                    "differ in implementation, mode or parameters")
    assert "params.json" in line


@pytest.mark.parametrize("median", [-1.0, "nan", 0])
def test_a_median_that_is_not_a_time_is_named(b200, tmp_path, median):
    data = other_gpu(h200())
    index = next(i for i, row in enumerate(data["rows"]) if row["timing"])
    data["rows"][index]["timing"]["median"] = median
    one_line(invoke("report", b200, write(tmp_path / "bad.json", data), "--compare-gpus"),
             "bad.json", f"rows[{index}].timing.median", "not a time")


def test_a_case_held_twice_is_refused(b200, tmp_path):
    data = other_gpu(h200())
    index = next(i for i, row in enumerate(data["rows"]) if row["timing"])
    data["rows"].append(copy.deepcopy(data["rows"][index]))
    one_line(invoke("report", b200, write(tmp_path / "twice.json", data), "--compare-gpus"),
             "twice.json", f"rows[{index}] and rows[{len(data['rows']) - 1}] are the same case")


@pytest.mark.parametrize("kind", ["bench", "verify"])
@pytest.mark.parametrize("how", ["plain", "--html", "--merge"])
def test_a_record_of_a_newer_format_is_refused(tmp_path, kind, how):
    data = other_gpu(h200()) if kind == "bench" else json.loads(VERIFY.read_text())
    data["meta"]["format"] = 99
    newer = write(tmp_path / "newer.json", data)
    args = {"plain": [newer], "--html": [newer, how, tmp_path / "r.html"],
            "--merge": [newer, newer, how, tmp_path / "m.json"]}[how]
    one_line(invoke("report", *args), "newer.json", "meta.format", "newer kdtree")


def test_html_shows_control_characters_as_escapes(tmp_path):
    data = other_gpu(h200())
    data["rows"][0]["case"] = "a\x1b[31mred"
    verify = json.loads(VERIFY.read_text())
    verify["rows"] = verify["rows"][:2]
    verify["rows"][0]["error"] = "bell\x07 and escape\x1b[2J"
    page_path = tmp_path / "r.html"
    result = invoke("report", write(tmp_path / "esc.json", data), write(tmp_path / "v.json", verify),
                    "--html", page_path)
    assert result.exit_code == 0, result.output
    page = page_path.read_text()
    assert "\x1b" not in page and "\x07" not in page
    assert "a\\x1b[31mred" in page and "bell\\x07 and escape\\x1b[2J" in page


def test_report_renders_a_verify_record(tmp_path):
    """The README: `kdtree report R.json` re-renders bench and verify records."""
    data = json.loads(VERIFY.read_text())
    data["rows"] = data["rows"][:3]
    data["rows"][1].update(passed=False, error="a reason of its own")
    path = write(tmp_path / "v.json", data)
    table = invoke("report", path)
    assert table.exit_code == 0, table.output
    assert "kdtree verify" in table.output and "2 passed, 1 failed" in table.output
    assert "a reason of its own" in table.output and "kernels: 18 loaded" in table.output
    lines = invoke("report", path, "-q")
    assert lines.exit_code == 0 and lines.output.count("PASS ") == 2 and "FAIL " in lines.output
    one_line(invoke("report", path, "--csv", tmp_path / "v.csv"), "--csv is for bench records")
    assert not (tmp_path / "v.csv").exists()
