"""Cases to checked outputs to timed rows: the case runner and `bench_items`."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from ..errors import reason
from ..runtime.gpu_identity import with_ceilings
from ..impl import CaseData, Implementation, Status, baselines
from ..impl.isolation import WorkerDied
from ..impl.rotation import prepare_sets
from .cases import BenchItem
from .plan import TimingPlan
from .ceilings import Ceilings, gpu_clocks, measure_ceilings
from .record import (TIME_LIMIT_SKIP, BenchRecord, BenchRow, _jsonable, bench_meta, settings_dict, with_figures,
                     with_speedups)
from .sanity import sanity_rows
from .schedule import Sampler, back_to_back, interleave
from ..impl.builds import KernelBuild
from .settings import MODES, BenchSettings, Progress
from .stats import Timing, agree
from .telemetry import watching
from .timers import DEFAULT_L2_BYTES, DeviceTimer, HostTimer, rotation_sets


UNCAPTURABLE = "its graph capture failed in an earlier case of this run; timed eagerly, not captured again"


class _Env:
    """What one run holds: the device, the timers, the ceilings."""

    def __init__(self, settings: BenchSettings):
        from ..impl.backends import resolve_backend
        from ..runtime.device import gpu_available

        backend = resolve_backend(settings.backend)
        if backend not in ("cuda", "torch"):
            raise UsageError(f"bench runs the cuda or torch backend, not {backend!r}")
        self.gpu = gpu_available()
        if backend == "cuda" and not self.gpu:
            from ..runtime.device import require_gpu

            require_gpu()
        self.primary = backend
        self.device = "cuda" if self.gpu else "cpu"
        self.ceilings: Ceilings | None = None
        # implementations whose capture failed once: not captured again this run, since on torch 2.11
        # a failed capture kept its private memory pool for good (76 GiB reserved after twelve cases)
        self.uncapturable: set[str] = set()
        self.watch = None                 # telemetry's read (telemetry.watching), set for the run
        if self.gpu:
            import torch

            props = torch.cuda.get_device_properties(0)
            self.timer: Any = DeviceTimer(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
            self.host_timer = HostTimer(DeviceTimer.sync)
            self.modes = ("hot", "cold") if settings.mode == "both" else (settings.mode,)
        else:
            self.timer = self.host_timer = HostTimer()
            self.modes = ("host",)

    def sync(self) -> None:
        if self.gpu:
            DeviceTimer.sync()

    def cleanup(self) -> None:
        gc.collect()
        if self.gpu:
            import torch

            torch.cuda.empty_cache()

    def held(self) -> list[float] | None:
        """[allocated, reserved] GiB of PyTorch's allocator now (None without a GPU): kept per case
        in the record's meta, so memory one case leaves to the next shows where it is left."""
        if not self.gpu:
            return None
        import torch

        return [round(torch.cuda.memory_allocated() / 2**30, 2), round(torch.cuda.memory_reserved() / 2**30, 2)]


def _is_oom(err: BaseException | str) -> bool:
    """An out-of-memory error (or the reason one gave)."""
    if isinstance(err, str):
        return "out of memory" in err.lower()
    try:
        import torch

        if isinstance(err, getattr(torch, "OutOfMemoryError", ())):
            return True
    except ImportError:
        pass
    return "out of memory" in str(err).lower()


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    from ..dtypes import to_numpy

    return to_numpy(value)


def check_note(outcome) -> str:
    """What a passing evaluation compared ("checked out (rel. L2 3e-07), lse; it gives no ..."), or
    why it did not pass (kdtr.impl.Outcome.reason)."""
    if not outcome.passed:
        return outcome.reason
    checked = ", ".join(c.name if c.tolerance.exact else f"{c.name} (rel. L2 {c.rel_l2:.2g})" for c in outcome.checks)
    gives_no = f"; it gives no {', '.join(outcome.not_compared)}" if outcome.not_compared else ""
    return f"checked {checked}{gives_no}"


