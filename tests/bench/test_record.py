"""Bench records of synthetic rows: figures, speedups, JSON and its sidecar, merges, --compare, CSV, report."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import replace

import numpy as np
import pytest

from kdtr import bench
from kdtr.bench import BenchRecord, BenchRow, TimingOptions, compare_records
from kdtr.bench.regression import judge
from kdtr.bench.stats import summarize
from kdtr.impl import baselines as make_baselines
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.bench.fakes import CEILINGS, record, row, timing
from tests.helpers import invoke


# -- synthetic records ------------------------------------------------------------------------------

def test_figures_and_flags():
    r = row("a", "cuda", 2.0, primary=True)                  # 1e12 FLOP in 2 ms = 500 TFLOP/s
    assert r.tflops == pytest.approx(500, rel=0.01) and r.gbps == pytest.approx(500, rel=0.01)
    assert r.pct_compute == pytest.approx(500 / 790, rel=0.01)
    assert r.pct_bandwidth == pytest.approx(500 / 4500, rel=0.01) and not r.flagged
    fast = row("a", "cuda", 1.0, primary=True)                 # 1000 TFLOP/s > 790: impossible
    assert fast.flagged and fast.pct_compute > 1
    fp32 = row("a", "cuda", 2.0, primary=True, compute_unit="fp32_fma")
    assert fp32.pct_compute == pytest.approx(500 / 55, rel=0.01) and fp32.flagged
    # fp32 FLOPs done as six bf16 tensor-core products each: rated against a sixth of the bf16 line
    pieces = row("a", "cuda", 2.0, primary=True, compute_unit="bf16_mma_x6")
    assert pieces.pct_compute == pytest.approx(500 / (790 / 6), rel=0.01) and pieces.flagged
    no_ceiling = bench.record.with_figures(replace(r, tflops=None, pct_compute=None), None)
    assert no_ceiling.pct_compute is None and no_ceiling.tflops == pytest.approx(500, rel=0.01)


def test_speedups_are_baseline_over_ours_same_case_and_mode():
    rec = record()
    by = {(r.case, r.impl): r for r in rec.rows}
    assert by["a", "cuda"].speedups == {"torch": pytest.approx(10, rel=0.02)}
    assert by["c", "cuda"].speedups["torch"] == pytest.approx(10, rel=0.02)
    assert by["a", "torch"].speedups == {}                    # quoted for our rows only
    failed = bench.record.with_speedups([replace(by["a", "cuda"], speedups={}),
                                  replace(by["a", "torch"], check_passed=False)])
    assert failed[0].speedups == {}                           # a failed check is never a baseline


def test_record_json_round_trip(tmp_path):
    rec = record()
    path = tmp_path / "r.json"
    bench.write_record(path, rec)
    text = path.read_text()
    data = json.loads(text)
    assert data["kind"] == "kdtree.bench" and data["bench_format"] == bench.record.BENCH_FORMAT
    assert set(data) >= {"meta", "settings", "ceilings", "sanity", "rows", "errors", "not_run", "complete"}
    assert "\n " not in text and data["samples_file"] == "r.samples.npz"         # compact; names its sidecar
    first = data["rows"][0]
    assert set(first["timing"]) >= {"median", "p10", "p90", "rel_std", "rel_ci", "n", "rounds",
                                    "stop_reason", "mode", "method"}
    assert not {"samples_ms", "round_medians"} & set(first["timing"])          # the raw series: in the sidecar
    assert bench.load_record(path) == rec


def _all_timings(rec):
    return [t for r in (*rec.sanity, *rec.rows) for t in (r.timing, r.repeat) if t is not None] + \
        list((rec.ceilings.timings if rec.ceilings else {}).values())


def test_samples_come_back_from_the_sidecar_bit_for_bit(tmp_path):
    rng = np.random.default_rng(7)
    rec = record()
    rows = [replace(r, timing=replace(r.timing, samples_ms=tuple(rng.random(r.timing.n) * 3e-3)))
            if r.timing else r for r in rec.rows]
    rows[0] = replace(rows[0], repeat=replace(rows[0].timing, samples_ms=tuple(rng.random(rows[0].timing.n))))
    ceilings = replace(CEILINGS, timings={"hbm_read": timing(0.5, seed=3)})
    rec = replace(rec, rows=tuple(rows), ceilings=ceilings, sanity=(replace(rows[1], op="sanity"),))
    path = tmp_path / "bench.json"
    bench.write_record(path, rec)
    assert (tmp_path / "bench.samples.npz").is_file()
    back = bench.load_record(path)
    assert back == rec
    for a, b in zip(_all_timings(back), _all_timings(rec)):
        assert np.array_equal(np.asarray(a.samples_ms).view(np.uint64), np.asarray(b.samples_ms).view(np.uint64))
    assert len(_all_timings(back)) == 3 * 2 + 1 + 1 + 1          # 6 rows timed, a repeat, a sanity row, a ceiling


def test_a_record_without_its_sidecar_loads_with_summaries_only(tmp_path):
    path = tmp_path / "bench.json"
    bench.write_record(path, record())
    (tmp_path / "bench.samples.npz").unlink()
    rec = bench.load_record(path)
    assert all(t.samples_ms == () and t.n == 41 for t in _all_timings(rec))
    assert [r.timing.median for r in rec.rows if r.timing] == [r.timing.median for r in record().rows if r.timing]
    report = invoke("report", path, "--csv", tmp_path / "r.csv", "--quiet")
    assert report.exit_code == 0 and "vs_torch=10" in report.output, report.output
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 10
    assert invoke("bench", "--compare", path, path, "--quiet").exit_code == 0
    again = tmp_path / "again.json"                # written again without samples: still loads
    bench.write_record(again, rec)
    assert bench.load_record(again) == rec and not (tmp_path / "again.samples.npz").exists()


def test_a_sidecar_of_another_record_is_refused(tmp_path):
    from kdtr.errors import UsageError

    path = tmp_path / "bench.json"
    bench.write_record(path, record())
    other = tmp_path / "other.json"
    bench.write_record(other, replace(record(), rows=record().rows[:3]))
    (tmp_path / "other.samples.npz").replace(tmp_path / "bench.samples.npz")
    with pytest.raises(UsageError, match="bench.samples.npz.*a sidecar of another run"):
        bench.load_record(path)
    (tmp_path / "bench.samples.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match=r"bench.samples.npz.*not a samples sidecar"):
        bench.load_record(path)


def _default_suites_shape():
    """(op, variant) -> the implementations a GPU run times for each case of specs/bench (ours and
    the default baselines), and the number of cases."""
    from kdtr.bundle import spec
    from kdtr.config import REPO_ROOT

    small = {"tree_accept": dict(batch=2, budget=4, depth=3), "tree_build": dict(batch=2, depth=5, vocab=64, budget=12),
             "verify_attn": dict(batch=2, heads=4, prefix=30, budget=6)}
    items = bench.cases.items_from_suites(spec.load_suites(REPO_ROOT / "specs" / "bench"))
    shape = {}
    for op_name, variant in sorted({(i.op, i.variant) for i in items}):
        op = get_op(op_name)
        gen = op.generate(Case("t", op_name, variant, 1, dict(op._defaults, **small[op_name])))
        baselines = [b.name for b in make_baselines(op, variant, gen.inputs, gen.params) if b.bench.default]
        shape[op_name, variant] = (["cuda", *baselines], sum((i.op, i.variant) == (op_name, variant) for i in items))
    return shape


def test_a_repeat_run_of_the_default_suites_in_both_modes_writes_under_1_mb(tmp_path):
    """Every Timing at its caps (max_samples samples, max_rounds round medians, ours repeated),
    every sample a full-precision float: the worst case of `kdtree bench --repeat --mode both`."""
    opts = TimingOptions()
    rng = np.random.default_rng(0)

    def full(median_ms):
        samples = median_ms * (1 + 0.01 * rng.standard_normal(opts.max_samples))
        return summarize(samples.tolist(), stop_reason="max_samples", mode="cold-rotate", method="graph",
                         calls_per_sample=37, note="14 input sets rotated",
                         round_medians=(median_ms * (1 + 0.01 * rng.standard_normal(opts.max_rounds))).tolist())

    rows = []
    shape = _default_suites_shape()
    for (op_name, variant), (impls, cases) in shape.items():
        for case in range(cases):
            for mode in ("hot", "cold"):
                group = [BenchRow(case=f"{variant}_b8_h64_q33_p{case}", op=op_name, variant=variant,
                                  config={"B": 8, "H": 64, "Q": 33, "prefix": 8192}, impl=impl, mode=mode,
                                  primary=impl == "cuda", timing=full(0.03 * (k + 1)), flops=1.2e9, bytes=5.9e6,
                                  check_passed=True, check="checked out (rel. L2 1.1e-06), lse (rel. L2 3e-07)",
                                  repeat=full(0.03) if impl == "cuda" else None,
                                  repeat_agrees=True if impl == "cuda" else None, setup_s=0.151,
                                  params={"batch": 8, "heads": 64, "prefix": 8192, "prefix_mode": "same",
                                          "budget": 32, "depth": 6, "sharpness": 1.0, "sm_scale": 0.14467963},
                                  extra={"kv_tokens": 8225, "prefix_mode": "same", "kernel": "bf16_wgmma2"})
                         for k, impl in enumerate(impls)]
                rows += [bench.record.with_figures(r, CEILINGS) for r in bench.record.with_speedups(group)]
    sanity = tuple(replace(rows[0], case=f"sanity{i}", op="sanity") for i in range(7))
    ceilings = replace(CEILINGS, timings={k: full(1.0) for k in ("bf16_mma", "fp32_fma", "hbm_read", "hbm_copy",
                                                                 "hbm_copy_eager")})
    rec = BenchRecord(record().meta, record().settings, ceilings, sanity, tuple(rows))
    assert len(rows) == 2 * sum(len(impls) * cases for impls, cases in shape.values()) >= 260
    path = tmp_path / "bench.json"
    bench.write_record(path, rec)
    size = path.stat().st_size
    assert size < 1_000_000, f"{size} bytes"
    assert bench.load_record(path) == rec


def test_bench_meta_names_no_folder_of_the_machine(tmp_path, monkeypatch):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "cli" / "__main__.py"), "bench", str(tmp_path / "specs"),
                                      f"--json={tmp_path / 'out' / 'b.json'}", "/elsewhere/x.kdtr"])
    monkeypatch.setattr(sys, "orig_argv", ["/opt/venv/bin/python", "-m", "cli", *sys.argv[1:]])
    meta = bench.record.bench_meta()
    elsewhere = os.path.relpath("/elsewhere/x.kdtr")
    assert meta["argv"] == ["kdtree", "bench", "specs", "--json=out/b.json", elsewhere]
    assert meta["command_line"] == f"python -m cli bench specs --json=out/b.json {elsewhere}"
    assert str(tmp_path) not in json.dumps(meta)


def test_source_digest_names_the_code_not_the_checkout(tmp_path):
    """A record's sources_sha256 follows the files (a copied tree with a stale .git still says which
    code ran) and ignores what is not code."""
    from kdtr.records.report import source_digest

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kdtr").mkdir()
    (tmp_path / "kernels" / "a.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "kdtr" / "x.py").write_text("X = 1\n")
    first = source_digest.__wrapped__(tmp_path)
    (tmp_path / "results.md").write_text("not code\n")
    assert source_digest.__wrapped__(tmp_path) == first
    (tmp_path / "kdtr" / "x.py").write_text("X = 2\n")
    changed = source_digest.__wrapped__(tmp_path)
    assert changed != first
    (tmp_path / "kdtr" / "x.py").rename(tmp_path / "kdtr" / "y.py")     # same bytes, other path
    assert source_digest.__wrapped__(tmp_path) != changed


def test_bench_selection_meta_names_the_shard_and_the_whole_selection():
    from kdtr.scaleout.parallel import Shard

    items = [bench.cases.BenchItem(f"c{i}", "tree_accept", "default", {"batch": i}, "s.yaml")
             for i in range(4)]
    whole = bench.cases.selection_meta(items, None)
    assert whole["shard"] == "1/1"
    assert bench.cases.selection_meta(items, Shard(2, 3)) == {"shard": "2/3", "suite_sha256": whole["suite_sha256"]}
    other = bench.cases.selection_meta(items[:3], None)["suite_sha256"]
    assert other != whole["suite_sha256"]


def test_bench_shards_merge_only_when_they_make_one_run():
    """`report --merge` of bench records: the shards of one selection join; a shard twice, a
    missing one or one of another selection is refused, naming the record."""
    from dataclasses import replace

    from kdtr.errors import UsageError

    def shard(i, n, suite="a" * 64):
        rec = record(seed=i)
        return replace(rec, meta=rec.meta | {"shard": f"{i}/{n}", "suite_sha256": suite})

    merged = bench.merge_shards([shard(2, 2), shard(1, 2)], ["b.json", "a.json"])
    assert merged.meta["shards"] == ["1/2", "2/2"] and merged.meta["shard"] == "1/1"
    assert len(merged.rows) == 2 * len(record().rows)
    for bad in ([shard(1, 2), shard(1, 2)], [shard(1, 2)], [shard(1, 2), shard(2, 2, suite="b" * 64)]):
        with pytest.raises(UsageError, match="not the shards of one run"):
            bench.merge_shards(bad, [f"r{i}.json" for i in range(len(bad))])


def test_load_record_refuses_what_is_not_a_record(tmp_path):
    from kdtr.errors import UsageError

    (tmp_path / "x.json").write_text("{not json")
    (tmp_path / "y.json").write_text(json.dumps({"kind": "kdtree.verify"}))
    for name in ("x.json", "y.json", "missing.json"):
        with pytest.raises(UsageError, match=name):
            bench.load_record(tmp_path / name)


def test_judge():
    old = timing(2.0, 0.002)
    assert judge(old, old, 0.1)[0] == "same"
    verdict, ratio, noise, regression = judge(old, timing(2.4, 0.002, seed=5), 0.1)
    assert verdict == "slower" and ratio == pytest.approx(1.2, rel=0.01) and regression
    assert judge(old, timing(2.1, 0.002, seed=5), 0.1)[0] == "slower"       # real, below the threshold
    assert not judge(old, timing(2.1, 0.002, seed=5), 0.1)[3]
    assert judge(old, timing(1.6, 0.002, seed=5), 0.1)[0] == "faster"
    noisy_old, noisy_new = replace(old, rel_ci=0.3), replace(old, median=2.2, rel_ci=0.3)
    assert judge(noisy_old, noisy_new, 0.1)[0] == "ambiguous"


def test_compare_records():
    same = compare_records(record(), record())
    assert not same.regressions and same.count("same") == 6 and same.count("untimed") == 3
    slower = compare_records(record(), record(scale=1.2, seed=100))
    assert len(slower.regressions) == 3 and all(r.impl == "cuda" for r in slower.regressions)
    assert {r.verdict for r in slower.rows if r.impl == "cuda"} == {"slower"}
    faster = compare_records(record(), record(scale=0.8, seed=100))
    assert not faster.regressions and faster.count("faster") == 3
    new = record()
    rows = list(new.rows)
    rows[0] = replace(rows[0], timing=None, check_passed=False, check="out: 3 of 10 elements fail")
    failing = compare_records(record(), replace(new, rows=tuple(rows[:-3])))
    assert [r.verdict for r in failing.regressions] == ["failed"]
    assert failing.count("missing") == 3
    other = replace(record(), meta={"device": {"gpu": "NVIDIA H100"}},
                    ceilings=replace(CEILINGS, bf16_mma_tflops=600.0))
    notes = compare_records(record(), other).notes
    assert any("different GPUs" in n for n in notes) and any("bf16_mma_tflops" in n for n in notes)


def test_csv_has_one_line_per_row_and_a_speedup_column_per_baseline():
    text = bench.bench_csv(record())
    lines = list(csv.reader(io.StringIO(text)))
    header, body = lines[0], lines[1:]
    assert header[:len(bench.record.CSV_HEADER)] == bench.record.CSV_HEADER
    assert header[len(bench.record.CSV_HEADER):] == ["speedup_vs_torch"]
    assert len(body) == 9 and all(len(line) == len(header) for line in body)
    first = dict(zip(header, body[0]))
    assert first["impl"] == "cuda" and float(first["median_us"]) == pytest.approx(2000, rel=0.01)
    assert float(first["speedup_vs_torch"]) == pytest.approx(10, rel=0.02)


# -- the CLI: --compare -----------------------------------------------------------------------------

@pytest.fixture
def records(tmp_path):
    paths = {}
    for name, rec in (("base", record()), ("slow", record(scale=1.2, seed=100)),
                      ("fast", record(scale=0.8, seed=100))):
        paths[name] = tmp_path / f"{name}.json"
        bench.write_record(paths[name], rec)
    return paths


def test_cli_compare_with_itself_exits_0(records):
    result = invoke("bench", "--compare", records["base"], records["base"])
    assert result.exit_code == 0, result.output
    assert "0 regression(s)" in result.output


def test_cli_compare_20_percent_slower_exits_1(records):
    result = invoke("bench", "--compare", records["base"], records["slow"], "--quiet")
    assert result.exit_code == 1, result.output
    assert "SLOWER" in result.output and "REGRESSION" in result.output
    assert "3 regression(s) beyond 10%" in result.output


def test_cli_compare_faster_exits_0_and_threshold_applies(records, tmp_path):
    assert invoke("bench", "--compare", records["base"], records["fast"]).exit_code == 0
    # 20% slower is no regression when the threshold is 25%
    assert invoke("bench", "--compare", records["base"], records["slow"], "--threshold", "0.25").exit_code == 0
    out = tmp_path / "cmp.json"
    result = invoke("bench", "--compare", records["base"], records["slow"], "--json", out)
    assert result.exit_code == 1
    data = json.loads(out.read_text())
    assert data["threshold"] == 0.1 and sum(r["regression"] for r in data["rows"]) == 3


def test_cli_compare_bad_records_exit_2(records, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    result = invoke("bench", "--compare", bad, records["base"])
    assert result.exit_code == 2 and "not a kdtree bench record" in result.output
    assert invoke("bench", "--compare", tmp_path / "absent.json", records["base"]).exit_code == 2
    assert invoke("bench", records["base"]).exit_code == 2          # a record without --compare


def test_cli_report_renders_and_writes_csv(records, tmp_path):
    out = tmp_path / "r.csv"
    result = invoke("report", records["base"], "--csv", out)
    assert result.exit_code == 0, result.output
    assert "NVIDIA H200" in result.output and "10.00×" in result.output
    assert "skipped sdpa in 3 case(s): would need ~146 GB" in result.output
    assert len(out.read_text().splitlines()) == 10


def test_cli_report_names_the_kernel_our_launch_picked(tmp_path):
    """A GPU record keeps the kernel each case launched (extra["kernel"]): shown beside our rows only."""
    rec = record()
    rows = [replace(r, extra={"kernel": "bf16_wgmma2"}) if i < 2 else r   # ours and a baseline of case a
            for i, r in enumerate(rec.rows)]
    rec = replace(rec, rows=tuple(rows))
    path = tmp_path / "k.json"
    bench.write_record(path, rec)
    table = invoke("report", path)
    assert table.exit_code == 0 and table.output.count("bf16_wgmma2") == 1, table.output
    plain = invoke("report", path, "--quiet")
    lines = [line for line in plain.output.splitlines() if "kernel=" in line]
    assert len(lines) == 1 and lines[0].startswith("cuda verify_attn/bf16_paged a cold kernel=bf16_wgmma2 ")


def test_cli_report_shows_the_grid_our_launch_picked(tmp_path):
    """The launch's shape-dependent choices (extra["grid"]: row tiles, B, KV splits) stand beside
    the kernel: in the table, and as grid= in the plain lines."""
    rec = record()
    rows = [replace(r, extra={"kernel": "bf16_wgmma2", "grid": [9, 8, 3]}) if i == 0 else r
            for i, r in enumerate(rec.rows)]
    path = tmp_path / "g.json"
    bench.write_record(path, replace(rec, rows=tuple(rows)))
    table = invoke("report", path)
    assert table.exit_code == 0 and "9×8×3" in table.output, table.output
    plain = invoke("report", path, "--quiet")
    assert " kernel=bf16_wgmma2 grid=9x8x3 median=" in plain.output, plain.output


def test_cli_report_names_baselines_cut_by_the_time_limit_and_repeat_disagreements(tmp_path):
    rec = record()
    rows = list(rec.rows)
    ours = rows[0]
    rows[0] = replace(ours, repeat=replace(ours.timing, median=ours.timing.median * 1.02),
                      repeat_agrees=False)
    rows[3] = replace(rows[3], repeat=rows[3].timing, repeat_agrees=True)
    rows[4] = replace(rows[4], timing=None, skip=bench.record.TIME_LIMIT_SKIP, speedups={})
    path = tmp_path / "cut.json"
    bench.write_record(path, replace(rec, rows=tuple(rows), complete=False, not_run=("verify_attn/bf16_paged d",)))
    result = invoke("report", path, "--quiet")
    assert result.exit_code == 0, result.output
    assert "skipped torch in 1 case(s): the run's time limit was reached: b" in result.output
    assert "repeat: 1 of 2 second timings agree with the first within the reported noise: not a (+2.0%" in result.output
    assert "not run (time limit): 1 case(s): verify_attn/bf16_paged d" in result.output
    assert "rounds stopped: 3 converged" in result.output


def test_cli_report_plot(records, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    result = invoke("report", records["base"], "--plot", png, "--quiet")
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_series():
    from kdtr.reports.plot import prefix_series, roofline_points

    rec = record()
    prefixes = {0: 1024, 3: 4096}                   # case a and b of our kernel: a prefix sweep
    rows = [replace(r, config={"B": 1, "H": 16, "prefix": prefixes[i]}) if i in prefixes else r
            for i, r in enumerate(rec.rows)]
    rec = replace(rec, rows=tuple(rows))
    series = prefix_series(rec)
    assert list(series.values()) == [[(1024, rec.rows[0].timing.median), (4096, rec.rows[3].timing.median)]]
    groups = roofline_points(rec)
    assert set(groups) == {"cuda (verify_attn/bf16_paged)", "torch (verify_attn/bf16_paged)"}


def test_committed_h200_records_still_load_and_render(tmp_path):
    """Records of the format before the sidecar (indented, samples inline) still load and render."""
    from kdtr.config import REPO_ROOT

    records = sorted((REPO_ROOT / "results").glob("**/bench*.json"))
    if not records:
        pytest.skip("no committed bench records")
    for path in records:
        rec = bench.load_record(path)
        assert rec.ceilings is not None and rec.rows
        assert all(len(r.timing.samples_ms) == r.timing.n for r in rec.rows if r.timing)   # inline samples
        result = invoke("report", path, "--csv", tmp_path / "r.csv")
        assert result.exit_code == 0, result.output
        assert "ceilings measured in this run" in result.output
        # a record with fp32_bf16x3 rows says what their percentages are of
        sixth = any(r.compute_unit == "bf16_mma_x6" for r in rec.rows)
        assert ("against a sixth of bf16 MMA" in " ".join(result.output.split())) == sixth, path
        assert invoke("bench", "--compare", path, path, "--quiet").exit_code == 0
