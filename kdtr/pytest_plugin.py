"""`pytest --kdtree PATH…`: every KDTR bundle under PATH a test item per implementation.

Registered through the package's `pytest11` entry point, so an installed kdtree needs nothing more.
It is inert unless `--kdtree` is given (or a test asks for the `kdtree_case` fixture); importing it
imports neither torch nor numpy. Each item runs `kdtr.verify.verify_item`: the comparison,
tolerances and rows of `kdtree verify`, not a second implementation of them. Items carry op and
variant markers (`-m verify_attn`, `-m bf16_paged`), their id names the case and the
implementation (`verify_attn/bf16_paged_b8_h8_p8192_n32[cuda]`), a failure reports kdtree's row
(worst element, where it sits in the tree, its share of the tolerance), an implementation that
cannot run here is a skip with its reason, and each row goes into `--junitxml` as a property.
Under pytest-xdist every worker pins one GPU (`CUDA_VISIBLE_DEVICES`), round robin.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

SUFFIX = ".kdtr"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kdtree", "kdtree: KDTR bundles as test items")
    group.addoption("--kdtree", nargs="+", action="extend", default=[], metavar="PATH",
                    help="Bundles or folders (every *.kdtr below) to verify, one item per bundle and "
                         "implementation. Without test paths of its own, pytest then collects only these.")
    group.addoption("--kdtree-impl", action="append", default=[], metavar="SPEC",
                    help="An implementation to verify (repeatable): a built-in (cuda, torch, numpy, a peer), "
                         "an entry point of kdtree.implementations, or OP[/VARIANT]=module:fn. "
                         "Default: the backend.")
    group.addoption("--kdtree-backend", default="auto", metavar="B",
                    help="cuda, torch, numpy or auto (cuda where a GPU exists, else torch); default auto.")
    group.addoption("--kdtree-trials", type=int, default=0, metavar="N",
                    help="Also run each case on N fresh random inputs (as kdtree verify --trials).")


class KdtreeSetup:
    """What the options resolved to, once per session: the bundles (found as `kdtree verify` finds
    them: kdtr.verify.find_bundles, which refuses what verify refuses), the implementations
    (ImplRefs; None: the backend), the verify Options."""

    def __init__(self, config) -> None:
        from .errors import KdtreeError
        from .verify import Options, find_bundles

        trials = config.getoption("kdtree_trials")
        if trials < 0:
            raise pytest.UsageError(f"--kdtree-trials {trials}: must be >= 0")
        try:
            self.bundles = tuple(find_bundles(config.getoption("kdtree")))
            backend = _backend(config.getoption("kdtree_backend"))
            specs = config.getoption("kdtree_impl")
            if specs:
                from .impl import resolve_refs

                self.impls: tuple[Any, ...] = resolve_refs(specs)
            else:
                self.impls = (None,)
        except KdtreeError as err:
            raise pytest.UsageError(str(err)) from None
        self.backend = backend
        self.options = Options(backend=backend, trials=trials)

    def covers(self, path: Path) -> bool:
        return path.resolve() in self._resolved

    @functools.cached_property
    def _resolved(self) -> frozenset[Path]:
        return frozenset(bundle.resolve() for bundle in self.bundles)

    def label(self, impl) -> str:
        return self.backend if impl is None else impl.name


def _backend(name: str) -> str:
    from .errors import UsageError

    if name not in ("cuda", "torch", "numpy", "auto"):
        raise UsageError(f"--kdtree-backend {name!r}: choose one of cuda, torch, numpy, auto")
    if name != "auto":
        return name
    from .runtime.device import gpu_available

    return "cuda" if gpu_available() else "torch"


def pytest_configure(config) -> None:
    _pin_worker_gpu()
    if not config.getoption("kdtree"):
        return
    from .ops import get_op, op_names

    for op in map(get_op, op_names()):
        config.addinivalue_line("markers", f"{op.name}: a kdtree bundle of op {op.name}")
        for variant in op.variants:
            config.addinivalue_line("markers", f"{variant}: a kdtree bundle of variant {variant}")
    setup = config.stash[_SETUP] = KdtreeSetup(config)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # the bundles alone, not the testpaths: each one the finder found, so pytest's own walk
        # (norecursedirs, links) cannot leave one out
        config.args = [str(bundle) for bundle in setup.bundles]


_SETUP = pytest.StashKey[KdtreeSetup]()


def _pin_worker_gpu() -> None:
    """Under xdist, worker gwN sees one GPU: the N-th of those visible (round robin), set before
    anything initialises CUDA."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d for d in visible.split(",") if d.strip()]
    else:
        devices = [str(i) for i in range(_gpu_count_without_cuda())]
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[int(worker[2:]) % len(devices)]


