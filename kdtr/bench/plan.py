"""One timing method a case: every implementation of it timed in the same mode with the same input
sets and calls per sample, so a ratio between two rows compares kernels, not methods.

The first implementation timed on the device (ours, where it runs) sizes the plan: in cold mode the
input sets to rotate so a sample's calls touch twice the L2 (one set: an L2 flush before each
one-call sample), and the calls a sample from its own call time (`TimingOptions.sample_ms`). Every
other implementation then makes as many input sets (its own prepare over copies of the inputs) and
is timed with that many calls a sample. A row that cannot be timed so (its sets could not be made,
its capture failed, it runs on the host clock) keeps its figure, says why, and gets no ratio
(`same_method`, `with_speedups`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class TimingPlan:
    """How every row of one case in one mode is timed."""

    mode: str                  # hot | cold-rotate | cold-flush
    sets: int                  # input sets rotated through (1: the same inputs every call)
    calls_per_sample: int      # calls between two CUDA events; a figure is a sample's time / this
    method: str                # graph | eager: how the implementation that set the plan was launched
    sized_by: str              # the implementation whose call time sized calls_per_sample

    def to_plain(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "TimingPlan":
        return TimingPlan(mode=str(d["mode"]), sets=int(d["sets"]), calls_per_sample=int(d["calls_per_sample"]),
                          method=str(d.get("method", "graph")), sized_by=str(d.get("sized_by", "")))

    def describe(self) -> str:
        """"cold-rotate, 34 input sets, 34 calls a sample (graph replay)"."""
        sets = f", {self.sets} input sets" if self.sets > 1 else ""
        how = "graph replay" if self.method == "graph" else self.method
        return f"{self.mode}{sets}, {self.calls_per_sample} call{'s' if self.calls_per_sample > 1 else ''} a sample ({how})"


def same_method(a, b) -> bool:
    """Two timings (kdtr.bench.stats.Timing) taken the same way: mode, launch method and calls a
    sample all equal. Only such rows are compared by a ratio."""
    return (a.mode, a.method, a.calls_per_sample) == (b.mode, b.method, b.calls_per_sample)
