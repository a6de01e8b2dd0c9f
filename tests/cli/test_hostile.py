"""Hostile input to the command line (issue 30, rows 3, 4, 6, 16, 20, 21): names and messages print
literally, a full disk is one line and exit 2, an output never overwrites an input, odd option
values are refused or done and said, usage errors are one line. Real subprocesses: the exit code
and the streams are the point."""

from __future__ import annotations

import json
import os
import pty
import re
import resource
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from kdtr.bundle.format import read_bundle, write_bundle

from tests.helpers import kdtree_command, kdtree_env, perturbed_copy, run_kdtree

HOSTILE_NAMES = ["[/x]", "[red]evil[/red] :fire:", "a\x1b[31mred", "f.py:accept"]
SGR = re.compile(r"\x1b\[[0-9;]*m")
FILE_LIMIT = 256          # bytes: RLIMIT_FSIZE for the "full disk" runs (every record is larger)


def kdtree(*args, cwd: Path, file_limit: int | None = None) -> subprocess.CompletedProcess:
    """`python -m cli ARGS`; with `file_limit`, a write past that many bytes fails with EFBIG, as on
    a full disk (Python ignores SIGXFSZ, so the write raises)."""
    limit = None if file_limit is None else (lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                         (file_limit, file_limit)))
    return run_kdtree(*args, cwd=cwd, env=kdtree_env(OMP_NUM_THREADS="1"), preexec_fn=limit)


def on_a_terminal(*args, cwd: Path) -> subprocess.CompletedProcess:
    """`kdtree ARGS` with stderr on a pseudo-terminal: the error printer's coloured path."""
    main, child = pty.openpty()
    env = kdtree_env(OMP_NUM_THREADS="1", TERM="xterm")
    try:
        result = subprocess.run(kdtree_command(*args), cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=child, text=True, timeout=300)
        os.close(child)
        child = -1
        chunks = []
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:                  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(main)
        if child >= 0:
            os.close(child)
    stderr = SGR.sub("", b"".join(chunks).decode().replace("\r\n", "\n"))     # rich's own styling
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, stderr)


def one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "╭" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("kdtree: error: "), result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    return result.stderr


def renamed(src: Path, dst: Path, case: str) -> None:
    bundle = read_bundle(src)
    write_bundle(dst, dict(bundle.meta, case=case),
                 [(e.name, e.role, bundle.array(e.name)) for e in bundle.entries])


@pytest.fixture
def accept_golden(goldens):  # noqa: F811
    return sorted((goldens / "tree_accept").glob("*.kdtr"))[0]


