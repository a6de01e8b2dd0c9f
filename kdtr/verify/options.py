"""How verify runs: the backend, tolerance overrides, trials, the determinism probe, forced
kernels, the resolved implementations (--impl, --against) and the case timeout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..errors import UsageError
from ..ops import get_op
from ..ops.base import Op

if TYPE_CHECKING:
    from ..impl import ImplRef, Implementation


@dataclass(frozen=True)
class Options:
    backend: str = "torch"            # resolved backend name
    atol: float | None = None         # overrides for every toleranced output
    rtol: float | None = None
    trials: int = 0                   # fresh-input re-runs per case
    determinism: bool = False         # run twice, compare bitwise
    kernels: tuple[str, ...] = ()     # CUDA kernels to force where a case's op/variant has them
    keep_worst: bool = False          # keep worst elements of passing outputs too (records grow)
    impls: tuple[ImplRef, ...] = ()   # --impl, resolved: these implementations run instead of the backend
    against: ImplRef | None = None    # --against, resolved: run beside the backend, parity reported
    case_timeout: float | None = None  # seconds one implementation's call may take (kdtr.impl.evaluate)
    invariance: bool = False          # probe batch, order and split invariance (kdtr.verify.invariance)

    def implementations(self) -> tuple[Implementation, ...]:
        return tuple(ref.load() for ref in self.impls)

    def kernel_for(self, op: Op, variant: str) -> str | None:
        """The forced kernel for this op/variant, or None for the launch's own choice."""
        return next((k for k in self.kernels if k in op.cuda_kernels(variant)), None)


def check_kernels(names: Iterable[str], backend: str) -> tuple[str, ...]:
    """--kernel names, each a kernel some op can force; UsageError naming the known ones."""
    from ..ops import op_names

    names = tuple(dict.fromkeys(names))
    if names and backend != "cuda":
        raise UsageError(f"--kernel forces a CUDA kernel; it needs the cuda backend, not {backend}")
    known = {k: op.name for op in map(get_op, op_names()) for v in op.variants for k in op.cuda_kernels(v)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown kernel {', '.join(map(repr, unknown))}; known: "
                         + ", ".join(f"{k} ({op})" for k, op in known.items()))
    return names
