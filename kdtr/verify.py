"""Verify bundles: run a backend on a golden's inputs (and on fresh inputs), compare every output."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from . import backends, parallel, report
from .compare import OutputCheck, compare_output
from .errors import KdtrError, KdtreeError, LaunchError, UsageError
from .format import MAGIC, PREAMBLE, Bundle, read_bundle
from .ops import get_op
from .ops.base import Case, Op, Tolerance
from .walk import files_below

if TYPE_CHECKING:        # kdtr.impl is imported where --impl / --against use it, not at start-up
    from .impl import Implementation


GOLDEN = "golden"
REFERENCE = "reference"
DEVICE_REFERENCE = "reference (float64, cuda)"
# What a row's outputs were compared with. A trial row (fresh inputs) is always compared with a
# reference computed here; it keeps the default (GOLDEN: the numpy reference, the math that made the
# golden) unless the device reference computed it, so CPU records stay as they were.
EXPECTED = {GOLDEN: "the bundle's stored outputs (exact numpy reference at gen-refs time)",
            REFERENCE: "computed by verify with the numpy reference (the bundle stores no golden)",
            DEVICE_REFERENCE: "computed by verify with the op's float64 torch reference on the GPU "
                              "(bench_reference; trials, or a bundle without a golden)"}


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
    loosened: bool = False             # some output's tolerance is looser than the op's default
    impl: str | None = None            # the implementation that ran (--impl), or that captured the outputs
    expected_from: str = GOLDEN        # what the outputs were compared with (see EXPECTED; trials too)
    captured: bool = False             # the outputs compared are the bundle's captured ones, not a run
    skipped: str | None = None         # why the implementation could not run here (not a pass)
    not_compared: tuple[str, ...] = ()  # outputs the implementation does not give
    parity: dict[str, Any] | None = None   # --against: kdtr.impl.ParityReport.to_json(), or {"reason"}

    def to_plain(self) -> dict[str, Any]:
        """JSON form; optional fields at their default (no error, trial 0, not probed, not loosened,
        no impl, ...) are left out."""
        full = {"case": self.case, "file": self.file, "op": self.op, "variant": self.variant,
                "backend": self.backend, "config": dict(self.config), "passed": self.passed,
                "outputs": [o.to_plain() for o in self.outputs], "error": self.error, "trial": self.trial,
                "seed": self.seed, "seconds": round(self.seconds, 6), "deterministic": self.deterministic,
                "loosened": self.loosened, "impl": self.impl, "expected_from": self.expected_from,
                "captured": self.captured, "skipped": self.skipped, "not_compared": list(self.not_compared),
                "parity": self.parity}
        return report.drop_defaults(full, {"error": None, "trial": 0, "seed": None, "deterministic": None,
                                           "loosened": False, "impl": None, "expected_from": GOLDEN,
                                           "captured": False, "skipped": None, "not_compared": [],
                                           "parity": None})

    @staticmethod
    def from_plain(data: dict[str, Any]) -> "VerifyRow":
        """The inverse of to_plain; KeyError/TypeError/ValueError if malformed."""
        return VerifyRow(str(data["case"]), str(data["file"]), str(data["op"]), str(data["variant"]),
                         str(data["backend"]), dict(data["config"]), bool(data["passed"]),
                         tuple(OutputCheck.from_plain(o) for o in data["outputs"]), data.get("error"),
                         int(data.get("trial", 0)), data.get("seed"), float(data["seconds"]),
                         data.get("deterministic"), bool(data.get("loosened", False)), data.get("impl"),
                         str(data.get("expected_from", GOLDEN)), bool(data.get("captured", False)),
                         data.get("skipped"), tuple(map(str, data.get("not_compared", ()))),
                         data.get("parity"))

    @property
    def failed(self) -> bool:
        """It ran (or was to be compared) and did not pass; a skipped row neither passed nor failed."""
        return not self.passed and self.skipped is None

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
    keep_worst: bool = False          # keep worst elements of passing outputs too (records grow)
    impls: tuple[str, ...] = ()       # --impl specs: these implementations run instead of the backend
    against: str | None = None        # --against spec: run beside the backend, parity reported

    def implementations(self) -> tuple[Implementation, ...]:
        return tuple(map(self.implementation, self.impls))

    @staticmethod
    def implementation(spec: str) -> Implementation:
        from .impl import resolved

        return resolved(spec)

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
    """Files as given; directories expanded to every *.kdtr below them (linked subfolders followed,
    each folder once), sorted. A *.kdtr that is
    not a regular file (a dangling link, a FIFO) is an error, never silently skipped."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        candidates = files_below(path, "*.kdtr") if path.is_dir() else [path]
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


