"""What many test files share: the CLI in-process and in a real process, small suites, goldens, a perturbed bundle."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from cli.main import app
from kdtr.config import REPO_ROOT
from kdtr.bundle.format import read_bundle, write_bundle
from kdtr.impl import resolved

runner = CliRunner()
SMALL_SUITE = """\
op: {op}
seed: 3
cases:
{cases}
"""
SMALL_CASES = {
    "tree_build": "  - {batch: 3, depth: 4, vocab: 16, budget: 12}\n  - {batch: 2, depth: 3, vocab: 8, budget: 6, quantize: 0.5}",
    "tree_accept": "  - {batch: 4, budget: 12, mode: mixed}",
    "verify_attn": "  - {variant: fp32, batch: 2, heads: 4, prefix: 20, budget: 6}\n"
                   "  - {variant: bf16_paged, batch: 2, heads: 4, prefix: 20, budget: 6, prefix_mode: mixed}",
}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def perturbed_copy(src: Path, dst: Path) -> None:
    """The same bundle with one expected element changed by the smallest visible amount."""
    bundle = read_bundle(src)
    tensors = []
    changed = False
    for entry in bundle.entries:
        array = np.array(bundle.array(entry.name))
        if entry.role == "output" and not changed and array.size:
            flat = array.reshape(-1)
            flat[flat.size // 2] = flat[flat.size // 2] + (1 if array.dtype.kind in "iu" else 0.01)
            changed = True
        tensors.append((entry.name, entry.role, array))
    write_bundle(dst, bundle.meta, tensors)


def make_goldens(folder: Path) -> Path:
    """Goldens of the small suites (two tree_build, one tree_accept, two verify_attn cases) under folder.
    In this process (--jobs 1): five small cases take milliseconds, while the default's worker
    processes take most of a second to start, for each of the 150-odd tests that need goldens (the
    workers' path is tested by tests/spec/test_refs.py, and gives the same bytes)."""
    specs = folder / "specs"
    specs.mkdir()
    for op, cases in SMALL_CASES.items():
        (specs / f"{op}.yaml").write_text(SMALL_SUITE.format(op=op, cases=cases))
    result = invoke("gen-refs", specs, "-o", folder / "goldens", "--jobs", "1")
    assert result.exit_code == 0, result.output
    return folder / "goldens"


def install_plugin(tmp_path, monkeypatch, value, name="myimpl", body=""):
    """An installed distribution with one kdtree.implementations entry point (a real .dist-info)."""
    (tmp_path / "kdtree_plugin_mod.py").write_text(textwrap.dedent(body))
    info = tmp_path / "kdtree_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kdtree-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kdtree.implementations]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("kdtree_plugin_mod", None)
    resolved.cache_clear()          # specs resolve once per process: this one is new


def kdtree_command(*args) -> list[str | bytes]:
    """The argv that starts this checkout's kdtree in a child process: `python -m cli ARGS`
    (bytes stay bytes: a file name that is not UTF-8 reaches the child as it is)."""
    return [sys.executable, "-m", "cli", *(a if isinstance(a, bytes) else str(a) for a in args)]


def kdtree_env(*unset: str, **extra: str) -> dict[str, str]:
    """This process's environment for a kdtree child: no colour and this checkout importable,
    without the variables named in `unset`, with those in `extra` set."""
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env.update(NO_COLOR="1", PYTHONPATH=str(REPO_ROOT), **extra)
    return env


def run_kdtree(*args, cwd, env: dict[str, str] | None = None, timeout: float = 300,
               preexec_fn=None) -> subprocess.CompletedProcess:
    """`python -m cli ARGS` in a real process (its exit code and streams are the point), under
    kdtree_env() unless `env` is given; `preexec_fn` runs in the child before it starts."""
    return subprocess.run(kdtree_command(*args), cwd=cwd, env=kdtree_env() if env is None else env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)