def _gpu_count_without_cuda() -> int:
    """GPUs as the driver lists them (nvidia-smi -L), without initialising CUDA in this process."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0


def pytest_collect_file(file_path: Path, parent):
    setup = parent.config.stash.get(_SETUP, None)
    if setup is not None and file_path.suffix == SUFFIX and setup.covers(file_path):
        return KdtreeBundle.from_parent(parent, path=file_path)
    return None


class KdtreeBundle(pytest.File):
    """One bundle: an item per implementation that serves its op and variant, or one failing item
    when the bundle cannot be read (a corrupted bundle is a failure, not a crash)."""

    def collect(self):
        setup = self.config.stash[_SETUP]
        try:
            op, variant, case = _describe(self.path)
        except Exception as err:  # noqa: BLE001 - any fault reading the bundle fails its item
            from .errors import reason

            yield self._item(f"{self.path.stem}[unreadable]", impl=None, fault=reason(err))
            return
        for impl in setup.impls:
            if impl is not None and not impl.load().serves(op, variant):
                continue
            item = self._item(f"{op}/{case}[{setup.label(impl)}]", impl=impl)
            item.add_marker(getattr(pytest.mark, op))
            item.add_marker(getattr(pytest.mark, variant))
            yield item


    def _item(self, name: str, **kwargs) -> "KdtreeItem":
        """An item whose id is given as the string `PATH::NAME[IMPL]`: pytest (9) parses such a
        string into the name and the bracket's params, as it does the ids it caches for --lf and
        --sw, so the two match; built from the name alone, the bracket stayed in the name and no
        cached id ever matched an item."""
        return KdtreeItem.from_parent(self, name=name, nodeid=f"{self.nodeid}::{name}", **kwargs)


def _describe(path: Path) -> tuple[str, str, str]:
    """The op, variant and case name a bundle declares (checked against the op registry)."""
    from .bundle.case import bundle_case
    from .bundle.format import read_bundle

    op, variant, _, case = bundle_case(read_bundle(path))
    return op.name, variant, case


class KdtreeFailure(Exception):
    """A bundle's rows that did not pass, with kdtree's words for each."""


class KdtreeItem(pytest.Item):
    def __init__(self, *, impl, fault: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.impl = impl
        self.fault = fault

    def runtest(self) -> None:
        if self.fault is not None:
            raise KdtreeFailure(f"{self.path}: {self.fault}")
        from .errors import KdtreeError
        from .verify import verify_item

        setup = self.config.stash[_SETUP]
        try:
            rows = verify_item(self.path, self.impl, setup.options)
        except KdtreeError as err:
            raise KdtreeFailure(str(err)) from None
        for row in rows:
            self.user_properties.append(("kdtree_row", json.dumps(row.to_plain(), separators=(",", ":"))))
        failed = [row for row in rows if row.failed]
        if failed:
            raise KdtreeFailure("\n".join(describe_row(row, self.path) for row in failed))
        skipped = [row for row in rows if row.skipped is not None]
        if rows and len(skipped) == len(rows):
            pytest.skip(f"{setup.label(self.impl)}: {skipped[0].skipped}")
        if not rows:
            pytest.skip(f"{setup.label(self.impl)} does not serve this bundle")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, KdtreeFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, ""      # pytest would read dots in the case name as Python's


def describe_row(row, path: Path) -> str:
    """kdtree's account of a failing row (kdtr.testing.failure_text), its worst elements placed in
    the tree from the bundle's own inputs (not for a trial, whose inputs were fresh)."""
    from .testing import failure_text

    if row.trial:
        return failure_text(row)
    try:
        from .bundle.case import load_case

        case = load_case(path)
    except Exception:  # noqa: BLE001 - the row's own words stand without the position
        return failure_text(row)
    return failure_text(row, case.inputs, case.params)


