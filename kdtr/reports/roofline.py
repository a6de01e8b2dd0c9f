"""The roofline: a case's floor on a GPU is the longer of its FLOPs at the GPU's dense bf16 matrix
rate and its bytes at the GPU's DRAM bandwidth (docs/measuring.md, "Floors and targets").

Costs come from each op's `case_cost` (its cost model priced from the case's shapes, so cases whose
K/V would take GBs are never generated); ceilings from `kdtr.gpus` (measured where we have them,
else the spec sheet's). Only cases whose unit is the bf16 matrix product are priced: those are the
ceilings the GPU rows give.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

from ..gpus import GPU_MODELS, GpuModel, Rates
from ..ops import get_op
from ..ops.base import Cost
from ..bundle.spec import load_suites

RATED_UNIT = "bf16_mma"          # the compute unit Rates.bf16_flops is the ceiling of


@dataclass(frozen=True)
class Floor:
    """The least time a case can take on one GPU, and which ceiling sets it."""

    gpu: str
    seconds: float
    bound: str                   # "compute" or "memory"


@dataclass(frozen=True)
class RooflineRow:
    """One case priced on every rated GPU."""

    suite: str                   # the suite file as it was named
    case: str
    cost: Cost
    floors: tuple[Floor, ...]

    @property
    def intensity(self) -> float:
        """FLOP per byte moved: compute-bound on a GPU whose ridge lies below it."""
        return self.cost.flops / self.cost.bytes


def floor(cost: Cost, rates: Rates) -> Floor:
    compute, memory = cost.flops / rates.bf16_flops, cost.bytes / rates.dram_bytes
    return Floor(rates.gpu, max(compute, memory), "compute" if compute >= memory else "memory")


def rated_gpus() -> tuple[GpuModel, ...]:
    """The GPU rows that have ceilings, in the table's order."""
    return tuple(model for model in GPU_MODELS.values() if model.ceilings is not None)


def roofline(paths: Iterable[str | os.PathLike]) -> list[RooflineRow]:
    """Every priceable case of the suites (in suite, then case order) on every rated GPU."""
    gpus = rated_gpus()
    rows = []
    for suite in load_suites(paths):
        op = get_op(suite.op)
        for case in suite.cases:
            cost = op.case_cost(case) if op.compute_unit(case.variant) == RATED_UNIT else None
            if cost is not None:
                rows.append(RooflineRow(str(suite.path), case.name, cost, tuple(floor(cost, g.ceilings) for g in gpus)))
    return rows