def default_tolerances(op: Op, variant: str, options: Options) -> dict[str, Tolerance]:
    """The op's contract for our kernels, the reference and other implementations; for the torch
    backend the bound bench holds it to (`baseline_tolerances`): it is a second, independent fp32
    implementation whose summation order is its BLAS's (on a 2-core CPU with two threads, about one
    run in five put half of one case's rows up to 4.4e-5 off in lse, none with one thread: over the
    kernels' 1e-5, inside the baseline's 1e-4, whose reason is beside it in the op)."""
    if options.backend == "torch" and not options.impls:
        return dict(op.baseline_tolerances(variant))
    return dict(op.tolerances(variant))


def tolerances(op: Op, variant: str, meta_tolerance: Any, options: Options, file=None) -> dict[str, Tolerance]:
    """default_tolerances < the bundle's meta.tolerance < command-line overrides."""
    merged = default_tolerances(op, variant, options)
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


@dataclass(frozen=True)
class _Ran:
    """What running one implementation on one case gave: numpy outputs, or why not."""

    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None          # it ran and failed (exit 1)
    skipped: str | None = None        # it cannot run here (ImplUnavailable)


def _run_backend(op: Op, variant: str, inputs, params, options: Options, kernel: str | None, case) -> _Ran:
    try:
        return _Ran(backends.run(options.backend, op, variant, inputs, params, kernel))
    except LaunchError as err:   # a kernel that fails to launch or run fails its case (exit 1)
        return _Ran(error=f"{case}: {err}")
    except KdtreeError:          # no GPU, a compile error: the run cannot go on (exit 2)
        raise
    except Exception as err:     # a backend that crashes fails its case, with the reason
        return _Ran(error=f"{type(err).__name__}: {err}")


def _run_impl(impl: Implementation, op: Op, variant: str, inputs, params, expected) -> _Ran:
    """kdtr.impl.run: a raise, a missing output, a wrong shape or dtype, or a NaN where the expected
    outputs have none fails the case with that reason; an unavailable implementation skips it."""
    from .impl import ImplUnavailable, run

    try:
        result = run(impl, op, variant, inputs, params, reference=expected)
    except ImplUnavailable as err:
        return _Ran(skipped=str(err))
    return _Ran(result.outputs) if result.ok else _Ran(error=f"{impl.name}: {result.reason}")


