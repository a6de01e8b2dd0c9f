"""The README's examples run, so they cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kdtr.config import REPO_ROOT
from kdtr.spec import load_suite

from .test_cli import goldens  # noqa: F401  (fixture)

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.M | re.S)


def test_the_suite_example_loads(tmp_path):
    (suite_text,) = blocks("yaml")
    path = tmp_path / "example.yaml"
    path.write_text(suite_text)
    names = [case.name for case in load_suite(path).cases]
    assert "fp32_b2_h16_p2048_n16" in README and "fp32_b2_h16_p2048_n16" in names and "mine" in names
    assert len(names) == 2 + 3 * 2                       # two cases, then a 3 x 2 sweep


def test_the_first_two_commands_are_the_quickstart():
    first = blocks("bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["./quickstart", "./quickstart test"]
    assert os.access(REPO_ROOT / "quickstart", os.X_OK)
    assert "./quickstart test" in (REPO_ROOT / ".ci" / "run").read_text()


def test_the_shell_loop_runs(goldens):  # noqa: F811
    loop = next(line for block in blocks("bash") for line in block.splitlines() if line.startswith("for f in"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", NO_COLOR="1")
    result = subprocess.run(["bash", "-c", loop], cwd=goldens.parent, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("PASS verify_attn/") == 2
