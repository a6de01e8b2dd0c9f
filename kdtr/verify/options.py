"""How verify runs: the backend, tolerance overrides, trials, the determinism probe, forced
kernels, the resolved implementations (--impl, --against) and the case timeout."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..errors import UsageError
from ..impl.builds import KernelBuild
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
    defines: tuple[KernelBuild, ...] = ()   # --define: the forced kernels built with knobs
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

    def build_for(self, kernel: str | None) -> KernelBuild | None:
        """The build --define gives the forced `kernel` (None: its plain build)."""
        return next((b for b in self.defines if b.name == kernel), None)

    def defines_for(self, kernel: str | None) -> dict[str, str] | None:
        """The knobs --define gives the forced `kernel` (None: its plain build)."""
        build = self.build_for(kernel)
        return dict(build.defines) if build else None

    def kernel_label(self, kernel: str) -> str:
        """The forced kernel as the table's config shows it: bf16_wgmma2, or bf16_wgmma2[WG2_LPT=2]."""
        build = self.build_for(kernel)
        return build.label if build else kernel


def check_kernels(names: Iterable[str], backend: str, defines: Iterable[str] = ()
                  ) -> tuple[tuple[str, ...], tuple[KernelBuild, ...]]:
    """--kernel names and --define builds (kdtr.impl.builds), each a kernel some op can force, one
    build a kernel: (the forced names, the --define builds); UsageError naming the fault (an unknown
    name: with the known ones)."""
    from ..impl.builds import kernel_builds
    from ..ops import op_names

    builds = kernel_builds((), defines)
    names = tuple(dict.fromkeys([*names, *(b.name for b in builds)]))
    twice = [name for name, n in Counter(b.name for b in builds).items() if n > 1]
    if twice:
        raise UsageError(f"--define {', '.join(twice)} more than once: verify runs one build a kernel")
    if names and backend != "cuda":
        raise UsageError(f"--kernel and --define force a CUDA kernel, which needs the cuda backend, not {backend}")
    known = {k: op.name for op in map(get_op, op_names()) for v in op.variants for k in op.cuda_kernels(v)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown kernel {', '.join(map(repr, unknown))}; known: "
                         + ", ".join(f"{k} ({op})" for k, op in known.items()))
    return names, builds
