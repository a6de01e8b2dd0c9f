"""gen-refs: cases -> golden KDTR bundles with provenance; fresh bundles are skipped."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from .. import __version__
from ..scaleout import parallel
from ..atomic import remove_stale_temps
from ..errors import BundleError, LimitError, UsageError
from .format import MAJOR as FORMAT_MAJOR, MINOR as FORMAT_MINOR, read_bundle, write_bundle
from ..ops import OP_MODULES, get_op
from ..ops.base import Case
from .spec import Suite

FRESHNESS_KEYS = ("case_sha256", "reference_sha256", "format")   # what decides a golden's bytes


@dataclass(frozen=True)
class GenResult:
    case: str
    path: Path
    status: str          # "written" or "fresh" (skipped: provenance unchanged)
    seconds: float
    nbytes: int


OPS_PACKAGE = "kdtr.ops"
UNHASHED = ("kdtr.ops.base",)    # the op contract (types, the Op class): no generator or reference numbers


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)
    return body[1:] if is_doc else body


def _canonical(node: Any) -> Any:
    """An AST as plain data without docstrings, positions or empty fields: what the code does,
    not how it is commented or laid out (empty fields left out: the same on Python 3.11-3.13)."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if name == "body" and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                    ast.AsyncFunctionDef)):
                value = _strip_docstring(value)
            if value is None or value == []:
                continue
            fields.append([name, _canonical(value)])
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    return repr(node)


def _module_files(module: str) -> dict[str, Path]:
    """Module name -> file of `module` (a module, or a package and every module below it)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise BundleError(f"cannot find the code of module {module}")
    if not spec.submodule_search_locations:
        return {module: Path(spec.origin)}
    root = Path(spec.origin).parent
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((module, *parts[:-1])) if parts[-1] == "__init__" else ".".join((module, *parts))
        files[name] = path
    return files


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, str]]:
    """(absolute module, name) of every `from X import name` in the tree, lazy ones included."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module
            for alias in node.names:
                yield base, alias.name


def code_sha256(module: str, package: str = OPS_PACKAGE, unhashed: Iterable[str] = UNHASHED) -> str:
    """sha256 over the code (not comments, docstrings or layout) of one op's module or package,
    the sibling op modules it imports (whole) and the definitions it imports from helper modules
    (`_common`, `kdtr.dtypes`: only the names it imports). Other ops' files and `unhashed` (the op
    contract) do not count: editing them leaves this op's goldens fresh."""
    root, unhashed = package.split(".")[0], tuple(unhashed)
    whole: dict[str, Path] = {}
    wanted: dict[str, set[str]] = {}
    queue = [module]
    while queue:
        for name, path in _module_files(queue.pop()).items():
            if name in whole:
                continue
            whole[name] = path
            tree = ast.parse(path.read_bytes(), filename=str(path))
            for source, item in _imports(tree, name, path.name == "__init__.py"):
                head = source[len(package) + 1:].split(".")[0] if source.startswith(package + ".") else ""
                if source.split(".")[0] != root or source in unhashed or source == package:
                    continue
                if head and not head.startswith("_"):
                    queue.append(source)               # another op: its numbers feed this one's
                else:
                    wanted.setdefault(source, set()).add(item)
    digest = hashlib.sha256()
    for name in sorted(whole):
        digest.update(json.dumps([name, _canonical(ast.parse(whole[name].read_bytes()))]).encode())
    for name in sorted(set(wanted) - set(whole)):
        (path,) = _module_files(name).values()
        for node in ast.parse(path.read_bytes()).body:
            defined = _defined_names(node)
            if defined & wanted[name]:
                digest.update(json.dumps([name, sorted(defined), _canonical(node)]).encode())
    return digest.hexdigest()


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


@lru_cache(maxsize=None)
def reference_sha256(op: str) -> str:
    """The code hash of one registered op's generator and reference (see code_sha256)."""
    return code_sha256(OP_MODULES[op])


def case_sha256(case: Case) -> str:
    """Hash of everything that defines a case's bytes (not its position in the suite)."""
    def plain(value):
        return value.tolist() if isinstance(value, np.ndarray) else value

    canonical = {"op": case.op, "variant": case.variant, "seed": case.seed, "name": case.name,
                 "params": case.params, "inline": {k: plain(v) for k, v in case.inline.items()},
                 "tolerance": {k: t.to_json() for k, t in case.tolerance.items()}}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