def check_case(op: Op, variant: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
               params: Mapping[str, Any], tols: Mapping[str, Tolerance], options: Options,
               impl: Implementation | None = None, stored: Mapping[str, np.ndarray] | None = None,
               stored_by: str | None = None, **row: Any) -> tuple[VerifyRow, dict[str, np.ndarray] | None]:
    """Run the backend (or `impl`) once (twice for the determinism probe) and compare every output it
    gives with `expected`; `stored` compares those captured outputs (of `stored_by`) instead of
    running anything. The row and the outputs that were compared (None: nothing ran)."""
    started = time.perf_counter()
    config = op.describe(variant, inputs, params)
    ours = impl is None and stored is None
    kernel = options.kernel_for(op, variant) if ours else None
    if kernel is not None:
        config = config | {"kernel": kernel}
    if stored is not None:
        produce = functools.partial(_Ran, dict(stored))
    elif impl is None:
        produce = functools.partial(_run_backend, op, variant, inputs, params, options, kernel, row.get("case"))
    else:
        produce = functools.partial(_run_impl, impl, op, variant, inputs, params, expected)
    name = options.backend if ours else (impl.name if impl is not None else stored_by)
    base = dict(op=op.name, variant=variant, backend=name, config=config, impl=None if ours else name,
                captured=stored is not None, **row)
    ran = produce()
    deterministic = None
    if options.determinism and ran.outputs is not None and stored is None:
        again = produce()
        deterministic = again.outputs is not None and all(
            np.array_equal(ran.outputs[k].view(np.uint8), again.outputs[k].view(np.uint8)) for k in ran.outputs)
    if ran.outputs is None:
        return VerifyRow(passed=False, error=ran.error, skipped=ran.skipped,
                         seconds=time.perf_counter() - started, **base), None
    names = list(op.outputs) if ours else [n for n in op.outputs if n in ran.outputs]
    checks = tuple(compare_output(name, ran.outputs.get(name), expected[name], tols[name]) for name in names)
    if not options.keep_worst:
        checks = tuple(c if not c.passed else replace(c, worst=()) for c in checks)
    return VerifyRow(passed=all(c.passed for c in checks), outputs=checks, deterministic=deterministic,
                     seconds=time.perf_counter() - started, loosened=loosened(op, variant, tols, options),
                     not_compared=tuple(n for n in op.outputs if n not in names), **base), ran.outputs


def with_parity(row: VerifyRow, ours: Mapping[str, np.ndarray] | None, against: Implementation, op: Op,
                variant: str, inputs, params, expected) -> VerifyRow:
    """`row` (ours) with the parity of `against` on the same inputs (kdtr.impl.parity, reference: the
    expected outputs), or the reason there is none."""
    from .impl import parity

    if not against.serves(op.name, variant):
        return replace(row, parity={"theirs": against.name, "reason": f"{against.name} does not serve "
                                                                        f"{op.name}/{variant}"})
    if ours is None:
        return replace(row, parity={"theirs": against.name, "reason": f"{row.backend} gave no outputs"})
    theirs = _run_impl(against, op, variant, inputs, params, expected)
    if theirs.outputs is None:
        why = f"skipped: {theirs.skipped}" if theirs.skipped else f"failed: {theirs.error}"
        return replace(row, parity={"theirs": against.name, "reason": why})
    found = parity(op, variant, ours, theirs.outputs, ours_name=row.backend, theirs_name=against.name,
                   reference=expected, inputs=inputs, params=params)
    return replace(row, parity=found.to_json())


def looser(tol: Tolerance, default: Tolerance) -> bool:
    """Whether `tol` lets through something `default` refuses (exact < any bound; larger atol, rtol
    or l2; dropping an l2 bound)."""
    if default.exact:
        return not tol.exact
    if tol.exact:
        return False
    l2 = default.l2 is not None and (tol.l2 is None or tol.l2 > default.l2)
    return tol.atol > default.atol or tol.rtol > default.rtol or l2


def loosened(op: Op, variant: str, tols: Mapping[str, Tolerance], options: Options) -> bool:
    """A bundle's or the command line's tolerance is looser than the default for some output."""
    defaults = default_tolerances(op, variant, options)
    return any(looser(tol, defaults[name]) for name, tol in tols.items() if name in defaults)


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
    expected: dict[str, np.ndarray]   # the stored outputs: the golden, the captured ones, or none
    source: str = GOLDEN              # golden | reference (inputs only) | captured (kdtr.capture)
    captured_by: str | None = None    # who produced the captured outputs


