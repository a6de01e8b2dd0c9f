"""The CLI's contract for bad input, command by command: exit 2, exactly one line on stderr, no
traceback, nothing on stdout and no new file in the folder. Real subprocesses for a representative
subset (exit codes and streams are the point there), CliRunner for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.helpers import run_kdtree


BAD_SUITE = "op: tree_build\ncases:\n  - {budget: 4, bogus: 1}\n"


@pytest.fixture
def folder(goldens, tmp_path):  # noqa: F811
    """A work folder with goldens, a bad suite, a corrupt bundle and a plain file."""
    (tmp_path / "bad.yaml").write_text(BAD_SUITE)
    data = bytearray(sorted(goldens.rglob("*.kdtr"))[0].read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "corrupt.kdtr").write_bytes(bytes(data))
    (tmp_path / "plain.txt").write_text("x")
    return tmp_path


# (args, a word the one line must hold); paths are relative to the folder fixture
CASES = [
    (["inspect", "missing.kdtr"], "missing.kdtr"),
    (["inspect", "goldens"], "goldens"),
    (["inspect", "corrupt.kdtr"], "corrupt.kdtr"),
    (["verify", "missing.kdtr", "-b", "numpy"], "missing.kdtr"),
    (["verify", "corrupt.kdtr", "-b", "numpy"], "corrupt.kdtr"),
    (["verify", "goldens", "-b", "tpu"], "tpu"),
    (["verify", "goldens", "-b", "numpy", "--atol", "-1"], "--atol"),
    (["verify", "goldens", "-b", "numpy", "--shard", "3/2"], "3/2"),
    (["verify", "goldens", "-b", "numpy", "--json", "."], "--json"),
    (["verify", "goldens", "-b", "numpy", "--junit", "plain.txt/r.xml"], "--junit"),
    (["verify", "goldens", "-b", "numpy", "--devices", "x"], "--devices"),
    (["gen-refs", "missing.yaml", "-o", "new"], "missing.yaml"),
    (["gen-refs", "bad.yaml", "-o", "new"], "bad.yaml:3"),
    (["gen-refs", "bad.yaml", "-o", "plain.txt"], "plain.txt"),
    (["gen-refs", "bad.yaml", "-o", "new", "--json", "."], "--json"),
    (["gen-refs", "bad.yaml", "-o", "new", "--shard", "0/2"], "0/2"),
    (["build", "--arch", "sm_1"], "sm_1"),
    (["build", "--json", "."], "--json"),
    (["doctor", "--json", "plain.txt/d.json"], "--json"),
    (["e2e", "--variant", "fp16", "-b", "numpy"], "fp16"),
    (["e2e", "--budget", "99999", "-b", "numpy"], "99999"),
    (["e2e", "-b", "numpy", "--json", "."], "--json"),
    (["report", "missing.json"], "missing.json"),
    # issue 30: typer's usage errors, markup in names and messages, outputs that are inputs, odd values
    (["verify", "goldens", "--bogus"], "--bogus"),
    (["verify", "goldens", "--trials", "x"], "--trials"),
    (["verify", "a[/bold]b.kdtr", "-b", "numpy"], "a[/bold]b.kdtr"),
    (["verify", "corrupt.kdtr", "-b", "numpy", "--json", "corrupt.kdtr"], "is one of the inputs"),
    (["verify", "goldens", "-b", "numpy", "--junit", "-"], "--junit -"),
    (["verify", "goldens", "--impl", "numpy", "-b", "torch"], "--backend torch"),
    (["inspect", "corrupt.kdtr", "--json", "corrupt.kdtr"], "is one of the inputs"),
    (["gen-refs", "specs", "-o", "new", "--mem-limit", "0.0001"], "0 bytes"),
    (["e2e", "-b", "numpy", "--quality", "nan"], "--quality"),
    (["bench", "-b", "torch", "--time-budget", "1e308"], "--time-budget"),
    (["bench", "-b", "torch", "--time-budget", "nan"], "--time-budget"),
    (["bench", "bad.yaml", "--csv", "bad.yaml"], "is one of the inputs"),
    (["report", "plain.txt", "--merge", "plain.txt"], "is one of the inputs"),


    # issue 30 row 16: a record onto one of the inputs
    (["gen-refs", "specs/tree_accept.yaml", "-o", "new", "--json", "specs/tree_accept.yaml"], "is one of the inputs"),
    (["inspect", "goldens/tree_accept/b4_n12.kdtr", "--json", "goldens/tree_accept/b4_n12.kdtr"], "is one of the inputs"),
]
# one or more per command through a real process; typer's usage errors (23, 24) only reach the
# one-line printer through cli.main, which CliRunner does not run
SUBPROCESS = {0, 2, 4, 5, 8, 12, 16, 19, 23, 24, 25, 27, 33}


def snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


def assert_one_clean_line(code: int, stdout: str, stderr: str, word: str) -> None:
    assert code == 2, (code, stdout, stderr)
    assert stdout == "" and "Traceback" not in stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert stderr.startswith("kdtree: error: ") and word in stderr, stderr


@pytest.mark.parametrize("index", sorted(SUBPROCESS))
def test_bad_input_through_a_real_process(folder, index):
    args, word = CASES[index]
    before = snapshot(folder)
    result = run_kdtree(*args, cwd=folder, timeout=120)
    assert_one_clean_line(result.returncode, result.stdout, result.stderr, word)
    assert snapshot(folder) == before


@pytest.mark.parametrize("index", sorted(set(range(len(CASES))) - SUBPROCESS))
def test_bad_input_through_cli_runner(folder, index, monkeypatch):
    args, word = CASES[index]
    monkeypatch.chdir(folder)
    monkeypatch.setenv("NO_COLOR", "1")
    before = snapshot(folder)
    result = CliRunner().invoke(app, args)
    assert_one_clean_line(result.exit_code, result.stdout, result.stderr, word)
    assert snapshot(folder) == before