@lru_cache(maxsize=1)
def _ml_dtypes_version() -> str:
    """From the package metadata: importing ml_dtypes costs ~0.5 s that a suite without bf16 needs not pay."""
    from importlib.metadata import version

    return version("ml_dtypes")


def spec_name(path: str | Path) -> str:
    """How a golden's provenance names its suite: one of kdtree's own suites (the checkout's
    specs/, or the copy an installed wheel carries) as `specs/<path below it>` wherever kdtree runs
    from, any other by its path as given (an absolute one relative to the working directory). Never
    an absolute local path: the wheel and the checkout write the same bytes, and --prune can tell
    which suite left a bundle."""
    from ..config import config
    from ..records.report import portable

    try:
        below = Path(path).resolve().relative_to(config().specs_dir.resolve())
    except ValueError:
        return portable(path)
    return "specs/" + below.as_posix()


def provenance(suite: Suite, case: Case) -> dict:
    return {"spec": spec_name(suite.path), "spec_sha256": suite.sha256,
            "case_sha256": case_sha256(case), "reference_sha256": reference_sha256(case.op),
            "format": f"{FORMAT_MAJOR}.{FORMAT_MINOR}", "kdtree": __version__, "numpy": np.__version__, "ml_dtypes": _ml_dtypes_version()}


def bundle_path(out_dir: str | Path, case: Case) -> Path:
    return Path(out_dir) / case.op / f"{case.name}.kdtr"


def is_fresh(path: Path, wanted: dict) -> bool:
    """A readable bundle whose provenance matches on every key that decides its bytes."""
    if not path.is_file():
        return False
    try:
        stored = read_bundle(path).meta.get("provenance")
    except BundleError:
        return False                      # corrupt or foreign: rebuild it
    return isinstance(stored, dict) and all(stored.get(k) == wanted[k] for k in FRESHNESS_KEYS)


def make_bundle(case: Case, prov: dict | None) -> tuple[dict, list[tuple[str, str, np.ndarray]]]:
    """Meta and tensors of one case's golden."""
    op = get_op(case.op)
    generated = op.generate(case)
    expected = op.reference(case.variant, generated.inputs, generated.params)
    tolerance = dict(op.tolerances(case.variant)) | dict(case.tolerance)
    meta = {"op": case.op, "variant": case.variant, "case": case.name, "seed": case.seed,
            "params": generated.params, "case_params": case.params,
            "tolerance": {name: tol.to_json() for name, tol in tolerance.items()}}
    if case.inline:
        meta["inline_inputs"] = sorted(case.inline)     # verify draws no --trials for it
    if prov is not None:
        meta["provenance"] = prov
    tensors = [(name, "input", a) for name, a in generated.inputs.items()]
    tensors += [(name, "output", expected[name]) for name in op.outputs]
    tensors += [(name, "aux", a) for name, a in generated.aux.items()]
    return meta, tensors


MEM_FRACTION = 0.5               # default bound: this share of MemAvailable (others run too)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_mem_limit() -> int | None:
    """KDTREE_MEM_LIMIT where set, else MEM_FRACTION of the memory available now."""
    from ..config import config

    if config().mem_limit:
        return parse_bytes(config().mem_limit, "KDTREE_MEM_LIMIT")
    available = available_memory()
    return None if available is None else int(available * MEM_FRACTION)


def parse_bytes(text: str, what: str = "--mem-limit") -> int:
    """`8G`, `512M`, `1.5G`, `1000000` (bytes; K/M/G/T are powers of 1024, an optional B); `what`
    names where the text came from in the error."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"{what} {text!r}: expected a size like 8G, 512M or a byte count")
    count = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if count < 1:
        raise UsageError(f"{what} {text!r}: is {count} bytes; expected at least 1 byte (e.g. 8G, 512M)")
    return count


def size_text(count: int) -> str:
    """A size in the largest binary unit that shows it (bytes, KiB, MiB, GiB), never `0.00 GiB`."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} bytes"