def _still_within(op, got: Mapping[str, np.ndarray], expected, tolerances) -> str | None:
    """Why outputs read back after timing miss the tolerances (None: they keep them)."""
    from ..ops.compare import compare_output

    failures = [f"{name}: {check.reason}" for name in got
                for check in (compare_output(name, got[name], expected[name], tolerances[name]),) if not check.passed]
    return "; ".join(failures) or None


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


@dataclass(frozen=True)
class _Ours:
    """One of our implementations made ready: its row (not yet timed), its sampler (None: not
    timed), the check of the timed calls' outputs, and the outputs it was checked with."""

    row: BenchRow
    sampler: Sampler | None
    after: Callable[[BenchRow], BenchRow]
    got: dict[str, np.ndarray] | None
    build: KernelBuild | None = None


def _against(build: KernelBuild, got: Mapping[str, np.ndarray],
             earlier: Sequence[tuple[KernelBuild, Mapping[str, np.ndarray]]], note: str) -> tuple[bool, str]:
    """A forced build's outputs against the builds checked before it, on the same inputs: another
    build of the same kernel (a knob build) must give the same bytes, or it fails; a different
    kernel, or a build whose launch knobs differ (a split count changes the merge's rounding), may
    round differently within the op's tolerances, so the check only says whether it gives the same
    bytes as the first build."""
    sibling = next(((b, g) for b, g in earlier if b.name == build.name and not b.launch and not build.launch),
                   None)
    if sibling is not None:
        differ = _differing(got, sibling[1])
        if differ:
            return False, f"{note}; differs bit for bit from {sibling[0].label}: {differ}"
        return True, f"{note}; bit for bit equal to {sibling[0].label}"
    if earlier:
        first, outputs = earlier[0]
        differ = _differing(got, outputs)
        other = "another launch" if first.name == build.name else "another kernel"
        return True, note + (f"; differs bit for bit from {first.label} ({other}): {differ}" if differ
                             else f"; bit for bit equal to {first.label}")
    return True, note


def _differing(got: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray]) -> str:
    """The outputs whose bytes differ, with how many elements: "out (12 of 4096 elements)"; "" when none."""
    parts = []
    for name in got:
        a, b = np.ascontiguousarray(got[name]), np.ascontiguousarray(other[name])
        if a.shape != b.shape or a.dtype != b.dtype:
            parts.append(f"{name} ({a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)})")
            continue
        if a.size == 0:
            continue
        per_element = (a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1)).any(axis=1)
        if per_element.any():
            parts.append(f"{name} ({int(per_element.sum())} of {a.size} elements)")
    return ", ".join(parts)


