"""Running verify: the bundles of a selection, each case through the one evaluator
(kdtr.impl.evaluate), rows and a record; `run_verify` is the library's entry point and
`verify_item` the per-bundle call (the pytest plugin's)."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..scaleout import parallel
from ..records import report
from ..bundle.case import GOLDEN, load_case, reference_outputs
from ..errors import DeviceError, KdtreeError, UsageError
from .invariance import with_invariance
from ..ops.numerics import gates, takes_gate
from ..bundle.walk import files_below
from ..ops.base import Case, Op, Tolerance
from .options import Options
from .record import (DEVICE_REFERENCE, REFERENCE, VerifyRecord, VerifyRow, bundle_prints, implementation_info,
                     shard_key, suite_digest, verify_record)
from .tolerance import loosened, tolerances

if TYPE_CHECKING:
    from ..ops.compare import Gate
    from ..impl import ImplRef, Implementation


def find_bundles(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; directories expanded to every *.kdtr below them (linked subfolders followed,
    each folder once), sorted; a bundle named twice (`verify goldens goldens`, a file and its
    folder) once. A *.kdtr that is not a regular file (a dangling link, a FIFO) is an error, never
    silently skipped, and so is an empty path (it would read as the current folder). The one finder
    of `kdtree verify` and `pytest --kdtree`."""
    seen: set[Path] = set()
    found: list[Path] = []
    for candidate in _candidates(paths):
        key = candidate.resolve()
        if key not in seen:
            seen.add(key)
            found.append(candidate)
    return found


def _candidates(paths: Iterable[str | Path]) -> Iterator[Path]:
    for raw in paths:
        if not str(raw).strip():
            raise UsageError(f"{str(raw)!r}: an empty path names no bundle (the current folder is '.')")
        path = Path(raw)
        candidates = files_below(path, "*.kdtr") if path.is_dir() else [path]
        for candidate in candidates:
            if not candidate.exists():
                raise UsageError(f"{candidate}: no such file or directory"
                                 + (" (a dangling symbolic link)" if candidate.is_symlink() else ""))
            if not candidate.is_file():
                raise UsageError(f"{candidate}: not a regular file (a FIFO, socket or device)")
            yield candidate


def _ours(options: Options, kernel: str | None) -> Implementation:
    """The built-in implementation the backend names (`kernel`: one of our kernels forced, built with
    the knobs --define gives it)."""
    from ..impl.builtin import builtin, cuda_build

    return cuda_build(kernel=kernel, defines=options.defines_for(kernel)) if kernel is not None \
        else builtin(options.backend)


def _captured(name: str, stored: Mapping[str, np.ndarray]) -> Implementation:
    """A bundle's captured outputs as the implementation that gave them (compared, never run)."""
    from ..impl import Implementation, Serves
    from ..impl.base import HOST

    return Implementation(name, tuple(Serves(n) for n in _op_names()),
                          lambda op, variant, inputs, params: lambda: dict(stored), device=HOST)


def _op_names() -> tuple[str, ...]:
    from ..ops import op_names

    return op_names()


def check_case(op: Op, variant: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
               params: Mapping[str, Any], tols: Mapping[str, Tolerance], options: Options,
               impl: Implementation | None = None, stored: Mapping[str, np.ndarray] | None = None,
               stored_by: str | None = None, case_gates: Callable[[], Mapping[str, Gate]] | None = None,
               **row: Any) -> tuple[VerifyRow, dict[str, np.ndarray] | None]:
    """Evaluate the backend (or `impl`) on one case (kdtr.impl.evaluate: twice for the determinism
    probe) and compare every output it gives with `expected`; `stored` compares those captured
    outputs (of `stored_by`) instead of running anything. An implementation other than the
    reference and our kernels is held to the case's gate (kdtr.ops.numerics; `case_gates` gives it, so
    that several implementations of one case share one computation). The row and the outputs that
    were compared (None: nothing came back). Our backend unable to run here stops the run (DeviceError)."""
    from ..impl import CaseData, Status, evaluate

    config = op.describe(variant, inputs, params)
    ours = impl is None and stored is None
    if ours:
        kernel = options.kernel_for(op, variant)
        if kernel is not None:
            config = config | {"kernel": options.kernel_label(kernel)}
        impl = _ours(options, kernel)
    elif stored is not None:
        impl = _captured(stored_by or "unknown", stored)
    name = options.backend if ours else impl.name
    base = dict(op=op.name, variant=variant, backend=name, config=config, impl=None if ours else name,
                captured=stored is not None, **row)
    overridden = options.atol is not None or options.rtol is not None    # the user's bound, alone
    gated = {}
    if takes_gate(name) and not overridden:                                  # docs/numerics.md
        gated = case_gates() if case_gates else gates(op, variant, inputs, params, expected, tols)
    outcome = evaluate(impl, CaseData(op, variant, inputs, params), expected, tols, gates=gated,
                       determinism=options.determinism and stored is None, timeout_s=options.case_timeout)
    if ours and outcome.status is Status.SKIPPED:
        raise DeviceError(outcome.reason)          # no GPU for the cuda backend: the run cannot go on
    return verify_row(outcome, base, op, variant, tols, options, who=row.get("case") if ours else name), \
        outcome.outputs