def check_memory(case: Case, limit: int | None) -> None:
    """LimitError when the op's estimate for the case is over `limit` bytes (None: no bound)."""
    estimate = get_op(case.op).estimate_bytes(case.variant, case.params)
    if limit is not None and estimate is not None and estimate > limit:
        raise LimitError(f"case {case.op}/{case.name} needs about {size_text(estimate)} to generate, over the "
                         f"memory limit of {size_text(limit)} (--mem-limit; default {MEM_FRACTION:g} of "
                         "MemAvailable)", file=case.source)


def gen_refs(cases: Iterable[tuple[Suite, Case]], out_dir: str | Path, *, force: bool = False,
             mem_limit: int | None = None, jobs: int = 1) -> Iterator[GenResult]:
    """Write each case's bundle (atomically), or skip it when its provenance is unchanged; results
    in the cases' order. First remove the temp files that killed writers left in the folders it
    writes, and refuse (before writing anything) a case to write whose memory estimate is over
    `mem_limit` bytes. With `jobs` > 1 the cases are generated in that many worker processes (at
    most one per core), never more at once than their estimates fit in `mem_limit`; an interrupted
    run terminates them and removes their temp files (no partial file is ever under a final name)."""
    plan = []
    for suite, case in cases:
        path = bundle_path(out_dir, case)
        prov = provenance(suite, case)
        fresh = not force and is_fresh(path, prov)
        if not fresh:
            check_memory(case, mem_limit)
        plan.append((case, path, prov, fresh))
    folders = list(dict.fromkeys(path.parent for _, path, _, _ in plan))
    for folder in folders:
        remove_stale_temps(folder)
    todo = [(case, path, prov) for case, path, prov, fresh in plan if not fresh]
    jobs = min(jobs, parallel.cpu_count(), len(todo))     # more workers than cores only compete
    if jobs > 1:
        written = parallel.bounded_map(write_case, todo, jobs=jobs, cost=_estimate, budget=mem_limit)
    else:
        written = map(write_case, todo)
    try:
        for case, path, prov, fresh in plan:
            seconds = 0.0 if fresh else next(written)
            yield GenResult(case.name, path, "fresh" if fresh else "written", seconds, path.stat().st_size)
    except BaseException:
        close = getattr(written, "close", None)
        if close is not None:
            close()                           # terminates the workers first
        for folder in folders:
            remove_stale_temps(folder)        # what the terminated workers were writing
        raise


def _estimate(task: tuple[Case, Path, dict]) -> int:
    case = task[0]
    return get_op(case.op).estimate_bytes(case.variant, case.params) or 0


def write_case(task: tuple[Case, Path, dict]) -> float:
    """Generate one case's golden and write it atomically; the seconds it took (a worker's unit)."""
    case, path, prov = task
    started = time.perf_counter()
    try:
        meta, tensors = make_bundle(case, prov)
    except MemoryError:
        raise LimitError(f"case {case.op}/{case.name} ran out of memory while generating "
                         f"(estimated {size_text(_estimate(task))})", file=case.source) from None
    write_bundle(path, meta, tensors, sweep=False)     # gen_refs swept its folders once, before
    return time.perf_counter() - started


def stale_bundles(out_dir: str | Path, suites: Iterable[Suite]) -> list[Path]:
    """Bundles that these suites' own earlier cases left (their provenance names one of these
    suites) and that no case of theirs names now: a renamed or removed case's old golden, which
    verify would otherwise keep checking; sorted. Other suites' bundles in the same folders, and
    bundles that name no suite, are never stale here: a prune of one suite leaves them alone."""
    suites = list(suites)
    named = {bundle_path(out_dir, case) for suite in suites for case in suite.cases}
    ours = {spec_name(suite.path) for suite in suites}
    folders = sorted({Path(out_dir) / suite.op for suite in suites})
    return sorted(path for folder in folders for path in folder.glob("*.kdtr")
                  if path not in named and path.is_file() and _left_by(path) in ours)


def _left_by(path: Path) -> str | None:
    """The suite a bundle's provenance names (None: unreadable, or no provenance)."""
    try:
        stored = read_bundle(path).meta.get("provenance")
    except BundleError:
        return None
    return stored.get("spec") if isinstance(stored, dict) else None


def prune(paths: Iterable[Path]) -> list[Path]:
    """Remove the given stale bundles; the ones removed (a file gone meanwhile is no error)."""
    removed = []
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise BundleError(f"cannot remove stale bundle: {e.strerror or e}", file=path) from e
        removed.append(path)
    return removed
