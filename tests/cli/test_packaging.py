"""The built wheel, installed (not editable) into a fresh venv, works from an empty folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from kdtr.config import REPO_ROOT
from tests.helpers import run_kdtree

SHIPPED = ("pyproject.toml", "README.md", "kdtr", "cli", "kernels", "specs", "docs")


CLEAN = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KDTREE_KERNELS_DIR")}


def run(*args, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    """No PYTHONPATH: the checkout must not be importable, nor its metadata visible to pip."""
    return subprocess.run([str(a) for a in args], cwd=cwd, env=CLEAN if env is None else env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv holding only the kdtree wheel; the heavy dependencies are borrowed from this
    interpreter's site-packages by a path line (installing torch would take minutes)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"                 # build from a copy: the checkout gets no build/ or egg-info
    source.mkdir()
    for name in SHIPPED:
        copy = shutil.copytree if (REPO_ROOT / name).is_dir() else shutil.copy2
        copy(REPO_ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                  if (REPO_ROOT / name).is_dir() else {}))
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                "-w", base / "dist", source, cwd=base)
    assert built.returncode == 0, built.stderr
    (wheel,) = (base / "dist").glob("kdtree-*.whl")
    venv = base / "venv"
    made = run(sys.executable, "-m", "venv", venv, cwd=base)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=base).stdout.strip())
    # the venv's own pip, before the path line below: any pip that sees this interpreter's
    # site-packages takes the editable kdtree installed there for this one ("already installed")
    pip = run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
              wheel, cwd=base)
    assert pip.returncode == 0, pip.stderr
    deps = Path(sysconfig.get_paths()["purelib"])
    # a path line, not this site dir's own .pth files: an editable kdtree there stays switched off
    (site / "_kdtree_test_deps.pth").write_text(f"{deps}\n")
    # cuda-pathfinder looks for libnvrtc and the CUDA headers in real site-packages only
    (site / "nvidia").symlink_to(deps / "nvidia", target_is_directory=True)
    env = dict(CLEAN)
    env.update(NO_COLOR="1", KDTREE_CACHE_DIR=str(base / "cache"), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
    empty = base / "work"
    empty.mkdir()
    return venv, site, wheel, env, empty


@pytest.mark.slow
def test_the_installed_wheel_runs_from_an_empty_folder(installed):
    """Proves: the wheel carries the kernels, the default suites and every docs/ page, the console
    script points at the installed `kdtree_cli`, and doctor, build, gen-refs and verify (torch) run
    from a folder with no checkout in sight, reading the kernels and suites from the package data;
    the wheel holds no top-level `cli` package. Does not prove: that pip resolves the dependencies (they are
    borrowed from the test's own environment), the cuda backend, or an install on another OS."""
    venv, site, wheel, env, empty = installed
    names = run(venv / "bin" / "python", "-c", "import zipfile, sys; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
                wheel, cwd=empty).stdout.split()
    assert {n.split("/")[0] for n in names} == {"kdtr", "kdtree_cli", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "kdtr/_kernels/verify_attn_fp32_bf16x3.cu" in names and "kdtr/_specs/tree_build.yaml" in names
    assert "kdtr/_specs/bench/verify_attn.yaml" in names
    pages = {f"kdtr/_docs/{p.relative_to(REPO_ROOT / 'docs').as_posix()}" for p in (REPO_ROOT / "docs").rglob("*.md")}
    assert "kdtr/_docs/ops/verify_attn.md" in pages and pages <= set(names)     # the contracts the code cites

    where = run(venv / "bin" / "python", "-c", "import kdtr, kdtree_cli; print(kdtr.__file__, kdtree_cli.__file__)",
                cwd=empty, env=env)
    assert where.stdout.split() == [str(site / "kdtr" / "__init__.py"), str(site / "kdtree_cli" / "__init__.py")]

    doctor = run("kdtree", "doctor", "--json", "-", cwd=empty, env=env)
    assert doctor.returncode == 0, doctor.stderr
    facts = json.loads(doctor.stdout)
    assert facts["kernels_from"] == "the installed package" and facts["specs_from"] == "the installed package"
    assert Path(facts["kernels_dir"]) == site / "kdtr" / "_kernels"

    build = run("kdtree", "build", "--arch", "sm_90", cwd=empty, env=env)
    assert build.returncode == 0, build.stderr
    assert "verify_attn_fp32_bf16x3.cu" in build.stdout and "tree_accept_walk.cu" in build.stdout

    gen = run("kdtree", "gen-refs", "-q", cwd=empty, env=env)
    assert gen.returncode == 0, gen.stderr
    count = len(list((empty / "goldens").rglob("*.kdtr")))
    assert count > 10 and f"{count} written" in gen.stdout
    verify = run("kdtree", "verify", "--backend", "torch", "-q", cwd=empty, env=env)
    assert verify.returncode == 0, verify.stderr
    assert f"{count} passed, 0 failed" in verify.stdout


@pytest.mark.slow
def test_the_installed_wheel_reports_missing_kernels_in_one_line(installed, tmp_path):
    """No kernels where KDTREE_KERNELS_DIR points, or none at all: exit 2 and one line naming the folder."""
    venv, site, wheel, env, empty = installed
    missing = run("kdtree", "build", cwd=empty, env=dict(env, KDTREE_KERNELS_DIR="/nonexistent"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "/nonexistent" in missing.stderr and "KDTREE_KERNELS_DIR" in missing.stderr
    hollow = run("kdtree", "build", cwd=empty, env=dict(env, KDTREE_KERNELS_DIR=str(tmp_path)))
    assert hollow.returncode == 2 and hollow.stderr.count("\n") == 1, hollow.stderr
    assert str(tmp_path) in hollow.stderr and "no kernel sources" in hollow.stderr


def _requirements(lines) -> dict:
    from packaging.requirements import Requirement

    reqs = [Requirement(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {req.name.lower(): req.specifier for req in reqs}


def test_the_bounds_kdtree_relies_on_are_in_pyproject_and_constraints_fit_them():
    """A plain `pip install .` (no -c constraints.txt) must keep typer below 0.29 (`<bool>` in
    --help, pydantic at start-up) and NVRTC off 13.5 (spills at sm_90); each exact pin of
    constraints.txt must lie inside pyproject's bounds, or CI tests what no install gets."""
    tomllib = pytest.importorskip("tomllib")          # Python 3.11+; the check is the same on any
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = _requirements(project["dependencies"])
    assert "0.29.2" not in declared["typer"] and "0.28.0" in declared["typer"]
    assert "13.5.0" not in declared["nvidia-cuda-nvrtc"] and "13.0.88" in declared["nvidia-cuda-nvrtc"]
    pinned = _requirements((REPO_ROOT / "constraints.txt").read_text().splitlines())
    for name, spec in pinned.items():
        assert name in declared, f"constraints.txt bounds {name}, which pyproject does not depend on"
        for exact in (s.version for s in spec if s.operator == "=="):
            assert exact in declared[name], f"constraints.txt pins {name}=={exact}, outside pyproject's {declared[name]}"
        for upper in (s.version for s in spec if s.operator == "<"):
            assert upper not in declared[name], f"constraints.txt bounds {name}<{upper}; pyproject lets it in"


@pytest.mark.slow
def test_the_installed_wheel_names_its_own_code_and_writes_the_checkouts_bytes(installed, tmp_path):
    """Issue 30 rows 10 and 12, from the wheel installed in a venv inside another project's git
    repository: no record names that project's commit; sources_sha256 is the checkout's for the
    same code and changes when an installed kernel or CLI file does; gen-refs writes the bytes the
    checkout writes (provenance.spec held the absolute site-packages path)."""
    venv, site, wheel, env, empty = installed
    foreign = venv.parent
    for args in (("init", "-q"), ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                  "--allow-empty", "-m", "another project")):
        assert run("git", *args, cwd=foreign).returncode == 0

    def doctor() -> dict:
        done = run("kdtree", "doctor", "--json", "-", cwd=empty, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    record = run("kdtree", "gen-refs", "-k", "root_only_q1", "-o", tmp_path / "wheel", "-q", "--json", "-",
                 cwd=empty, env=env)
    assert record.returncode == 0, record.stderr
    meta = json.loads(record.stdout)["meta"]
    assert (meta["commit"], meta["dirty"]) == (None, None)
    checkout = run_kdtree("gen-refs", "-k", "root_only_q1", "-o", tmp_path / "checkout", "-q", cwd=REPO_ROOT,
                          env=dict(CLEAN, PYTHONPATH=str(REPO_ROOT)))
    assert checkout.returncode == 0, checkout.stderr
    (ours,), (theirs,) = (tmp_path / "wheel").rglob("*.kdtr"), (tmp_path / "checkout").rglob("*.kdtr")
    assert ours.read_bytes() == theirs.read_bytes()

    from kdtr.records.report import source_digest

    assert meta["sources_sha256"] == doctor()["sources_sha256"] == source_digest.__wrapped__(REPO_ROOT)
    digests = {meta["sources_sha256"]}
    for edited in (site / "kdtr" / "_kernels" / "tree_accept_walk.cu", site / "kdtree_cli" / "main.py"):
        original = edited.read_bytes()
        try:
            edited.write_bytes(original + b"\n// edited\n" if edited.suffix == ".cu" else original + b"\n# edited\n")
            digests.add(doctor()["sources_sha256"])
        finally:
            edited.write_bytes(original)
    assert len(digests) == 3, "each installed edit must change sources_sha256"