# -- rows 3, 4: literal names and messages --------------------------------------------------------
def test_hostile_case_names_print_literally_among_good_ones(goldens, accept_golden, tmp_path):  # noqa: F811
    for i, name in enumerate(HOSTILE_NAMES):
        renamed(accept_golden, goldens / "tree_accept" / f"hostile{i}.kdtr", name)
    total = len(list(goldens.rglob("*.kdtr")))
    for quiet in ([], ["-q"]):
        result = kdtree("verify", goldens, "-b", "numpy", "--json", "rec.json", "--junit", "r.xml", *quiet,
                        cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "\x1b" not in result.stdout + result.stderr
        for name in ("[/x]", "[red]evil[/red] :fire:", "a\\x1b[31mred", "f.py:accept"):
            assert name in result.stdout, (name, result.stdout)
        assert "🔥" not in result.stdout and "🉑" not in result.stdout
        rows = json.loads((tmp_path / "rec.json").read_text())["rows"]
        assert len(rows) == total and {r["case"] for r in rows} >= set(HOSTILE_NAMES)
        cases = ElementTree.parse(tmp_path / "r.xml").getroot().findall("testcase")    # still well-formed XML
        assert len(cases) == total and "a\\x1b[31mred" in {c.get("name") for c in cases}


def test_an_undecodable_file_name_prints_escaped(accept_golden, tmp_path):
    """A failing bundle under a folder whose name is not UTF-8: its FAIL line names it with the
    byte escaped, where writing it raw to a UTF-8 stdout would raise."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xffname"))
    folder.mkdir()
    perturbed_copy(accept_golden, folder / "case.kdtr")
    for quiet in ([], ["-q"]):
        result = kdtree("verify", folder, "-b", "numpy", *quiet, cwd=tmp_path)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert "1 failed" in result.stdout and ("bad\\udcffname" in result.stdout or quiet), result.stdout


@pytest.mark.parametrize("path", ["a[/bold]b.kdtr", "f.py:accept.kdtr", "x\x1b[2Jy.kdtr", "bad\udcffutf8.kdtr"])
@pytest.mark.parametrize("run", [kdtree, on_a_terminal])
def test_error_messages_print_literally(tmp_path, path, run):
    line = one_line(run("verify", os.fsencode(path), "-b", "numpy", cwd=tmp_path),
                    path.replace("\x1b", "\\x1b").replace("\udcff", "\\udcff"))
    assert "\x1b[2J" not in line and "🉑" not in line


@pytest.mark.parametrize("run", [kdtree, on_a_terminal])
def test_markup_in_a_suite_is_one_literal_line(tmp_path, run):
    (tmp_path / "s.yaml").write_text('op: "[/x]"\ncases:\n  - {budget: 4}\n')
    one_line(run("gen-refs", "s.yaml", "-o", "out", cwd=tmp_path), "[/x]")
    assert not (tmp_path / "out").exists()


# -- row 21: usage errors, --debug anywhere, --junit -, the loosened mark ---------------------------
@pytest.mark.parametrize("args, word", [(["verify", "--bogus"], "--bogus"), (["verify", "--trials", "x"], "--trials"),
                                        (["bench", "--mode"], "--mode"), (["nosuch"], "nosuch")])
def test_usage_errors_are_one_line(tmp_path, args, word):
    one_line(kdtree(*args, cwd=tmp_path), word)


def test_debug_works_after_the_subcommand(tmp_path):
    result = kdtree("verify", "missing.kdtr", "-b", "numpy", "--debug", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr and "missing.kdtr" in result.stderr


def test_junit_dash_is_refused(goldens, tmp_path):  # noqa: F811
    one_line(kdtree("verify", goldens, "-b", "numpy", "--junit", "-", cwd=tmp_path), "--junit -")


def test_loosened_mark_in_quiet_lines_and_junit(goldens, tmp_path):  # noqa: F811
    result = kdtree("verify", goldens / "verify_attn", "-b", "numpy", "--atol", "1", "-q", "--junit", "r.xml",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("PASS")]
    assert lines and all(" loosened" in line for line in lines), result.stdout
    assert 'name="loosened"' in (tmp_path / "r.xml").read_text()
    plain = kdtree("verify", goldens / "verify_attn", "-b", "numpy", "-q", cwd=tmp_path)
    assert "loosened" not in plain.stdout


# -- row 6: a full disk ---------------------------------------------------------------------------
def _records(goldens, tmp_path):  # noqa: F811
    for shard in ("1/2", "2/2"):
        done = kdtree("verify", goldens, "-b", "numpy", "--shard", shard, "--json", f"r{shard[0]}.json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args", [
    ["verify", "{goldens}", "-b", "numpy", "--json", "out/rec.json"],
    ["verify", "{goldens}", "-b", "numpy", "--junit", "out/rec.xml"],
    ["inspect", "{bundle}", "--json", "out/rec.json"],
    ["report", "r1.json", "r2.json", "--merge", "out/rec.json"],
    ["gen-refs", "{specs}", "-o", "{goldens}", "--json", "out/rec.json"],
    ["bench", "a.yaml", "-b", "torch", "--quick", "-q", "--json", "out/rec.json"],
])
def test_a_full_disk_is_one_line_and_no_partial_file(goldens, accept_golden, tmp_path, args):  # noqa: F811
    _records(goldens, tmp_path)
    (tmp_path / "a.yaml").write_text("op: tree_accept\ncases:\n  - {batch: 1, budget: 4}\n")
    (tmp_path / "out").mkdir()
    filled = [a.format(goldens=goldens, bundle=accept_golden, specs=goldens.parent / "specs") for a in args]
    line = one_line(kdtree(*filled, cwd=tmp_path, file_limit=FILE_LIMIT), "out/rec.", "File too large")
    assert "passed" not in line
    assert list((tmp_path / "out").iterdir()) == []


def test_a_full_disk_under_gen_refs_names_the_bundle_once(tmp_path):
    """Issue 36: "…one.kdtr: cannot write: …one.kdtr: cannot write: File too large"."""
    (tmp_path / "a.yaml").write_text("op: tree_accept\ncases:\n  - {name: one, batch: 1, budget: 4}\n")
    line = one_line(kdtree("gen-refs", "a.yaml", "-o", "out", "-q", cwd=tmp_path, file_limit=FILE_LIMIT),
                    "out/tree_accept/one.kdtr: cannot write: File too large")
    assert line.count("one.kdtr") == 1 and line.count("cannot write") == 1, line
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


# -- row 16: an output that is an input -----------------------------------------------------------
def test_an_output_that_is_an_input_is_refused(goldens, accept_golden, tmp_path):  # noqa: F811
    _records(goldens, tmp_path)
    (tmp_path / "s.yaml").write_text("op: tree_accept\ncases:\n  - {batch: 1, budget: 4}\n")
    before = {p: p.read_bytes() for p in [accept_golden, tmp_path / "r1.json", tmp_path / "s.yaml"]}
    link = tmp_path / "link.kdtr"
    link.symlink_to(accept_golden)
    for args, word in [(["verify", accept_golden, "-b", "numpy", "--json", accept_golden], "--json"),
                       (["verify", goldens, "-b", "numpy", "--junit", link], "--junit"),
                       (["inspect", accept_golden, "--json", link], "--json"),
                       (["report", "r1.json", "r2.json", "--merge", "r1.json"], "--merge"),
                       (["report", "r1.json", "--csv", "r1.json"], "--csv"),
                       (["bench", "s.yaml", "--csv", "s.yaml"], "--csv"),
                       (["bench", "s.yaml", "--json", "s.yaml"], "--json")]:
        one_line(kdtree(*args, cwd=tmp_path), word, "is one of the inputs")
    assert {p: p.read_bytes() for p in before} == before


# -- row 2: a case over the memory bound ------------------------------------------------------------
def test_verify_and_bench_refuse_a_case_over_the_memory_limit(tmp_path):
    """A verify_attn case whose torch run takes ~430 MiB (its scores: 4 x B x Q x H x (P + Q) x 4
    bytes) against a 64 MiB bound: refused before it runs, naming the case and both figures."""
    (tmp_path / "big.yaml").write_text("op: verify_attn\nseed: 1\ncases:\n"
                                       "  - {variant: fp32, batch: 2, heads: 16, prefix: 8192, budget: 63}\n")
    assert kdtree("gen-refs", "big.yaml", "-o", "g", "-q", cwd=tmp_path).returncode == 0
    for args, what in [(["verify", "g", "-b", "torch"], "to verify on torch"),
                       (["bench", "big.yaml", "-b", "torch"], "to bench on torch")]:
        line = one_line(kdtree(*args, "--mem-limit", "64M", "--json", "r.json", cwd=tmp_path),
                        "fp32_b2_h16_p8192_n63", what, "over the memory limit of 64.00 MiB")
        assert re.search(r"needs about [1-9][0-9]{2}\.[0-9]{2} MiB", line) and not (tmp_path / "r.json").exists()
    ran = kdtree("verify", "g", "-b", "numpy", "--mem-limit", "1G", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr


# -- row 20: odd option values ----------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "-1", "0"])
def test_bench_time_budget_out_of_range_is_refused(tmp_path, value):
    one_line(kdtree("bench", "--time-budget", value, "-b", "torch", cwd=tmp_path), "--time-budget")


def test_e2e_quality_nan_and_a_tiny_mem_limit_are_refused(tmp_path):
    one_line(kdtree("e2e", "--quality", "nan", "-b", "numpy", cwd=tmp_path), "--quality")
    one_line(kdtree("gen-refs", "--mem-limit", "0.0001", "-o", "out", cwd=tmp_path), "--mem-limit", "0 bytes")


def test_a_small_mem_limit_is_said_in_units_that_show_it(goldens, tmp_path):  # noqa: F811
    line = one_line(kdtree("gen-refs", goldens.parent / "specs", "-o", "new", "--mem-limit", "100", cwd=tmp_path))
    assert "100 bytes" in line and "KiB" in line and "0.00 GiB" not in line


def test_repeated_bundles_and_implementations_run_once_and_say_so(goldens, tmp_path):  # noqa: F811
    once = kdtree("verify", goldens, "-b", "numpy", "-q", cwd=tmp_path)
    twice = kdtree("verify", goldens, goldens, "--impl", "numpy", "--impl", "numpy", "-q", cwd=tmp_path)
    assert once.returncode == twice.returncode == 0, twice.stderr
    assert once.stdout.splitlines()[-1] == twice.stdout.splitlines()[-1]       # the same "N passed"
    assert "named more than once" in twice.stderr and "--impl given more than once" in twice.stderr


def test_impl_with_a_backend_is_refused(goldens, tmp_path):  # noqa: F811
    one_line(kdtree("verify", goldens, "--impl", "numpy", "--backend", "torch", cwd=tmp_path), "--backend torch")


def test_devices_without_a_gpu_say_so(goldens, tmp_path):  # noqa: F811
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible: --devices runs on it")
    result = kdtree("verify", goldens / "tree_accept", "-b", "numpy", "-q", "--devices", "0,1", cwd=tmp_path)
    assert result.returncode == 0 and "no GPU is visible here; 2 worker processes run on the CPU" in result.stderr


@pytest.mark.parametrize("command", [["verify", "{goldens}"], ["bench", "a.yaml", "--quick", "-q"]])
def test_the_cuda_backend_on_devices_without_a_gpu_is_one_line(goldens, tmp_path, command):  # noqa: F811
    """Issue 36: `verify --backend cuda --devices 0` said "no GPU" once per bundle (54 lines), after
    a note that the workers run on the CPU, which they do not."""
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible: the run goes ahead on it")
    (tmp_path / "a.yaml").write_text("op: tree_accept\ncases:\n  - {batch: 1, budget: 4}\n")
    args = [a.format(goldens=goldens) for a in command]
    one_line(kdtree(*args, "--backend", "cuda", "--devices", "0", cwd=tmp_path), "no CUDA GPU")


def test_an_unknown_baseline_is_said(tmp_path):
    (tmp_path / "a.yaml").write_text("op: tree_accept\ncases:\n  - {batch: 1, budget: 4}\n")
    result = kdtree("bench", "a.yaml", "-b", "torch", "--quick", "--baseline", "nope", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--baseline nope: no case here has a baseline of that name" in result.stderr


def test_linked_subfolders_are_followed_once(goldens, tmp_path):  # noqa: F811
    elsewhere = tmp_path / "elsewhere"
    (goldens / "tree_accept").rename(elsewhere)
    (goldens / "tree_accept").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "loop").symlink_to(goldens, target_is_directory=True)         # a cycle back to the top
    result = kdtree("verify", goldens, "-b", "numpy", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cases = [r["case"] for r in json.loads((tmp_path / "r.json").read_text())["rows"]]
    assert len(cases) == len(set(cases)) == 5 and any(c.startswith("b4_n12") for c in cases), cases


def test_report_plot_without_matplotlib_writes_nothing(tmp_path):
    record = tmp_path / "b.json"
    record.write_text("{}")
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'kdtree'; "
            "from cli.main import main; main()")          # kdtree started by hand: matplotlib hidden first
    result = subprocess.run([sys.executable, "-c", code, "report", str(record), "--csv", "t.csv", "--plot", "t.png"],
                            cwd=tmp_path, env=kdtree_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                            timeout=300)
    one_line(result, "matplotlib")
    assert not (tmp_path / "t.csv").exists() and not (tmp_path / "t.png").exists()
