"""Golden provenance: an op's code hash changes when its numbers can, and only then."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from kdtr.bundle import refs

FILES = {
    "__init__.py": "",
    "base.py": "class Op:\n    name = ''\n",
    "_common.py": """\
        def helper_a(x):
            return x + 1


        def helper_b(x):
            return x * 2
        """,
    "a.py": '''\
        """Op A."""
        from ._common import helper_a
        from .base import Op


        class A(Op):
            def reference(self, x):
                """A's reference."""
                return helper_a(x)  # plus one
        ''',
    "b.py": """\
        from ._common import helper_b
        from .base import Op


        class B(Op):
            def reference(self, x):
                return helper_b(x)
        """,
    "c/__init__.py": "from ._impl import C\n",
    "c/_impl.py": """\
        from .._common import helper_a
        from ..a import A


        class C(A):
            def generate(self):
                return helper_a(3)
        """,
}


@pytest.fixture()
def ops(tmp_path, monkeypatch):
    """A package `fakeops` with ops a, b (modules) and c (a package built on a)."""
    root = tmp_path / "fakeops"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "fakeops" or m.startswith("fakeops.")]:
        monkeypatch.delitem(sys.modules, name)     # another test's copy, found by find_spec
    yield root
    for name in [m for m in sys.modules if m == "fakeops" or m.startswith("fakeops.")]:
        del sys.modules[name]


def hashes() -> dict[str, str]:
    return {op: refs.code_sha256(f"fakeops.{op}", "fakeops", ("fakeops.base",)) for op in "abc"}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_comments_docstrings_and_blank_lines_do_not_change_a_hash(ops):
    before = hashes()
    edit(ops / "a.py", "# plus one", "# adds one, see docs/ops/")
    edit(ops / "a.py", '"""A\'s reference."""', '"""A\'s reference, exact."""\n\n')
    edit(ops / "a.py", '"""Op A."""', "# header comment\n")
    edit(ops / "c" / "_impl.py", "class C(A):", "# C is A with a generator\nclass C(A):")
    assert hashes() == before


def test_a_code_edit_changes_that_op_and_the_ops_built_on_it_only(ops):
    before = hashes()
    edit(ops / "a.py", "return helper_a(x)", "return helper_a(x) - 1")
    after = hashes()
    assert after["a"] != before["a"]
    assert after["c"] != before["c"], "c imports a: its numbers depend on a's code"
    assert after["b"] == before["b"]


def test_a_helper_counts_only_for_the_ops_that_import_it(ops):
    before = hashes()
    edit(ops / "_common.py", "return x * 2", "return x * 3")
    after = hashes()
    assert after["b"] != before["b"]
    assert (after["a"], after["c"]) == (before["a"], before["c"])


def test_a_package_ops_own_files_count_and_the_contract_does_not(ops):
    before = hashes()
    edit(ops / "base.py", "name = ''", "name = 'renamed'\n    variants = ()")
    assert hashes() == before
    edit(ops / "c" / "_impl.py", "helper_a(3)", "helper_a(4)")
    after = hashes()
    assert after["c"] != before["c"] and after["a"] == before["a"]


def test_the_real_ops_hash_their_own_code():
    values = {op: refs.reference_sha256(op) for op in ("tree_build", "tree_accept", "verify_attn")}
    assert len(set(values.values())) == 3
    assert all(len(v) == 64 for v in values.values())


def _git(*args, cwd):
    import subprocess

    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True)


def test_a_record_never_names_the_commit_of_a_foreign_repository(tmp_path):
    """Issue 30 row 10: kdtree installed in a venv inside another project's repository recorded
    that project's commit as its own."""
    from kdtr.config import REPO_ROOT
    from kdtr.records.report import git_state

    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "kdtr").mkdir(parents=True)
    _git("init", "-q", cwd=tmp_path)
    _git("commit", "-q", "--allow-empty", "-m", "another project", cwd=tmp_path)
    assert git_state.__wrapped__(site) == {"commit": None, "dirty": None}
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "kdtree"\n')
    assert git_state.__wrapped__(tmp_path / "venv") == {"commit": None, "dirty": None}, "not the top"
    assert git_state.__wrapped__(tmp_path)["commit"] == _git("rev-parse", "HEAD", cwd=tmp_path).stdout.strip()
    if (REPO_ROOT / ".git").exists():
        assert git_state.__wrapped__(REPO_ROOT)["commit"] is not None, "kdtree's own checkout"


def test_sources_sha256_covers_the_kernels_library_and_cli_where_they_are():
    """The digest reads the folders kdtree runs from (a wheel's kdtr/_kernels and kdtree_cli
    too, not only a checkout's kernels/ and cli/), under the same names in both."""
    from kdtr.config import config
    from kdtr.records.report import code_folders

    folders = code_folders()
    assert folders["kernels"] == config().kernels_dir and any(folders["kernels"].glob("*.cu"))
    assert (folders["cli"] / "main.py").is_file() and (folders["kdtr"] / "records" / "report.py").is_file()