class KdtreeCase:
    """One bundle's case for a user's own test: op, variant, params, inputs (numpy), the path;
    `check(fn)`, which runs `fn(inputs, params) -> outputs` (torch tensors in and out, the
    implementation contract of docs/implementations.md) through kdtree's verify on this bundle;
    and kdtr.testing on it: `assert_close(outputs)` against the bundle's golden, `time(fn, ...)`."""

    def __init__(self, path: Path, options) -> None:
        from .bundle.case import GOLDEN, load_case

        loaded = load_case(path)
        self.path, self.op, self.variant = path, loaded.op.name, loaded.variant
        self.case, self.params, self.inputs = loaded.case, dict(loaded.params), loaded.inputs
        self.expected = loaded.expected if loaded.source == GOLDEN else None     # None: the reference's
        self._options = options

    def assert_close(self, outputs):
        """kdtr.testing.assert_op_close of `outputs` on this bundle's inputs: its golden outputs,
        the op's tolerances and derived bound. A miss fails the test with kdtree's words."""
        from .testing import OpMismatch, assert_op_close

        try:
            return assert_op_close(self.op, self.variant, self.inputs, outputs, params=self.params,
                                   expected=self.expected, case=self.case)
        except OpMismatch as err:
            pytest.fail(str(err), pytrace=False)

    def time(self, fn, *others, mode: str = "hot", options=None):
        """kdtr.testing.time_gpu: `fn` (and `others`, interleaved) timed as kdtree bench times."""
        from .testing import time_gpu

        return time_gpu(fn, *others, mode=mode, options=options)

    def check(self, fn) -> list:
        """Verify `fn` on this bundle (golden and trials); a failing row fails the test with
        kdtree's words, an implementation that cannot run here skips it. Returns the rows. `fn`
        runs in a worker process of its own (kdtr.impl.isolation: a crash fails the test, not the
        session) where it can be sent there by reference (a module-level function); a lambda or a
        closure runs in the test's process."""
        from .impl.resolve import callable_impl
        from .impl.base import Serves
        from .verify import verify_item

        name, serves = getattr(fn, "__name__", "kdtree_case"), (Serves(self.op, self.variant),)
        impl = callable_impl(name, fn, serves)
        if _sendable(fn):
            from .impl.isolation import isolated

            impl = isolated(impl, functools.partial(callable_impl, name, fn, serves))
        rows = verify_item(self.path, impl, self._options)
        failed = [row for row in rows if row.failed]
        if failed:
            pytest.fail("\n".join(describe_row(row, self.path) for row in failed), pytrace=False)
        if rows and all(row.skipped is not None for row in rows):
            pytest.skip(rows[0].skipped)
        return rows


def _sendable(fn) -> bool:
    """Whether a worker process can get `fn` by reference: it pickles (not a lambda, a closure, a
    local function) and its module can be found by name there (not `__main__`, not a test module
    pytest's importlib mode imported under a name of its own)."""
    import importlib.util

    try:
        pickle.dumps(fn)
        return importlib.util.find_spec(fn.__module__) is not None
    except Exception:  # noqa: BLE001 - any doubt: it runs in the test's process
        return False


def pytest_generate_tests(metafunc) -> None:
    """`kdtree_case` is parametrized over the --kdtree bundles (no --kdtree: one skipped case)."""
    if "kdtree_case" not in metafunc.fixturenames:
        return
    setup = metafunc.config.stash.get(_SETUP, None)
    paths = list(setup.bundles) if setup else []
    metafunc.parametrize("kdtree_case", paths or [None], indirect=True,
                         ids=[f"{p.parent.name}/{p.stem}" for p in paths] or ["no-bundles"])


@pytest.fixture
def kdtree_case(request) -> KdtreeCase:
    """One bundle of --kdtree as a KdtreeCase (see pytest_generate_tests)."""
    path = getattr(request, "param", None)
    if path is None:
        pytest.skip("no bundles: give pytest --kdtree PATH")
    return KdtreeCase(path, request.config.stash[_SETUP].options)
