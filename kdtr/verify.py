"""Verify bundles: run a backend on a golden's inputs (and on fresh inputs), compare every output."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from . import backends
from .compare import OutputCheck, compare_output
from .errors import KdtrError, KdtreeError, LaunchError, UsageError
from .format import Bundle, read_bundle
from .ops import get_op
from .ops.base import Case, Op, Tolerance


@dataclass(frozen=True)
class VerifyRow:
    """One case (trial 0: the golden's own inputs; trial t > 0: fresh inputs from the generator)."""

    case: str
    file: str
    op: str
    variant: str
    backend: str
    config: dict[str, int]
    passed: bool
    outputs: tuple[OutputCheck, ...] = ()
    error: str | None = None           # why the case could not be compared at all
    trial: int = 0
    seed: int | None = None
    seconds: float = 0.0
    deterministic: bool | None = None  # two runs bitwise equal (None: not probed)

    def worst(self, metric: str) -> float:
        values = [getattr(o, metric) for o in self.outputs if not o.tolerance.exact]
        values += [getattr(o, metric) for o in self.outputs if o.tolerance.exact and not o.passed]
        return max(values, default=0.0)

    @property
    def mismatches(self) -> int:
        return sum(o.mismatches for o in self.outputs)


@dataclass(frozen=True)
class Options:
    backend: str = "torch"            # resolved backend name
    atol: float | None = None         # overrides for every toleranced output
    rtol: float | None = None
    trials: int = 0                   # fresh-input re-runs per case
    determinism: bool = False         # run twice, compare bitwise
    kernels: tuple[str, ...] = ()     # CUDA kernels to force where a case's op/variant has them

    def kernel_for(self, op: Op, variant: str) -> str | None:
        """The forced kernel for this op/variant, or None for the launch's own choice."""
        return next((k for k in self.kernels if k in op.cuda_kernels(variant)), None)


def check_kernels(names: Iterable[str], backend: str) -> tuple[str, ...]:
    """--kernel names, each a kernel some op can force; UsageError naming the known ones."""
    from .ops import op_names

    names = tuple(dict.fromkeys(names))
    if names and backend != "cuda":
        raise UsageError(f"--kernel forces a CUDA kernel; it needs the cuda backend, not {backend}")
    known = {k: op.name for op in map(get_op, op_names()) for v in op.variants for k in op.cuda_kernels(v)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown kernel {', '.join(map(repr, unknown))}; known: "
                         + ", ".join(f"{k} ({op})" for k, op in known.items()))
    return names


def find_bundles(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; directories expanded to every *.kdtr below them, sorted. A *.kdtr that is
    not a regular file (a dangling link, a FIFO) is an error, never silently skipped."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        candidates = sorted(p for p in path.rglob("*.kdtr") if not p.is_dir()) if path.is_dir() else [path]
        for candidate in candidates:
            if not candidate.exists():
                raise UsageError(f"{candidate}: no such file or directory"
                                 + (" (a dangling symbolic link)" if candidate.is_symlink() else ""))
            if not candidate.is_file():
                raise UsageError(f"{candidate}: not a regular file (a FIFO, socket or device)")
            found.append(candidate)
    return found


def bundle_case(bundle: Bundle) -> tuple[Op, str, dict[str, Any], str]:
    """The op, variant, params and case name a bundle declares, checked against the registry."""
    meta = bundle.meta
    op_name = meta.get("op")
    try:
        op = get_op(op_name) if isinstance(op_name, str) else None
    except KeyError:
        op = None
    if op is None:
        raise KdtrError(f"meta.op {op_name!r} is not a known op", file=bundle.path)
    variant = meta.get("variant", "default")
    if variant not in op.variants:
        raise KdtrError(f"meta.variant {variant!r} is not one of {op.name}'s {list(op.variants)}",
                        file=bundle.path)
    params = meta.get("params", {})
    if not isinstance(params, dict):
        raise KdtrError("meta.params must be an object", file=bundle.path)
    missing = [k for k in op.kernel_params if k not in params]
    if missing:
        raise KdtrError(f"meta.params lacks {missing} ({op.name} needs them)", file=bundle.path)
    case = meta.get("case", bundle.path.stem)
    if not isinstance(case, str):
        raise KdtrError("meta.case must be a string", file=bundle.path)
    return op, variant, params, case


def tolerances(op: Op, variant: str, meta_tolerance: Any, options: Options, file=None) -> dict[str, Tolerance]:
    """Op defaults < the bundle's meta.tolerance < command-line overrides."""
    merged = dict(op.tolerances(variant))
    if meta_tolerance is not None:
        if not isinstance(meta_tolerance, dict):
            raise KdtrError("meta.tolerance must be an object", file=file)
        for name, value in meta_tolerance.items():
            if name not in op.outputs:
                raise KdtrError(f"meta.tolerance names {name!r}, not an output of {op.name}", file=file)
            try:
                merged[name] = Tolerance.parse(value)
            except ValueError as err:
                raise KdtrError(f"meta.tolerance.{name}: {err}", file=file) from None
    for name, tol in merged.items():
        if not tol.exact and (options.atol is not None or options.rtol is not None):
            merged[name] = Tolerance(atol=tol.atol if options.atol is None else options.atol,
                                     rtol=tol.rtol if options.rtol is None else options.rtol, l2=tol.l2)
    return merged


def check_case(op: Op, variant: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
               params: Mapping[str, Any], tols: Mapping[str, Tolerance], options: Options,
               **row: Any) -> VerifyRow:
    """Run the backend once (twice for the determinism probe) and compare every output."""
    started = time.perf_counter()
    config = op.describe(variant, inputs, params)
    kernel = options.kernel_for(op, variant)
    if kernel is not None:
        config = config | {"kernel": kernel}
    try:
        got = backends.run(options.backend, op, variant, inputs, params, kernel)
        deterministic = None
        if options.determinism:
            again = backends.run(options.backend, op, variant, inputs, params, kernel)
            deterministic = all(np.array_equal(got[k].view(np.uint8), again[k].view(np.uint8))
                                for k in got)
    except LaunchError as err:   # a kernel that fails to launch or run fails its case (exit 1)
        return VerifyRow(op=op.name, variant=variant, backend=options.backend, config=config,
                         passed=False, error=f"{row.get('case')}: {err}",
                         seconds=time.perf_counter() - started, **row)
    except KdtreeError:          # no GPU, a compile error: the run cannot go on (exit 2)
        raise
    except Exception as err:     # a backend that crashes fails its case, with the reason
        return VerifyRow(op=op.name, variant=variant, backend=options.backend, config=config,
                         passed=False, error=f"{type(err).__name__}: {err}",
                         seconds=time.perf_counter() - started, **row)
    checks = tuple(compare_output(name, got.get(name), expected[name], tols[name]) for name in op.outputs)
    return VerifyRow(op=op.name, variant=variant, backend=options.backend, config=config,
                     passed=all(c.passed for c in checks), outputs=checks, deterministic=deterministic,
                     seconds=time.perf_counter() - started, **row)


def trial_seed(seed: int, trial: int) -> int:
    """Fresh, reproducible seeds for re-runs: never the golden's own seed."""
    return (int(seed) * 1_000_003 + 7919 * trial) % (1 << 31)


@dataclass(frozen=True)
class LoadedCase:
    """A bundle whose meta, inputs and outputs were checked against its op: safe to run."""

    bundle: Bundle
    op: Op
    variant: str
    params: dict[str, Any]
    case: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


def load_case(path: str | Path) -> LoadedCase:
    """Read a bundle and check it fits its op (names, dtypes, shapes, indices) before any backend runs."""
    bundle = read_bundle(path)
    op, variant, params, case = bundle_case(bundle)
    inputs, expected = bundle.arrays("input"), bundle.arrays("output")
    fault = backends.expected_dtype_check(op, variant, inputs)
    if fault is None and sorted(expected) != sorted(op.outputs):
        fault = f"outputs {sorted(expected)} do not match {op.name}'s {sorted(op.outputs)}"
    if fault is None:
        try:
            op.check_inputs(variant, inputs, params)
        except ValueError as err:
            fault = str(err)
    if fault:
        raise KdtrError(fault, file=path)
    return LoadedCase(bundle, op, variant, params, case, inputs, expected)


def verify_bundle(path: str | Path, options: Options) -> list[VerifyRow]:
    """Rows for one bundle: its golden, then `options.trials` fresh-input trials."""
    loaded = load_case(path)
    bundle, op, variant, params, case = loaded.bundle, loaded.op, loaded.variant, loaded.params, loaded.case
    inputs, expected = loaded.inputs, loaded.expected
    tols = tolerances(op, variant, bundle.meta.get("tolerance"), options, file=path)
    rows = [check_case(op, variant, inputs, expected, params, tols, options,
                       case=case, file=str(path), seed=bundle.meta.get("seed"))]
    case_params, seed = bundle.meta.get("case_params"), bundle.meta.get("seed")
    if options.trials and isinstance(case_params, dict) and isinstance(seed, int):
        for trial in range(1, options.trials + 1):
            fresh = Case(case, op.name, variant, trial_seed(seed, trial), dict(case_params))
            generated = op.generate(fresh)
            reference = op.reference(variant, generated.inputs, generated.params)
            rows.append(check_case(op, variant, generated.inputs, reference, generated.params, tols,
                                   options, case=case, file=str(path), trial=trial, seed=fresh.seed))
    return rows


def verify_file(path: str | Path, options: Options) -> tuple[list[VerifyRow], str | None]:
    """verify_bundle with a bad bundle turned into its message (so it can cross a process)."""
    try:
        return verify_bundle(path, options), None
    except KdtreeError as err:
        return [], str(err) if err.file else f"{path}: {err}"


def crashed(path: str | Path, reason: str) -> tuple[list[VerifyRow], str | None]:
    """The row of a bundle whose worker process died: the case fails with the reason."""
    return [VerifyRow(case=Path(path).stem, file=str(path), op="?", variant="?", backend="?", config={},
                      passed=False, error=reason)], None


def shard_key(path: str | Path) -> str:
    """goldens/<op>/<case>.kdtr -> "<op>/<case>", the key gen-refs shards cases by."""
    path = Path(path)
    return f"{path.parent.name}/{path.stem}"