def load_case(path: str | Path) -> LoadedCase:
    """Read a bundle and check it fits its op (names, dtypes, shapes, indices) before any backend runs.
    A bundle of kdtr.capture (meta.expected) may store no outputs ("reference") or captured ones."""
    from .capture import EXPECTED_CAPTURED, EXPECTED_REFERENCE

    bundle = read_bundle(path)
    op, variant, params, case = bundle_case(bundle)
    inputs, expected = bundle.arrays("input"), bundle.arrays("output")
    source = bundle.meta.get("expected", GOLDEN)
    fault = None
    if source not in (GOLDEN, EXPECTED_REFERENCE, EXPECTED_CAPTURED):
        fault = f"meta.expected {source!r} is not one of {EXPECTED_REFERENCE!r}, {EXPECTED_CAPTURED!r}"
    elif source == EXPECTED_REFERENCE and expected:
        fault = f"meta.expected is {EXPECTED_REFERENCE!r} but the bundle stores outputs {sorted(expected)}"
    elif source != EXPECTED_REFERENCE and sorted(expected) != sorted(op.outputs):
        fault = f"outputs {sorted(expected)} do not match {op.name}'s {sorted(op.outputs)}"
    fault = fault or backends.input_fault(op, variant, inputs, params)
    if fault:
        raise KdtrError(fault, file=path)
    captured_by = str(bundle.meta.get("captured_by", "unknown")) if source == EXPECTED_CAPTURED else None
    return LoadedCase(bundle, op, variant, params, case, inputs, expected, source, captured_by)


def verify_bundle(path: str | Path, options: Options) -> list[VerifyRow]:
    """Rows for one bundle: its golden, then `options.trials` fresh-input trials, each run by the
    backend (with `options.against` beside it) or by each of `options.impls` that serves the op and
    variant (none: no rows). A bundle without a golden is compared with the reference computed here;
    captured outputs are a row of their own, the capturing implementation's, against it. Trials and
    bundles without a golden take the float64 device reference on a GPU (see reference_outputs)."""
    loaded = load_case(path)
    bundle, op, variant, params, case = loaded.bundle, loaded.op, loaded.variant, loaded.params, loaded.case
    impls = [impl for impl in options.implementations() if impl.serves(op.name, variant)]
    if options.impls and not impls:
        return []
    inputs, expected, how = loaded.inputs, loaded.expected, GOLDEN
    if loaded.source != GOLDEN:
        from .impl.builtin import reference_outputs

        expected, on_device = reference_outputs(op, variant, inputs, params)
        how = DEVICE_REFERENCE if on_device else REFERENCE
    tols = tolerances(op, variant, bundle.meta.get("tolerance"), options, file=path)
    file = report.portable(path)
    against = options.implementation(options.against) if options.against else None

    def rows_for(inputs, expected, params, **row) -> list[VerifyRow]:
        if impls:
            return [check_case(op, variant, inputs, expected, params, tols, options, impl, **row)[0]
                    for impl in impls]
        got, ours = check_case(op, variant, inputs, expected, params, tols, options, **row)
        if against is not None:
            got = with_parity(got, ours, against, op, variant, inputs, params, expected)
        return [got]

    rows = rows_for(inputs, expected, params, case=case, file=file, seed=bundle.meta.get("seed"), expected_from=how)
    if loaded.captured_by is not None:
        rows.append(check_case(op, variant, inputs, expected, params, tols, options, stored=loaded.expected,
                               stored_by=loaded.captured_by, case=case, file=file, expected_from=how)[0])
    case_params, seed = bundle.meta.get("case_params"), bundle.meta.get("seed")
    if options.trials and isinstance(case_params, dict) and isinstance(seed, int):
        from .impl.builtin import reference_outputs

        fresh = [Case(case, op.name, variant, trial_seed(seed, trial), dict(case_params))
                 for trial in range(1, options.trials + 1)]
        window = trial_window(op, variant, case_params, len(fresh))
        # The trials' inputs are drawn in threads, `window` trials ahead at most; each is run and
        # compared here, in trial order, and dropped before the next is asked for (memory bound).
        with contextlib.closing(parallel.threaded_map(op.generate, fresh, window=window)) as inputs_of:
            for trial, (spec, generated) in enumerate(zip(fresh, inputs_of), start=1):
                reference, on_device = reference_outputs(op, variant, generated.inputs, generated.params)
                rows += rows_for(generated.inputs, reference, generated.params, case=case, file=file,
                                 trial=trial, seed=spec.seed,
                                 expected_from=DEVICE_REFERENCE if on_device else GOLDEN)
                del generated, reference
    return rows


