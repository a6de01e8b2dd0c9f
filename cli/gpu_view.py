"""The table of `kdtree report --compare-gpus` (rendering only; kdtr/reports/gpu_compare.py builds it)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from . import render
from .bench_view import _fig, _pct, fmt_time


def _ratio(speed) -> str:
    return "—" if speed is None else f"{speed:.2f}×"


def gpu_comparison_view(comparison) -> None:
    for index, (label, gpu) in enumerate(zip(comparison.labels, comparison.gpus), 1):
        ceilings = gpu.ceilings or {}
        render.out.print(f"[{index}] {label}: {gpu.label}; ceilings measured in its run: "
                         f"HBM {max(ceilings.get('hbm_read_gbps', 0), ceilings.get('hbm_copy_gbps', 0)):,.0f} GB/s, "
                         f"bf16 {ceilings.get('bf16_mma_tflops', 0):,.0f} TFLOP/s, "
                         f"fp32 {ceilings.get('fp32_fma_tflops', 0):,.1f} TFLOP/s", markup=False, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, title="same cases on each GPU; % of that GPU's own measured ceiling; "
                                             "× = speed relative to [1]")
    table.add_column("case")
    table.add_column("impl")
    for index in range(1, len(comparison.labels) + 1):
        table.add_column(f"[{index}] time", justify="right")
        table.add_column(f"[{index}] rate", justify="right")
        table.add_column(f"[{index}] %ceil", justify="right")
        if index > 1:
            table.add_column(f"[{index}] ×", justify="right")
    for row in comparison.rows:
        cells = [f"{row.op}/{row.variant} {row.case}", f"{row.impl} {row.mode}"]
        for index, figure in enumerate(row.figures):
            if figure is None:
                cells += ["—", "—", "—"] + (["—"] if index else [])
                continue
            cells += [fmt_time(figure.median_ms), f"{_fig(figure.throughput)} {row.unit}", _pct(figure.share)]
            if index:
                cells.append(_ratio(figure.speed))
        table.add_row(*cells)
    render.out.print(table)
    skipped = [f"[{i}] {n}" for i, n in enumerate(comparison.unmatched, 1) if n]
    render.out.print(f"{len(comparison.rows)} cases compared"
                     + (f"; timed rows without a match, left out: {', '.join(skipped)}" if skipped else ""),
                     markup=False, highlight=False)
