"""kdtr's layout as its docstrings state it: every package's `__init__` says what it may import (the
sentence "It may import ... and nothing else of kdtr"), and every import of every module, those inside
functions and under TYPE_CHECKING included, keeps to that; no two modules import each other, however
far round; the root holds the modules kdtr/__init__.py names, which import only each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

KDTR = Path(__file__).resolve().parents[1] / "kdtr"
ENTRY = "kdtr.pytest_plugin"          # pytest's entry point: above every package, imported by none
RULE = re.compile(r"It\s+may\s+import\s+(.*?)\band\s+nothing\s+else\s+of\s+kdtr", re.S)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    out = {}
    for path in sorted(KDTR.rglob("*.py")):
        parts = path.relative_to(KDTR.parent).with_suffix("").parts
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


MODULES = _modules()


def imports_of(module: str) -> set[str]:
    """The kdtr modules `module` imports, wherever the import statement stands."""
    path, package = MODULES[module]
    here = module if package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


def unit(module: str) -> str:
    """The package a module belongs to (kdtr.ops for kdtr.ops.verify_attn.cuda), or the root module itself."""
    return ".".join(module.split(".")[:2])


PACKAGES = sorted({unit(m) for m, (_, package) in MODULES.items() if package and m != "kdtr"})
ROOT = sorted(m for m in MODULES if m.count(".") == 1 and m not in PACKAGES)


def rule(package: str) -> set[str]:
    """What a package's docstring lets it import: the kdtr packages it names, and the root modules."""
    doc = ast.get_docstring(ast.parse(MODULES[package][0].read_text(encoding="utf-8"))) or ""
    stated = RULE.search(doc)
    assert stated, f"{package}/__init__.py's docstring does not say what it may import"
    text = " ".join(stated.group(1).split())
    named = set(re.findall(r"`(kdtr\.\w+)`", text))
    assert "the root modules" in text and named <= set(PACKAGES), (package, named - set(PACKAGES))
    return named | set(ROOT) - {ENTRY}


def test_the_root_holds_the_modules_its_docstring_names_and_they_import_only_each_other():
    doc = ast.get_docstring(ast.parse((KDTR / "__init__.py").read_text(encoding="utf-8")))
    named = {f"kdtr.{name}" for name in re.findall(r"`(\w+)`", doc)}
    assert set(ROOT) <= named, f"root modules the docstring does not name: {sorted(set(ROOT) - named)}"
    assert len(ROOT) <= 6
    for module in ROOT:
        if module != ENTRY:
            outside = {unit(m) for m in imports_of(module)} - set(ROOT) - {"kdtr"}
            assert not outside, f"{module} imports {sorted(outside)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_what_its_docstring_allows(package):
    allowed = rule(package) | {package, "kdtr"}
    wrong = sorted(f"{m} -> {target}" for m in MODULES if unit(m) == package
                   for target in imports_of(m) if unit(target) not in allowed)
    assert not wrong, f"{package} may import only {sorted(allowed - {package, 'kdtr'})}:\n" + "\n".join(wrong)


def test_nothing_imports_the_pytest_entry_point():
    assert not [m for m in MODULES if ENTRY in imports_of(m)]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as the nodes round it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None
    return next((c for node in sorted(graph) if node not in state and (c := visit(node))), None)


def test_no_module_imports_itself_round_a_circle():
    assert _cycle({m: imports_of(m) for m in MODULES}) is None


def test_the_packages_rules_make_a_stack_with_no_circle():
    """Each package's allowed imports, taken as arrows, never lead back to it."""
    assert _cycle({p: rule(p) & set(PACKAGES) for p in PACKAGES}) is None


def test_the_checks_see_a_wrong_import_and_a_circle():
    """The parser finds imports inside functions and relative ones, and the cycle finder a loop."""
    assert "kdtr.runtime.device" in imports_of("kdtr.ops.tree_accept.cuda")
    assert "kdtr.ops.compare" in imports_of("kdtr.impl.evaluation")          # imported inside a function
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_wheel_ships_every_package():
    """pyproject lists its packages by name: a package it forgets would be missing from `pip install .`."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((KDTR.parent / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {m for m, (_, package) in MODULES.items() if package}
    assert packages <= set(pyproject["tool"]["setuptools"]["packages"])
