"""The statistics of a timing: medians, their confidence intervals, agreement; the Timing summary."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import UsageError

Z95 = 1.96                        # two-sided 95% normal quantile, for the median's order-statistic CI


def median_ci(samples: Sequence[float]) -> tuple[float, float]:
    """A distribution-free ~95% confidence interval of the median: the order statistics
    n/2 - 0.98·sqrt(n) and 1 + n/2 + 0.98·sqrt(n) (1-based), clamped to the sample range."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    half = Z95 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(1 + n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def relative_spread(samples: Sequence[float]) -> float:
    """Half-width of the median's 95% CI over the median: the sampling noise of a median."""
    if len(samples) < 2:
        return math.inf
    lo, hi = median_ci(samples)
    median = float(np.median(samples))
    if median <= 0:
        return 0.0 if hi == lo else math.inf
    return (hi - lo) / 2 / median


# two-sided 95% Student t quantiles for 1..10 degrees of freedom; beyond, the Cornish-Fisher series
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (error < 1e-3)."""
    if df < 1:
        return math.inf
    if df <= len(_T95):
        return _T95[df - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def between_rounds(round_medians: Sequence[float], center: float) -> float | None:
    """The 95% CI half-width of the mean of the rounds' medians (Student t over the rounds), over
    `center`: how far a figure moves from one round to the next (clock, power and thermal drift,
    what ran just before), which no single round's samples can show. None below two rounds."""
    r = len(round_medians)
    if r < 2:
        return None
    if center <= 0:
        return math.inf
    spread = float(np.std(np.asarray(round_medians, dtype=np.float64), ddof=1))
    return t95(r - 1) * spread / math.sqrt(r) / center


@dataclass(frozen=True)
class Timing:
    """One implementation's samples and their summary; times in milliseconds per call."""

    samples_ms: tuple[float, ...]
    median: float
    p10: float
    p90: float
    rel_std: float                 # standard deviation / mean
    rel_ci: float                  # the reported noise: the larger of rel_ci_samples and rel_ci_rounds
    n: int
    stop_reason: str               # converged | budget | max_samples | max_rounds | time_limit
    mode: str                      # hot | cold-rotate | cold-flush | host
    method: str                    # graph | eager | host
    calls_per_sample: int = 1
    note: str = ""
    rounds: int = 0                # interleaved rounds the samples came from (0: a record from before rounds)
    round_medians: tuple[float, ...] = ()
    rel_ci_samples: float | None = None   # the median's order-statistic CI over all samples / median
    rel_ci_rounds: float | None = None    # Student-t CI of the rounds' medians / median (None: < 2 rounds)
    throttled_samples: int = 0            # samples of throttled turns left out of the figure (telemetry.py)
    telemetry: tuple[dict, ...] = ()      # per turn, in order: its samples, clocks, power, throttle reasons

    def to_plain(self) -> dict[str, Any]:
        """Every field; the telemetry ones only where the run gathered some (a record without NVML
        reads as records did before telemetry existed)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not self.telemetry and not self.throttled_samples:
            del out["telemetry"], out["throttled_samples"]
        return out

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "Timing":
        values = _fields(Timing, d)
        values["samples_ms"] = tuple(_num(x) for x in d.get("samples_ms", ()))
        values["round_medians"] = tuple(_num(x) for x in d.get("round_medians", ()))
        values["telemetry"] = tuple(dict(t) for t in d.get("telemetry") or ())
        for k in ("median", "p10", "p90", "rel_std", "rel_ci", "rel_ci_samples", "rel_ci_rounds"):
            if values.get(k) is not None:
                values[k] = _num(values[k])
        return Timing(**values)


def summarize(samples: Sequence[float], *, stop_reason: str, mode: str, method: str,
              calls_per_sample: int = 1, note: str = "", resolution_ms: float = 0.0,
              noise_floor: float = 0.0, round_medians: Sequence[float] = (), throttled_samples: int = 0,
              telemetry: Sequence[dict] = ()) -> Timing:
    """The summary of per-call samples (all rounds pooled). The reported noise is the larger of the
    pooled median's order-statistic CI and the between-rounds CI (`between_rounds`), never below the
    timer's resolution (`resolution_ms` per sample of `calls_per_sample` calls) nor `noise_floor`."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    mean = float(values.mean())
    median = float(np.median(values))
    rel_std = float(values.std(ddof=1) / mean) if values.size > 1 and mean > 0 else 0.0
    p10, p90 = (float(v) for v in np.percentile(values, [10, 90]))
    within = relative_spread(values.tolist())
    rounds = between_rounds(round_medians, median)
    noise = max(within, rounds or 0.0, noise_floor)
    if resolution_ms > 0 and median > 0:
        noise = max(noise, resolution_ms / (calls_per_sample * median))
    return Timing(tuple(float(v) for v in values), median, p10, p90, rel_std, noise, int(values.size),
                  stop_reason, mode, method, calls_per_sample, note, len(round_medians),
                  tuple(float(v) for v in round_medians), within, rounds, throttled_samples, tuple(telemetry))


def agree(a: Timing, b: Timing) -> bool:
    """Two medians agree within their reported noise: their confidence intervals overlap."""
    return abs(a.median - b.median) <= a.median * a.rel_ci + b.median * b.rel_ci


def _num(value: Any) -> Any:
    """A float from a record value ("nan"/"inf" strings are how JSON holds non-finite floats)."""
    if isinstance(value, str):
        return float(value)
    return value


def _fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return {k: v for k, v in d.items() if k in names}
    except AttributeError:
        raise UsageError(f"malformed bench record: expected an object for {cls.__name__}") from None
