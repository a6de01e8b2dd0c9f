#!/usr/bin/env python3
"""Print docs/measuring.md's roofline table (markdown): every bench case priced at the bf16 matrix
rate, its floor on each GPU of kdtr/gpus.py that has ceilings (kdtr.reports.roofline).

The page holds this output verbatim between its `roofline:begin` and `roofline:end` markers, and
tests/cli/test_docs.py keeps the two equal, so a new case or a new ceiling cannot leave stale floors
in the page. It imports kdtr: run it with the project's Python (`.venv/bin/python scripts/roofline.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from kdtr.reports.roofline import RooflineRow, rated_gpus, roofline

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "specs" / "bench"


def scaled(value: float, unit: str) -> str:
    """3 significant digits with an SI prefix: 3.59 MFLOP, 113 MB."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def duration(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} µs"


def rate_line(model) -> str:
    rates = model.ceilings
    origin = "measured, `results/bench.json`" if model.measured is not None else "spec sheet"
    return (f"{rates.gpu} {rates.bf16_flops / 1e12:.0f} TFLOP/s and {rates.dram_bytes / 1e12:.2f} TB/s "
            f"({origin}; ridge {rates.ridge:.0f} FLOP/byte)")


def table(rows: list[RooflineRow]) -> list[str]:
    gpus = [f.gpu for f in rows[0].floors]
    lines = ["| case | FLOPs | bytes | FLOP/byte | " + " | ".join(f"{g} floor | bound" for g in gpus) + " |",
             "|---" * (4 + 2 * len(gpus)) + "|"]
    for row in rows:
        floors = " | ".join(f"{duration(f.seconds)} | {f.bound}" for f in row.floors)
        lines.append(f"| {row.case} | {scaled(row.cost.flops, 'FLOP')} | {scaled(row.cost.bytes, 'B')} "
                     f"| {row.intensity:.0f} | {floors} |")
    return lines


def bound_differently(rows: list[RooflineRow], gpus) -> list[str]:
    """Per pair of GPUs, the cases memory-bound on the one with the higher ridge and compute-bound
    on the other: the intensities between the two ridges."""
    lines = []
    for low in range(len(gpus)):
        for high in range(len(gpus)):
            if gpus[low].ceilings.ridge >= gpus[high].ceilings.ridge:
                continue
            cases = [f"`{r.case}`" for r in rows
                     if r.floors[low].bound == "compute" and r.floors[high].bound == "memory"]
            low_name, high_name = gpus[low].ceilings.gpu, gpus[high].ceilings.gpu
            lines.append(f"Memory-bound on the {high_name} but compute-bound on the {low_name}: "
                         + (", ".join(cases) if cases else "none") + ".")
    return lines


def page() -> str:
    rows = roofline([SUITES])
    gpus = rated_gpus()
    lines = ["Ceilings: " + "; ".join(rate_line(m) for m in gpus) + ".", ""]
    for suite in dict.fromkeys(r.suite for r in rows):
        lines += [f"`{Path(suite).relative_to(ROOT)}`:", ""]
        lines += table([r for r in rows if r.suite == suite]) + [""]
    lines += bound_differently(rows, gpus)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(page())
