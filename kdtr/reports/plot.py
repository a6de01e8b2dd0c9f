"""Plots of a bench record (matplotlib, imported on use; no pyplot, so no global state).

Left: a roofline, achieved TFLOP/s against arithmetic intensity (FLOP per byte of the op's cost
model) under the ceilings measured in the same run. Right: latency against prefix length for every
group of rows that differ only in prefix (verify_attn's prefix sweep).
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_open
from ..bench import COMPUTE_UNITS, BenchRecord
from ..errors import UsageError

MARKERS = "o^sDv<>pP*Xh"


def require_matplotlib():
    """matplotlib's figure classes; a UsageError saying how to install it where it is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise UsageError(f"--plot needs matplotlib ({err}); install it: pip install 'kdtree[plot]'") from None
    return Figure, FigureCanvasAgg


def roofline_points(record: BenchRecord):
    """(label, intensity FLOP/B, TFLOP/s, flagged) per timed row with FLOPs, grouped by impl."""
    groups: dict[str, list[tuple[float, float, bool]]] = {}
    for row in record.rows:
        if row.timing is None or row.flops <= 0 or row.bytes <= 0 or row.tflops is None:
            continue
        groups.setdefault(f"{row.impl} ({row.op}/{row.variant})", []).append(
            (row.flops / row.bytes, row.tflops, row.flagged))
    return groups


def prefix_series(record: BenchRecord):
    """Rows that differ only in `prefix`: label -> sorted [(prefix, median ms)], 2 points or more."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in record.rows:
        if row.timing is None or "prefix" not in row.config:
            continue
        rest = " ".join(f"{k}={v}" for k, v in row.config.items() if k != "prefix")
        label = f"{row.impl} {row.variant} {rest} {row.mode}"
        series.setdefault(label, []).append((int(row.config["prefix"]), row.timing.median))
    return {k: sorted(v) for k, v in series.items() if len({p for p, _ in v}) >= 2}


def plot_record(record: BenchRecord, path: str | Path) -> Path:
    """Write the two panels to `path` (PNG, or any format matplotlib infers from the suffix)."""
    Figure, Canvas = require_matplotlib()
    path = Path(path)
    figure = Figure(figsize=(15, 6.5), constrained_layout=True)
    Canvas(figure)
    roof, lat = figure.subplots(1, 2)
    gpu = (record.meta.get("device") or {}).get("gpu") or "no GPU"
    groups = roofline_points(record)
    intensities = [x for points in groups.values() for x, _, _ in points] or [1.0, 1000.0]
    lo, hi = min(intensities) / 3, max(intensities) * 3
    ceilings = record.ceilings
    if ceilings is not None:
        import numpy as np

        xs = np.geomspace(lo, hi, 200)
        bandwidth = ceilings.bandwidth_gbps / 1e3                            # TB/s
        used = {r.compute_unit for r in record.rows}
        units = [u for u in COMPUTE_UNITS if u in ("bf16_mma", "fp32_fma") or u in used]
        for unit, style in zip(units, ("-", "--", ":")):
            peak = ceilings.compute_tflops(unit)
            roof.plot(xs, np.minimum(peak, bandwidth * xs), style, color="black", linewidth=1.2,
                      label=f"{unit} {peak:,.0f} TFLOP/s, HBM {bandwidth:.2f} TB/s (measured)")
    for index, (label, points) in enumerate(sorted(groups.items())):
        xs = [x for x, _, _ in points]
        ys = [y for _, y, _ in points]
        roof.scatter(xs, ys, marker=MARKERS[index % len(MARKERS)], s=28, label=label, alpha=0.85)
        flagged = [(x, y) for x, y, f in points if f]
        if flagged:
            roof.scatter(*zip(*flagged), marker="o", s=140, facecolors="none", edgecolors="red",
                         linewidths=1.5)
    roof.set_xscale("log")
    roof.set_yscale("log")
    roof.set_xlim(lo, hi)
    roof.set_xlabel("arithmetic intensity (FLOP / byte of the cost model)")
    roof.set_ylabel("achieved TFLOP/s")
    roof.set_title(f"roofline — {gpu} (red rings: above a ceiling, measurement error)")
    roof.grid(True, which="both", alpha=0.3)
    if groups or ceilings is not None:
        roof.legend(fontsize=7, loc="lower right")
    series = prefix_series(record)
    for index, (label, points) in enumerate(sorted(series.items())):
        lat.plot([p for p, _ in points], [t for _, t in points], marker=MARKERS[index % len(MARKERS)],
                 label=label)
    lat.set_xscale("log", base=2)
    lat.set_yscale("log")
    lat.set_xlabel("prefix length (tokens)")
    lat.set_ylabel("median time per call (ms)")
    lat.set_title("latency against prefix length")
    lat.grid(True, which="both", alpha=0.3)
    if series:
        lat.legend(fontsize=7)
    else:
        lat.text(0.5, 0.5, "no rows that differ only in prefix", ha="center", va="center",
                 transform=lat.transAxes)
    with atomic_open(path) as handle:             # no half-written PNG on a full disk
        figure.savefig(handle, format="png", dpi=110)
    return path