def verify_row(outcome, base: Mapping[str, Any], op: Op, variant: str, tols: Mapping[str, Tolerance],
               options: Options, who: str | None) -> VerifyRow:
    """An Outcome as a verify row: compared outputs (worst elements of passing ones dropped unless
    --keep-worst), or the error (prefixed with `who`: the case for our backend, the implementation
    otherwise), or the reason it was skipped."""
    from ..impl import Status

    if outcome.checks:
        checks = outcome.checks if options.keep_worst else tuple(
            c if not c.passed else replace(c, worst=()) for c in outcome.checks)
        return VerifyRow(passed=outcome.passed, outputs=checks, deterministic=outcome.deterministic,
                         seconds=outcome.seconds,
                         loosened=loosened(op, variant, tols, options, ours=base["impl"] is None or base["captured"]),
                         not_compared=outcome.not_compared, **base)
    skipped = outcome.reason if outcome.status is Status.SKIPPED else None
    error = None if skipped else f"{who}: {outcome.reason}"
    return VerifyRow(passed=False, error=error, skipped=skipped, seconds=outcome.seconds, **base)


def with_parity(row: VerifyRow, ours: Mapping[str, np.ndarray] | None, against: Implementation, op: Op,
                variant: str, inputs, params, expected, options: Options | None = None) -> VerifyRow:
    """`row` (ours) with the parity of `against` on the same inputs (kdtr.impl.parity, reference: the
    expected outputs), or the reason there is none."""
    from ..impl import CaseData, Status, evaluate, parity

    if not against.serves(op.name, variant):
        return replace(row, parity={"theirs": against.name, "reason": f"{against.name} does not serve "
                                                                        f"{op.name}/{variant}"})
    if ours is None:
        return replace(row, parity={"theirs": against.name, "reason": f"{row.backend} gave no outputs"})
    theirs = evaluate(against, CaseData(op, variant, inputs, params), expected,
                      timeout_s=options.case_timeout if options else None)
    if theirs.outputs is None:
        why = (f"skipped: {theirs.reason}" if theirs.status is Status.SKIPPED
               else f"failed: {against.name}: {theirs.reason}")
        return replace(row, parity={"theirs": against.name, "reason": why})
    found = parity(op, variant, ours, theirs.outputs, ours_name=row.backend, theirs_name=against.name,
                   reference=expected, inputs=inputs, params=params)
    return replace(row, parity=found.to_json())


def trial_seed(seed: int, trial: int) -> int:
    """Fresh, reproducible seeds for re-runs: never the golden's own seed."""
    return (int(seed) * 1_000_003 + 7919 * trial) % (1 << 31)