def trial_window(op: Op, variant: str, case_params: Mapping[str, Any], trials: int) -> int:
    """How many trials' fresh inputs verify generates at once (kdtr.parallel.threaded_map): one
    per usable core, no more than the trials, and no more than the op's memory estimate for the
    case fits in gen-refs' bound (refs.default_mem_limit: KDTREE_MEM_LIMIT, else half of
    MemAvailable) beside the loaded bundle's own inputs (no estimate: small, cores only); 1 (each
    in turn, in this thread, as before) where the estimate fails: the generator says why, in turn."""
    from .refs import default_mem_limit

    window = min(trials, parallel.cpu_count())
    if window <= 1:
        return 1
    try:
        estimate = op.estimate_bytes(variant, case_params)
    except Exception:       # noqa: BLE001 - malformed case_params: generate says why, in turn
        return 1
    limit = default_mem_limit()
    if estimate and limit is not None:
        window = min(window, limit // estimate - 1)    # one estimate for the golden held meanwhile
    return max(1, window)


def verify_file(path: str | Path, options: Options) -> tuple[list[VerifyRow], str | None]:
    """verify_bundle with a bad bundle turned into its message (so it can cross a process)."""
    try:
        return verify_bundle(path, options), None
    except KdtreeError as err:
        return [], str(err) if err.file else f"{path}: {err}"


def crashed(path: str | Path, reason: str) -> tuple[list[VerifyRow], str | None]:
    """The row of a bundle whose worker process died: the case fails with the reason."""
    return [VerifyRow(case=Path(path).stem, file=report.portable(path), op="?", variant="?", backend="?", config={},
                      passed=False, error=reason)], None


def shard_key(path: str | Path) -> str:
    """goldens/<op>/<case>.kdtr -> "<op>/<case>", the key gen-refs shards cases by."""
    path = Path(path)
    return f"{path.parent.name}/{path.stem}"


def suite_digest(files: Iterable[str | Path]) -> str:
    """sha256 over the selected bundles (before sharding): each one's shard key and the header crc32
    of its preamble (which covers its meta and every tensor's crc32), read without the tensors. Shards
    of one selection of one golden set share it; a shard of another one does not."""
    digest = hashlib.sha256()
    for key, path in sorted((shard_key(f), Path(f)) for f in files):
        try:
            with open(path, "rb") as handle:
                head = handle.read(PREAMBLE.size)
        except OSError:
            head = b""
        if len(head) == PREAMBLE.size and head.startswith(MAGIC):
            _, _, _, header_len, header_crc, _ = PREAMBLE.unpack(head)
            fingerprint = f"{header_len}:{header_crc:08x}"
        else:
            fingerprint = "unreadable"          # verify reports the bundle itself
        digest.update(f"{key}\0{fingerprint}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class VerifyRecord:
    """What `verify --json` writes and `report --merge` joins: meta (with `shard` and `suite_sha256`),
    the rows, the bundles that could not be read, and (cuda runs) the kernels loaded."""

    meta: dict[str, Any]
    rows: tuple[VerifyRow, ...]
    errors: tuple[str, ...] = ()
    kernels: tuple[dict[str, Any], ...] | None = None
    not_run: tuple[str, ...] = ()     # bundles no given implementation serves (--impl)

    @property
    def summary(self) -> dict[str, Any]:
        """Counts; `skipped` and `not_run` only where there are some (--impl runs)."""
        skipped = sum(r.skipped is not None for r in self.rows)
        return {"cases": len(self.rows), "passed": sum(r.passed for r in self.rows),
                "failed": sum(r.failed for r in self.rows), **({"skipped": skipped} if skipped else {}),
                **({"not_run": len(self.not_run)} if self.not_run else {}), "errors": list(self.errors)}

    def to_plain(self) -> dict[str, Any]:
        return {"kind": report.VERIFY_KIND, "meta": self.meta, "summary": self.summary,
                "rows": [row.to_plain() for row in self.rows], "errors": list(self.errors),
                "kernels": None if self.kernels is None else list(self.kernels), "not_run": list(self.not_run)}

    @staticmethod
    def from_plain(data: Any, file: str | Path | None = None) -> "VerifyRecord":
        """A record read back; UsageError naming the file and the field at fault."""
        if not isinstance(data, dict) or data.get("kind") != report.VERIFY_KIND:
            raise UsageError(f"not a verify record (kind {_kind(data)!r})", file=file)
        field = "meta"
        try:
            meta = dict(data["meta"])
            rows = []
            for index, row in enumerate(data["rows"]):
                field = f"rows[{index}]"
                rows.append(VerifyRow.from_plain(row))
            field = "errors"
            errors = tuple(str(e) for e in data["errors"])
            kernels = data.get("kernels")
            field = "not_run"
            not_run = tuple(str(e) for e in data.get("not_run", ()))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise UsageError(f"malformed verify record: {type(err).__name__}: {err}", file=file,
                             field=field) from None
        return VerifyRecord(meta, tuple(rows), errors, None if kernels is None else tuple(kernels), not_run)


def _kind(data: Any) -> Any:
    return data.get("kind") if isinstance(data, dict) else type(data).__name__


def verify_record(rows: Iterable[VerifyRow], errors: Iterable[str], *, suite: str,
                  shard: Any = None, kernels: Iterable[dict] | None = None,
                  command: str = "verify", not_run: Iterable[str] = (),
                  implementations: Mapping[str, dict] | None = None) -> VerifyRecord:
    """A run's record; `shard` is a parallel.Shard (None: the whole selection, "1/1");
    `implementations` (--impl, --against): name -> what `implementation_info` says of it."""
    meta = report.record_meta(command) | {
        "shard": parallel.Shard.label(shard), "suite_sha256": suite}
    if implementations:
        meta["implementations"] = dict(implementations)
    return VerifyRecord(meta, tuple(rows), tuple(errors), None if kernels is None else tuple(kernels),
                        tuple(not_run))


def implementation_info(impl: Implementation) -> dict[str, Any]:
    """What a record keeps of an implementation: its versions() and why it cannot run here (if so)."""
    return {"versions": impl.versions(), "unavailable": impl.unavailable(), "doc": impl.doc}


def load_verify(path: str | Path) -> VerifyRecord:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"cannot read a verify record: {err}", file=report.portable(path)) from None
    return VerifyRecord.from_plain(data, report.portable(path))


def merge_verify(paths: Iterable[str | Path]) -> VerifyRecord:
    """One record from the records of every shard of one run, rows in input order; a duplicate,
    missing or foreign shard is a UsageError listing each problem. meta.shards says what it joined."""
    paths = list(paths)
    records = [load_verify(p) for p in paths]
    labels = [report.portable(p) for p in paths]
    problems = report.check_shards([r.meta for r in records], labels)
    if problems:
        raise UsageError("cannot merge: " + "; ".join(problems))
    meta = report.record_meta("report --merge") | {
        "shard": "1/1", "suite_sha256": records[0].meta["suite_sha256"],
        "shards": [r.meta["shard"] for r in records], "merged_from": [r.meta for r in records]}
    kernels = [k for r in records for k in (r.kernels or ())]
    return VerifyRecord(meta, tuple(row for r in records for row in r.rows),
                        tuple(e for r in records for e in r.errors),
                        tuple(kernels) if any(r.kernels is not None for r in records) else None,
                        tuple(e for r in records for e in r.not_run))
