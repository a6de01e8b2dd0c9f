"""Two bench records compared row by row: same, faster, slower or ambiguous against the noise."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError
from .record import BenchRecord
from .stats import Timing


def exit_status(record: BenchRecord) -> int:
    """1 when our implementation or one under test (--impl) failed its check (or could not run, or
    crashed) in any case, or a case errored; else 0 (a baseline of the op's that fails is its row's
    business)."""
    if record.errors:
        return 1
    under_test = (r for r in record.rows if r.primary or "implementation" in (r.extra or {}))
    return 1 if any(r.check_passed is False for r in under_test) else 0


@dataclass(frozen=True)
class CompareRow:
    case: str
    op: str
    variant: str
    impl: str
    mode: str
    primary: bool
    old_ms: float | None
    new_ms: float | None
    ratio: float | None            # new / old
    noise: float | None            # relative: the two medians' CI half-widths, added
    verdict: str                   # faster | slower | same | ambiguous | failed | untimed | missing | new
    regression: bool


@dataclass(frozen=True)
class Comparison:
    rows: tuple[CompareRow, ...]
    threshold: float
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> tuple[CompareRow, ...]:
        return tuple(r for r in self.rows if r.regression)

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)


def judge(old: Timing, new: Timing, threshold: float) -> tuple[str, float, float, bool]:
    """(verdict, new/old, noise, slower beyond the threshold). "same" within the noise (the two CIs
    overlap); "ambiguous" when a within-noise difference could still hide more than the threshold."""
    ratio = new.median / old.median if old.median > 0 else math.inf
    noise = old.rel_ci + new.rel_ci
    change = ratio - 1
    if abs(change) <= noise:
        return ("ambiguous" if noise > threshold else "same"), ratio, noise, False
    verdict = "slower" if change > 0 else "faster"
    return verdict, ratio, noise, verdict == "slower" and change > threshold


def compare_records(old: BenchRecord, new: BenchRecord, threshold: float = 0.10) -> Comparison:
    """Match rows on case, op, variant, implementation, mode and every parameter; judge each pair
    against the measured noise. Regressions (which fail `kdtree bench --compare`) are primary rows
    slower by more than `threshold` beyond the noise, or whose check passed before and fails now."""
    if not threshold > 0:
        raise UsageError(f"the regression threshold must be > 0, got {threshold}")
    notes = []
    old_gpu = (old.meta.get("device") or {}).get("gpu")
    new_gpu = (new.meta.get("device") or {}).get("gpu")
    if old_gpu != new_gpu:
        notes.append(f"different GPUs: {old_gpu} vs {new_gpu}")
    if old.meta.get("ran_as") != new.meta.get("ran_as"):       # KDTREE_GPU: other kernels chosen
        notes.append(f"run as different GPUs: {old.meta.get('ran_as') or 'itself'} vs {new.meta.get('ran_as') or 'itself'}")
    if old.ceilings and new.ceilings:
        for name in ("hbm_read_gbps", "hbm_copy_gbps", "bf16_mma_tflops", "fp32_fma_tflops"):
            a, b = getattr(old.ceilings, name), getattr(new.ceilings, name)
            if a > 0 and abs(b / a - 1) > threshold:
                notes.append(f"ceiling {name} moved {100 * (b / a - 1):+.1f}% ({a:.4g} -> {b:.4g}): "
                             "the machine differs, not only the code")
    olds = {r.key: r for r in old.rows}
    news = {r.key: r for r in new.rows}
    out = []
    for key, n in news.items():
        o = olds.get(key)
        base = dict(case=n.case, op=n.op, variant=n.variant, impl=n.impl, mode=n.mode, primary=n.primary)
        if o is None:
            out.append(CompareRow(**base, old_ms=None, new_ms=n.timing.median if n.timing else None,
                                  ratio=None, noise=None, verdict="new", regression=False))
            continue
        if n.check_passed is False and o.check_passed is not False:
            out.append(CompareRow(**base, old_ms=o.timing.median if o.timing else None, new_ms=None,
                                  ratio=None, noise=None, verdict="failed", regression=n.primary))
            continue
        if o.timing is None or n.timing is None:
            out.append(CompareRow(**base, old_ms=o.timing.median if o.timing else None,
                                  new_ms=n.timing.median if n.timing else None, ratio=None, noise=None,
                                  verdict="untimed", regression=False))
            continue
        verdict, ratio, noise, slower = judge(o.timing, n.timing, threshold)
        out.append(CompareRow(**base, old_ms=o.timing.median, new_ms=n.timing.median, ratio=ratio,
                              noise=noise, verdict=verdict, regression=slower and n.primary))
    for key, o in olds.items():
        if key not in news:
            out.append(CompareRow(case=o.case, op=o.op, variant=o.variant, impl=o.impl, mode=o.mode,
                                  primary=o.primary, old_ms=o.timing.median if o.timing else None,
                                  new_ms=None, ratio=None, noise=None, verdict="missing", regression=False))
    return Comparison(tuple(out), threshold, tuple(notes))