def verify_bundle(path: str | Path, options: Options,
                  impls: Sequence[Implementation] | None = None) -> list[VerifyRow]:
    """Rows for one bundle: its golden, then `options.trials` fresh-input trials, each run by the
    backend (with `options.against` beside it) or by each of `options.impls` (or `impls`, resolved
    implementations given directly) that serves the op and variant (none: no rows). A bundle without a golden is compared with the reference computed here;
    captured outputs are a row of their own, the capturing implementation's, against it. Trials and
    bundles without a golden take the float64 device reference on a GPU (see reference_outputs)."""
    loaded = load_case(path)
    bundle, op, variant, params, case = loaded.bundle, loaded.op, loaded.variant, loaded.params, loaded.case
    given = options.implementations() if impls is None else tuple(impls)
    impls = [impl for impl in given if impl.serves(op.name, variant)]
    if given and not impls:
        return []
    inputs, expected, how = loaded.inputs, loaded.expected, GOLDEN
    if loaded.source != GOLDEN:
        expected, on_device = reference_outputs(op, variant, inputs, params)
        how = DEVICE_REFERENCE if on_device else REFERENCE
    tols = tolerances(op, variant, bundle.meta.get("tolerance"), options, file=path, ours=not given)
    file = report.portable(path)
    against = options.against.load() if options.against else None

    def rows_for(inputs, expected, params, **row) -> list[VerifyRow]:
        case_gates = functools.cache(functools.partial(gates, op, variant, inputs, params, expected, tols))
        if impls:
            return [with_invariance(*check_case(op, variant, inputs, expected, params, tols, options, impl,
                                                case_gates=case_gates, **row),
                                    op, variant, inputs, params, options, impl) for impl in impls]
        got, ours = check_case(op, variant, inputs, expected, params, tols, options, case_gates=case_gates, **row)
        got = with_invariance(got, ours, op, variant, inputs, params, options)
        if against is not None:
            got = with_parity(got, ours, against, op, variant, inputs, params, expected, options)
        return [got]

    rows = rows_for(inputs, expected, params, case=case, file=file, seed=bundle.meta.get("seed"), expected_from=how)
    if loaded.captured_by is not None:
        rows.append(check_case(op, variant, inputs, expected, params, tols, options, stored=loaded.expected,
                               stored_by=loaded.captured_by, case=case, file=file, expected_from=how)[0])
    case_params, seed = bundle.meta.get("case_params"), bundle.meta.get("seed")
    inline = bundle.meta.get("inline_inputs")
    if options.trials and inline:             # gen-refs marks them: the params do not give their shapes
        rows.append(VerifyRow(case=case, file=file, op=op.name, variant=variant, backend=options.backend,
                              config=op.describe(variant, inputs, params), passed=False, trial=1,
                              skipped=f"no trials: its inputs ({', '.join(map(str, inline))}) were given "
                                      "inline, and its generator cannot draw others in their shapes"))
    elif options.trials and isinstance(case_params, dict) and isinstance(seed, int):
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
    """How many trials' fresh inputs verify generates at once (kdtr.scaleout.parallel.threaded_map): one
    per usable core, no more than the trials, and no more than the op's memory estimate for the
    case fits in gen-refs' bound (refs.default_mem_limit: KDTREE_MEM_LIMIT, else half of
    MemAvailable) beside the loaded bundle's own inputs (no estimate: small, cores only); 1 (each
    in turn, in this thread, as before) where the estimate fails: the generator says why, in turn."""
    from ..bundle.refs import default_mem_limit

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



def verify_item(path: str | Path, impl: Implementation | ImplRef | None, options: Options = Options()) -> list[VerifyRow]:
    """One bundle verified by one resolved implementation (None: `options.backend`) under `options`:
    its rows, with the comparison, tolerances and row fields of `kdtree verify` (no rows: the
    implementation does not serve the bundle's op and variant). A bad bundle raises its BundleError."""
    if impl is None:
        return verify_bundle(path, replace(options, impls=()))
    return verify_bundle(path, options, impls=(impl.load() if hasattr(impl, "load") else impl,))


@dataclass(frozen=True)
class Selection:
    """Which bundles a run verifies: files or folders (every *.kdtr below them), `-k` (a name
    pattern), one shard of them (a parallel.Shard; None: all), and the GPUs to spread them over
    (--devices: one worker process each; None: in this process)."""

    paths: tuple[str | Path, ...] = ("goldens",)
    pattern: str | None = None
    shard: Any = None
    devices: tuple[int, ...] | None = None

    def bundles(self) -> tuple[list[Path], list[Path]]:
        """Every bundle selected (before sharding: the suite digest covers them all) and this shard's."""
        selected = find_bundles(self.paths)
        if self.pattern:
            from ..bundle.spec import name_matches    # YAML's import is not free: only for -k

            selected = [f for f in selected if name_matches(f.stem, self.pattern)]
        return selected, parallel.shard_items(selected, shard_key, self.shard)

    def repeats(self) -> int:
        """How many bundles the paths name more than once (each is verified once)."""
        named = [candidate.resolve() for candidate in _candidates(self.paths)]     # one walk, not two
        return len(named) - len(set(named))

    def nothing_selected(self) -> KdtreeError:
        return KdtreeError("no bundles to verify" + (f" match -k {self.pattern!r}" if self.pattern else
                                                     " in this shard" if self.shard else
                                                     " (run `kdtree gen-refs` first?)"))


