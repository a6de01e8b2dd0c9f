"""The README's and docs/commands.md's examples run, so they cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kdtr.config import REPO_ROOT
from kdtr.bundle.spec import load_suite


README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = (REPO_ROOT / "docs" / "commands.md").read_text(encoding="utf-8")   # the suite example, the loop


def blocks(language: str, page: str = README) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", page, flags=re.M | re.S)


def cli_env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", NO_COLOR="1")


def test_the_suite_example_loads(tmp_path):
    (suite_text,) = blocks("yaml", COMMANDS)
    path = tmp_path / "example.yaml"
    path.write_text(suite_text)
    names = [case.name for case in load_suite(path).cases]
    assert "fp32_b2_h16_p2048_n16" in COMMANDS and "fp32_b2_h16_p2048_n16" in names and "mine" in names
    assert len(names) == 2 + 3 * 2                       # two cases, then a 3 x 2 sweep


def test_the_suite_example_passes_its_own_verification(tmp_path):
    """Issue 30 row 21: the example's suite-wide fp32 tolerance also bound its bf16 case, so its own
    goldens failed `verify`. Its bundles, verified with the torch backend, must all pass."""
    (suite_text,) = blocks("yaml", COMMANDS)
    (tmp_path / "example.yaml").write_text(suite_text)
    gen = subprocess.run(["kdtree", "gen-refs", "example.yaml", "-o", "g", "-q", "--jobs", "1"], cwd=tmp_path,
                         env=cli_env(), capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr
    verify = subprocess.run(["kdtree", "verify", "g", "--backend", "torch", "-q"], cwd=tmp_path, env=cli_env(),
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "8 passed, 0 failed" in verify.stdout and "PASS verify_attn/bf16_paged mine" in verify.stdout


def test_the_first_two_commands_are_the_quickstart():
    first = blocks("bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["./quickstart", "./quickstart test"]
    assert os.access(REPO_ROOT / "quickstart", os.X_OK)
    assert "./quickstart test" in (REPO_ROOT / ".ci" / "run").read_text()


def test_the_shell_loop_runs(goldens):  # noqa: F811
    loop = next(line for block in blocks("bash", COMMANDS) for line in block.splitlines() if line.startswith("for f in"))
    result = subprocess.run(["bash", "-c", loop], cwd=goldens.parent, env=cli_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("PASS verify_attn/") == 2
