"""What a record's timings say about themselves, as plain lines for `kdtree bench` and `kdtree report`:
the telemetry (clocks, power, throttled samples left out), the back-to-back figures beside the
interleaved ones, and the rows timed by another method than ours (their ratio is not quoted)."""

from __future__ import annotations

from typing import Sequence


def telemetry_line(record) -> str | None:
    info = record.meta.get("telemetry")
    if not info:
        return None
    if not info.get("source"):
        return info.get("why") or "no telemetry"
    turns = [t for r in record.rows for tm in (r.timing, r.alone) if tm is not None for t in tm.telemetry]
    dropped = sum(tm.throttled_samples for r in record.rows for tm in (r.timing, r.alone) if tm is not None)
    throttled = sum(bool(t.get("throttled")) for t in turns)
    line = f"telemetry (NVML, driver {info.get('driver')}): {len(turns)} turns read"
    if turns:
        sm = [c for t in turns for c in t.get("sm_mhz", ())]
        mem = [c for t in turns for c in t.get("mem_mhz", ())]
        power = [p for t in turns for p in t.get("power_w", ())]
        line += (f", SM clock {min(sm)}-{max(sm)} MHz, memory {min(mem)}-{max(mem)} MHz, "
                 f"power {min(power):.0f}-{max(power):.0f} W")
    line += f"; {throttled} throttled turn(s), {dropped} sample(s) left out of the figures"
    if info.get("locked"):
        line += f"; SM clock locked at {info['locked'].get('sm_mhz')}"
    return line


def back_to_back_line(rows: Sequence) -> str | None:
    """How far each implementation's back-to-back figure lies from its interleaved one (the largest)."""
    pairs = [r for r in rows if r.timing is not None and r.alone is not None and r.timing.median > 0]
    if not pairs:
        return None
    worst = max(pairs, key=lambda r: abs(r.alone.median / r.timing.median - 1))
    slower = sum(r.alone.median > r.timing.median for r in pairs)
    return (f"back to back: {len(pairs)} row(s) timed again alone, {slower} slower alone than interleaved; "
            f"largest difference {100 * (worst.alone.median / worst.timing.median - 1):+.1f}% "
            f"({worst.case}, {worst.impl}); the tables quote the slower")


def method_line(rows: Sequence) -> str | None:
    """Rows timed by another method than our row of their case (no ratio quoted for them)."""
    from .plan import same_method

    ours = {(r.case, r.mode): r.timing for r in rows if r.primary and r.timing is not None}
    other = sorted({f"{r.impl} in {r.case} ({_how(r.timing)})" for r in rows
                    if not r.primary and r.timing is not None and (r.case, r.mode) in ours
                    and not same_method(r.timing, ours[(r.case, r.mode)])})
    if not other:
        return None
    return ("timed by another method than ours, no speedup quoted: " + ", ".join(other)
            + " (the row's note says why)")


def _how(timing) -> str:
    return f"{timing.mode} {timing.method} x{timing.calls_per_sample}"


def plan_line(record) -> str | None:
    """How the cases were timed, said once: every row of a case by its plan (kdtr/bench/plan.py)."""
    from .plan import TimingPlan

    plans = [TimingPlan.from_plain(p) for modes in getattr(record, "timing_plans", {}).values() for p in modes.values()]
    if not plans:
        return None
    parts = []
    for mode in dict.fromkeys(p.mode for p in plans):
        mine = [p for p in plans if p.mode == mode]
        sets, ks = sorted({p.sets for p in mine}), sorted({p.calls_per_sample for p in mine})
        parts.append(f"{mode} in {len(mine)} case(s)" + (f", {_span(sets)} input sets" if sets != [1] else "")
                     + f", {_span(ks)} call(s) a sample")
    return "one method a case, the same for every implementation of it: " + "; ".join(parts)


def _span(values: Sequence[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def timing_notes(record) -> list[str]:
    return [line for line in (plan_line(record), telemetry_line(record), back_to_back_line(record.rows),
                              method_line(record.rows)) if line]


def row_telemetry(timing) -> str:
    """One timing's telemetry in a few words ("" without any): clock and power ranges, throttled samples."""
    if timing is None or not timing.telemetry:
        return ""
    sm = [c for t in timing.telemetry for c in t.get("sm_mhz", ())]
    power = [p for t in timing.telemetry for p in t.get("power_w", ())]
    return (f"sm={min(sm)}-{max(sm)}MHz power={min(power):.0f}-{max(power):.0f}W "
            f"throttled={timing.throttled_samples}")