@dataclass(frozen=True)
class BundleDone:
    """What `run_verify` reports to its progress callback as each bundle finishes."""

    file: Path
    rows: tuple[VerifyRow, ...]
    problem: str | None        # the bundle could not be verified (a bad bundle, a device error)
    not_run: str | None        # no given implementation serves it
    done: int
    total: int


class NothingRan(KdtreeError):
    """Nothing was verified (--impl: every row skipped or no bundle served; --against: no case
    compared): a skip is not a pass. The run's record rides along, still worth writing."""

    def __init__(self, message: str, record: VerifyRecord):
        super().__init__(message)
        self.record = record


def run_verify(selection: Selection, options: Options = Options(),
               progress: Callable[[BundleDone], None] | None = None) -> VerifyRecord:
    """Verify a selection of bundles (see Selection) under `options`: every bundle's rows, the
    bundles that could not be read (the record's errors), those no given implementation serves,
    and (cuda, in-process) the kernels loaded. KdtreeError when the selection holds no bundle (an
    empty shard of a non-empty one gives an empty record), DeviceError up front for the cuda
    backend without a GPU, NothingRan (with the record) when nothing was verified."""
    selected, files = selection.bundles()
    if not selected:
        raise selection.nothing_selected()
    devices = selection.devices
    if options.backend == "cuda" and files and not options.impls:
        from ..runtime.device import require_gpu

        require_gpu()                      # one line and exit 2 up front, not one per bundle or worker
    if devices:
        groups = parallel.balance(files, lambda f: f.stat().st_size, len(devices))
        outcomes: Iterable = parallel.map_on_devices(devices, groups, functools.partial(verify_file, options=options),
                                                     crashed)      # (file, outcome) as they finish
    else:
        outcomes = ((file, verify_file(file, options)) for file in files)
    rows: list[VerifyRow] = []
    errors: list[str] = []
    not_run: list[str] = []
    names = ", ".join(ref.name for ref in options.impls) or options.backend
    for done, (file, (found, problem)) in enumerate(outcomes, start=1):
        rows.extend(found)
        unserved = None
        if problem:
            errors.append(problem)
        elif options.impls and not found:
            unserved = f"{report.portable(file)}: served by none of {names}"
            not_run.append(unserved)
        if progress is not None:
            progress(BundleDone(Path(file), tuple(found), problem, unserved, done, len(files)))
    kernels = None
    if options.backend == "cuda" and not devices and not options.impls:
        from ..runtime.device import loaded_kernels

        kernels = loaded_kernels()
    refs = (*options.impls, *([options.against] if options.against else []))
    record = verify_record(rows, errors, suite=suite_digest(selected), shard=selection.shard, kernels=kernels,
                           not_run=not_run, implementations={r.name: implementation_info(r.load()) for r in refs},
                           bundles=bundle_prints(files))
    why = None if errors or not files else nothing_ran(record, options)     # an empty shard: its record
    if why:
        raise NothingRan(why, record)
    return record


def nothing_ran(record: VerifyRecord, options: Options) -> str | None:
    """Why a run verified nothing (--impl with nothing run, --against with nothing compared), or None."""
    rows = record.rows
    if options.impls and not any(r.skipped is None for r in rows):
        reasons = list(dict.fromkeys(r.skipped for r in rows)) or [
            f"no given implementation serves any of the {len(record.not_run)} bundles"]
        return "nothing ran: " + "; ".join(reasons)
    if options.against and rows and not any(r.parity and not r.parity.get("reason") for r in rows):
        reasons = dict.fromkeys(r.parity["reason"] for r in rows if r.parity)
        return f"--against {options.against.spec}: compared no case: " + "; ".join(reasons)
    return None