class _CaseRunner:
    """Runs every implementation of one case, in each mode, and builds its rows."""

    def __init__(self, env: _Env, settings: BenchSettings, item: BenchItem, progress: Callable[[str], None],
                 deadline: float | None):
        from ..ops import get_op

        self.env, self.settings, self.item, self.deadline = env, settings, item, deadline
        self.progress = lambda what: progress(f"{item.op} {what}")
        self.op = get_op(item.op)
        self.builds = [b for b in settings.kernels if b.name in self.op.cuda_kernels(item.variant)]
        self.plans: dict[str, TimingPlan] = {}      # mode -> how every row of the case was timed

    def late(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def run(self) -> list[BenchRow]:
        from ..impl import backends

        op, item, env = self.op, self.item, self.env
        self.progress(f"{item.name}: inputs")
        inputs, params = item.load()
        self.inputs, self.params = inputs, params
        cost = op.cost(item.variant, inputs, params)
        extra = dict(op.bench_extra(item.variant, inputs, params))
        # which of our kernels the launch picks for this shape (a GPU run only: without one nothing
        # of ours runs, and the choice would name a kernel by this host's defaults)
        kernel = op.kernel_choice(item.variant, inputs, params) if env.gpu else None
        if kernel is not None:
            extra["kernel"] = kernel
            grid = op.launch_grid(item.variant, inputs, params, kernel)
            if grid is not None:
                extra["grid"] = list(grid)
        self.base = dict(case=item.name, op=op.name, variant=item.variant,
                         config=op.describe(item.variant, inputs, params), flops=float(cost.flops),
                         bytes=float(cost.bytes), compute_unit=op.compute_unit(item.variant),
                         params=_jsonable(item.params), extra=_jsonable(extra))
        self.device_inputs = backends.upload(inputs, env.device)
        self.progress(f"{item.name}: reference")
        expected = op.bench_reference(item.variant, self.device_inputs, params) if env.gpu else None
        self.expected = ({n: _to_numpy(t) for n, t in expected.items()} if expected is not None
                         else op.reference(item.variant, inputs, params))
        del expected
        self.tolerances = op.tolerances(item.variant)
        self.baseline_tolerances = op.baseline_tolerances(item.variant)
        self.baselines = baselines(op, item.variant, inputs, params)
        rows: list[BenchRow] = []
        for mode in env.modes:
            rows.extend(with_speedups(self._mode(mode)))
        return [with_figures(r, env.ceilings) for r in rows]

    def _row(self, impl: str, mode: str, primary: bool, **kw: Any) -> BenchRow:
        return BenchRow(impl=impl, mode=mode, primary=primary, **{**self.base, **kw})

    def _wanted(self, baseline: Implementation) -> bool:
        role = baseline.bench
        if baseline.name == self.env.primary or (role.backend is not None and role.backend == self.env.primary):
            return False                # the implementation under test is not its own baseline
        if self.settings.baselines is None:
            return role.default
        return baseline.name in self.settings.baselines

    def _mode(self, mode: str) -> list[BenchRow]:
        """Check and prepare every implementation (each forced kernel build, or the launch's own
        choice), then time them all in interleaved rounds (ours a second time among them with
        --repeat) and build the rows."""
        ours: list[_Ours] = []
        for build in self.builds or (None,):
            earlier = [(o.build, o.got) for o in ours if o.got is not None]
            ours.append(self._primary(mode, build, earlier))
        entries: list[tuple[BenchRow, Sampler | None]] = [(o.row, o.sampler) for o in ours]
        for baseline in self.baselines:
            if self._wanted(baseline):
                entries.append(self._baseline(baseline, mode, skip=baseline.unavailable(), clock=baseline.bench.clock,
                                              slow_setup=baseline.bench.slow_setup))
        for ref in self.settings.impls:
            impl = ref.load()
            if impl.serves(self.op.name, self.item.variant):
                entries.append(self._implementation(impl, mode))
        slots = [i for i, (_, sampler) in enumerate(entries) if sampler is not None]
        again = [i for i, o in enumerate(ours) if o.sampler is not None] if self.settings.repeat else []
        samplers = [entries[i][1] for i in slots] + [ours[i].sampler for i in again]
        names = ", ".join([entries[i][0].impl for i in slots] + [f"{ours[i].row.impl} again" for i in again])
        self.progress(f"{self.item.name}: rounds ({mode}): {names}")
        results = interleave(samplers, self.settings.timing, deadline=self.deadline, telemetry=self.env.watch,
                             progress=lambda r: self.progress(f"{self.item.name}: round {r} ({mode})"))
        alone = [None] * len(slots)
        if self.settings.back_to_back and len(slots) > 1:
            self.progress(f"{self.item.name}: back to back ({mode})")
            alone = back_to_back(samplers[:len(slots)], self.settings.timing, deadline=self.deadline,
                                 telemetry=self.env.watch)
        rows = [row for row, _ in entries]
        for slot, result, single in zip(slots, results, alone):
            rows[slot] = self._timed(rows[slot], result)
            if isinstance(single, Timing) and rows[slot].timing is not None:
                rows[slot] = replace(rows[slot], alone=single)
        repeats = dict(zip(again, results[len(slots):]))
        for i, o in enumerate(ours):
            if o.sampler is None or rows[i].timing is None:
                continue
            rows[i] = o.after(rows[i])
            second = repeats.get(i)
            if second is None or rows[i].timing is None:      # None: the timed calls' outputs failed
                continue
            if isinstance(second, Exception):
                rows[i] = replace(rows[i], check=f"{rows[i].check}; repeat failed: {reason(second)}")
            else:
                rows[i] = replace(rows[i], repeat=second, repeat_agrees=agree(rows[i].timing, second))
        del entries, samplers, ours
        self.env.cleanup()
        return rows

    def _timed(self, row: BenchRow, result: Timing | Exception) -> BenchRow:
        if not isinstance(result, Exception):
            return replace(row, timing=result)
        why = reason(result)
        if _is_oom(result):
            return replace(row, skip=f"out of memory while timing: {why}")
        if isinstance(result, WorkerDied):          # the implementation crashed its worker while timed
            return replace(row, check_passed=False, check=f"{row.check}; crashed while timed: {why}")
        return replace(row, check=f"{row.check}; timing failed: {why}")

    def _rotation_count(self, mode: str, outputs: Mapping[str, Any] | None) -> int:
        """Input sets to rotate through in this case (1: flush the L2 before each one-call sample):
        the case's plan where one is set, else from its inputs' and outputs' bytes."""
        if mode != "cold" or not self.env.gpu:
            return 1
        if mode in self.plans:
            return self.plans[mode].sets
        written = outputs if outputs is not None else self.expected
        set_bytes = sum(t.nbytes for t in self.device_inputs.values()) + sum(t.nbytes for t in written.values())
        return rotation_sets(set_bytes, self.env.timer.flush_bytes)

    def _prepare(self, impl: Implementation, call, mode: str, timer, name: str) -> tuple[list, Sampler, str]:
        """`impl`'s checked `call` made ready to time by the case's plan for `mode` (the first
        implementation timed on the device sets it: kdtr/bench/plan.py): its own prepare makes the
        plan's other input sets and the timer takes the plan's calls a sample
        (kdtr.impl.rotation.prepare_sets), here or, for an isolated implementation, in its worker
        (`WorkerCall.time_in_worker`, the same function there); on the host clock, one set, the
        host's own way. Returns the calls made here (an isolated one's: its call alone), the sampler
        and why its sets fall short of the plan ("" where they do not)."""
        env = self.env
        plan = self.plans.get(mode)
        device = timer is env.timer and env.gpu
        known = device and name in env.uncapturable
        prepare = dict(sets=self._rotation_count(mode, getattr(call, "outputs", None)) if device else 1,
                       calls_per_sample=plan.calls_per_sample if device and plan is not None else None,
                       options=self.settings.timing, mode="cold" if mode == "cold" else "hot", graph=not known)
        in_worker = getattr(call, "time_in_worker", None)     # an isolated implementation's call:
        if in_worker is not None:                              # timed in its worker (kdtr.impl.isolation)
            sampler, made, short = in_worker(timer, **prepare)
            calls = [call]
        else:
            calls, sampler, short = prepare_sets(timer, impl, self.op, self.item.variant, self.device_inputs,
                                                 self.params, call, cleanup=env.cleanup, **prepare)
            made = len(calls)
        if known:
            sampler = replace(sampler, note="; ".join(n for n in (sampler.note, UNCAPTURABLE) if n))
        elif device and sampler.method != "graph":
            env.uncapturable.add(name)
        if device and plan is None:
            self.plans[mode] = TimingPlan(sampler.mode, made, sampler.calls_per_sample, sampler.method, name)
        return calls, sampler, short

    def _ours_impl(self, build: KernelBuild | None) -> Implementation:
        """The implementation under test as this run holds it: the backend (or `build`: a kernel
        forced by name, with its defines), on the run's device (the GPU was checked up front)."""
        from ..impl.builtin import builtin, cuda_build

        env = self.env
        impl = cuda_build(build.label, build.name, build.defines) if build else builtin(env.primary)
        return replace(impl, probe=lambda: None, device=env.device)

    def _primary(self, mode: str, build: KernelBuild | None = None,
                 earlier: Sequence[tuple[KernelBuild, dict[str, np.ndarray]]] = ()) -> _Ours:
        """Our implementation (the cuda backend, or the torch one; `build`: a kernel forced by name,
        with its defines), evaluated against the reference (kdtr.impl.evaluate) and against the
        `earlier` builds' outputs (`_against`), then its timing prepared. Returns its row (not yet
        timed), its sampler (None: it is not timed), what checks the timed calls' outputs once the
        rounds are done, and its checked outputs."""
        op, item, env = self.op, self.item, self.env
        impl = self._ours_impl(build)
        name = impl.name
        forced = dict(kernel=build.name, defines=dict(build.defines)) if build else {}
        unit = op.compute_unit(item.variant, build.name if build else self.base["extra"].get("kernel"))
        self.progress(f"{item.name}: {name} ({mode})")
        started = time.perf_counter()

        def untimed(**kw: Any) -> _Ours:
            return _Ours(self._row(name, mode, True, timing=None, compute_unit=unit, **forced, **kw), None,
                         lambda row: row, None, build)

        from ..impl import evaluate       # looked up per call: one evaluator (a test may watch it)

        outcome = evaluate(impl, CaseData(op, item.variant, self.inputs, self.params), self.expected,
                           self.tolerances, device_inputs=self.device_inputs)
        if outcome.status is Status.ERROR and outcome.error_type == "NotImplementedError":
            method = "run_cuda" if env.primary == "cuda" else "run_torch"
            return untimed(skip=f"{op.name}/{item.variant} has no {method} yet")
        if outcome.status is Status.ERROR:
            env.cleanup()
            return untimed(check_passed=False, check=f"failed: {outcome.reason}")
        passed, note, got = outcome.passed, check_note(outcome), outcome.outputs
        if passed and build is not None:
            passed, note = _against(build, got, earlier, note)
        if not passed:
            return untimed(check_passed=False, check=note)
        outputs = getattr(outcome.call, "outputs", None)         # the buffers our kernels write (cuda)
        try:
            calls, sampler, short = self._prepare(impl, outcome.call, mode, env.timer, name)
        except Exception as err:  # noqa: BLE001
            env.cleanup()
            return untimed(check_passed=True, check=f"{note}; timing failed: {reason(err)}")
        sets = [c.outputs for c in calls if getattr(c, "outputs", None) is not None]
        if short:
            note = f"{note}; {short}"
        row = self._row(name, mode, True, timing=None, check_passed=True, check=note,
                        setup_s=round(time.perf_counter() - started, 3), compute_unit=unit, **forced)

        def after(row: BenchRow) -> BenchRow:
            """The timed calls wrote every set: still the checked bytes?"""
            if outputs is None:
                return row
            for written in sets:
                now = {n: _to_numpy(t) for n, t in written.items()}
                if not all(_bitwise_equal(now[n], got[n]) for n in got):
                    why = _still_within(op, now, self.expected, self.tolerances)
                    row = replace(row, check=row.check + "; outputs of the timed calls differ bitwise from the "
                                  "checked call" + ("" if why is None else f" and fail: {why}"))
                    if why is not None:
                        row = replace(row, timing=None, repeat=None, repeat_agrees=None, check_passed=False)
                    break
            return row
        return _Ours(row, sampler, after, got, build)

    def _implementation(self, impl: Implementation, mode: str) -> tuple[BenchRow, Sampler | None]:
        """Another implementation (--impl) as a baseline: its prepare untimed, its call timed (a host
        clock where it runs on the CPU), its outputs held to the op's contract (docs/ops/) and its own
        tolerances; its versions() in the row's extra."""
        from ..impl.base import HOST, device_for

        device = None if impl.unavailable() else device_for(impl)
        device = "cpu" if device == HOST else device       # numpy in and out: a host call
        skip = None
        if device is not None and device != self.env.device:
            skip = f"runs on {device}; this run's inputs are on {self.env.device}"
        row, sampler = self._baseline(impl, mode, tolerances=self.tolerances, skip=skip,
                                      clock="host" if device == "cpu" else "device")
        return replace(row, extra={**row.extra, "implementation": {"versions": impl.versions(), "doc": impl.doc}}), \
            sampler

    def _baseline(self, impl: Implementation, mode: str, *, clock: str, skip: str | None = None,
                  slow_setup: bool = False, tolerances=None) -> tuple[BenchRow, Sampler | None]:
        """A baseline's row (not yet timed) and its sampler (None: skipped, failed or wrong): it is
        evaluated on the case's inputs against the reference (kdtr.impl.evaluate; `tolerances`,
        default the op's baseline ones) before it may be timed. An implementation that cannot run
        here is skipped with the reason."""
        env, item, name = self.env, self.item, impl.name
        if skip is None and self.settings.quick and slow_setup:
            skip = "--quick leaves out baselines with a slow setup (compilers)"
        if skip is None and clock == "device" and not env.gpu:
            skip = "needs a GPU (this run has none)"
        if skip is None and self.late():
            skip = TIME_LIMIT_SKIP
        row_mode = mode            # the group speedups are quoted in; timing.mode says "host" for host clocks
        if skip is not None:
            return self._row(name, row_mode, False, timing=None, skip=skip), None
        self.progress(f"{item.name}: {name} ({mode})")
        started = time.perf_counter()
        from ..impl import evaluate

        outcome = evaluate(impl, CaseData(self.op, item.variant, self.inputs, self.params), self.expected,
                           tolerances or self.baseline_tolerances, device_inputs=self.device_inputs)
        if outcome.status is Status.SKIPPED:
            return self._row(name, row_mode, False, timing=None, skip=outcome.reason), None
        if outcome.status is Status.ERROR:
            env.cleanup()
            if _is_oom(outcome.reason):
                return self._row(name, row_mode, False, timing=None, skip=f"out of memory: {outcome.reason}"), None
            return self._row(name, row_mode, False, timing=None, check_passed=False,
                             check=f"failed: {outcome.reason}"), None
        note = check_note(outcome)
        if not outcome.passed:
            return self._row(name, row_mode, False, timing=None, check_passed=False, check=note), None
        timer = env.host_timer if clock == "host" else env.timer
        try:
            _, sampler, short = self._prepare(impl, outcome.call, mode, timer, name)     # eager where capture fails
        except Exception as err:  # noqa: BLE001
            env.cleanup()
            return self._timed(self._row(name, row_mode, False, timing=None, check_passed=True, check=note), err), None
        if short:
            note = f"{note}; {short}"
        return (self._row(name, row_mode, False, timing=None, check_passed=True, check=note,
                          setup_s=round(time.perf_counter() - started, 3)), sampler)


def bench_items(items: Sequence[BenchItem], settings: BenchSettings = BenchSettings(), *,
                progress: Progress | None = None,
                on_partial: Callable[[BenchRecord], None] | None = None) -> BenchRecord:
    """Ceilings, sanity cases, then every case's implementations; one record. A case that fails
    becomes rows with the reason (or an entry in `errors`); the others go on."""
    settings.timing.check()
    if settings.mode not in MODES:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, got {settings.mode!r}")
    started = time.perf_counter()
    deadline = started + settings.time_limit_s if settings.time_limit_s else None
    env = _Env(settings)
    if settings.kernels and env.primary != "cuda":
        raise UsageError(f"--kernel and --define force CUDA kernels; they need the cuda backend, not {env.primary}")
    meta = bench_meta()
    done, total = 0, len(items) + (1 if env.gpu else 0)
    report = progress or (lambda what, done, total: None)
    rows: list[BenchRow] = []
    errors: list[str] = []
    not_run: list[str] = []
    sanity: list[BenchRow] = []
    case_seconds: dict[str, float] = {}
    plans: dict[str, dict[str, dict]] = {}     # "op/variant case" -> mode -> TimingPlan.to_plain()
    held: dict[str, list[float]] = {}           # "op/variant case" -> GiB allocated, reserved after it

    def record(complete: bool) -> BenchRecord:
        meta_now = dict(meta, seconds=round(time.perf_counter() - started, 3),
                        gpu=with_ceilings(meta["gpu"], env.ceilings))
        if held:
            meta_now["device_memory_gib"] = {"after_case": ["allocated", "reserved"], **held}
        if complete and env.gpu:
            meta_now["clocks_after"] = gpu_clocks()
        cut = any(r.skip == TIME_LIMIT_SKIP for r in rows)
        return BenchRecord(meta_now, settings_dict(settings, env.primary, env.modes, env.gpu), env.ceilings,
                           tuple(sanity), tuple(rows), tuple(errors), tuple(not_run),
                           complete=complete and not not_run and not cut, case_seconds=dict(case_seconds),
                           timing_plans=dict(plans))

    import torch

    with torch.no_grad(), watching(env.gpu, settings.lock_clocks) as watch:
        env.watch, meta["telemetry"] = watch.read, watch.info
        if env.gpu:
            report("ceilings", done, total)
            try:
                env.ceilings = measure_ceilings(env.timer)
            except Exception as err:  # noqa: BLE001 - the cases still run; no % figures then
                errors.append(f"ceilings: {reason(err)}")
                env.cleanup()
            if settings.sanity:
                report("sanity cases", done, total)
                try:
                    sanity.extend(sanity_rows(env, settings))
                except Exception as err:  # noqa: BLE001
                    errors.append(f"sanity cases: {reason(err)}")
                    env.cleanup()
            done += 1
        lost = None
        for index, item in enumerate(items):
            if deadline is not None and time.perf_counter() > deadline:
                not_run.append(f"{item.op}/{item.variant} {item.name}")
                done += 1
                continue
            runner = _CaseRunner(env, settings, item, lambda what: report(what, done, total), deadline)
            case_started = time.perf_counter()
            try:
                rows.extend(runner.run())
            except KeyboardInterrupt:
                raise
            except Exception as err:  # noqa: BLE001 - one failing case does not stop the others
                errors.append(f"{item.op}/{item.variant} {item.name} ({item.source}): "
                              f"{reason(err)}")
            finally:
                key = f"{item.op}/{item.variant} {item.name}"
                if runner.plans:
                    plans[key] = {mode: plan.to_plain() for mode, plan in runner.plans.items()}
                del runner
                case_seconds[key] = round(time.perf_counter() - case_started, 3)
                try:
                    env.cleanup()
                    if (now := env.held()) is not None:
                        held[key] = now
                except Exception as err:  # noqa: BLE001 - e.g. a kernel's illegal address, reported late
                    lost = f"{reason(err)}"
            if lost:                      # a sticky device error: nothing after it can be trusted
                errors.append(f"the device failed after {item.op}/{item.variant} {item.name} ({item.source}): "
                              f"{lost}; the remaining cases were not run")
                not_run.extend(f"{i.op}/{i.variant} {i.name}" for i in items[index + 1:])
                break
            done += 1
            report(f"{item.op} {item.name}", done, total)
            if on_partial is not None:
                on_partial(record(complete=False))
        if env.gpu and not lost:
            env.timer.release()
    return record(complete=True)
