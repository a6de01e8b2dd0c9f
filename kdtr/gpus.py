"""The GPUs kdtree's kernels are chosen for: each architecture's usual shared-memory limit and SM count,
its roofline ceilings where known (docs/measuring.md's floors), and KDTREE_GPU's "run as another
GPU" (`sm_120`, or `sm_XY:BYTES` for a limit of one's own).

The kernel choice of every launch is a pure function of (arch, SMs, shared memory a block, shape);
the table below is what `kdtree build --arch` and kernels/README.md's GPU table read it at."""

from __future__ import annotations

import re
from dataclasses import dataclass

SMEM_99K = 101376         # sm_86, sm_89, sm_120, sm_121: 99 KB of shared memory a block


@dataclass(frozen=True)
class Rates:
    """One GPU's two roofline ceilings: its dense bf16 tensor-core matrix-product rate and its DRAM
    bandwidth. `gpu` names the one GPU they are of, as an architecture's row may name several."""

    gpu: str
    bf16_flops: float        # FLOP/s
    dram_bytes: float        # bytes/s

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where the ceilings meet: below it, memory-bound."""
        return self.bf16_flops / self.dram_bytes


@dataclass(frozen=True)
class GpuModel:
    """One architecture as its usual GPU has it: `smem_optin` is the largest dynamic shared memory
    a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin), `sms` its multiprocessors;
    `spec_sheet` and `measured` its ceilings from the vendor's figures and from our own runs,
    None where we know no source."""

    arch: int
    name: str
    sms: int
    smem_optin: int
    spec_sheet: Rates | None = None
    measured: Rates | None = None

    @property
    def ceilings(self) -> Rates | None:
        """What a floor is priced at: the measured ceilings where we have them (what a kernel can
        reach), else the spec sheet's."""
        return self.measured or self.spec_sheet


# H200 SXM spec sheet: 989 TFLOP/s dense bf16 (1,979 with sparsity), 4.8 TB/s HBM3e
H200_SPEC = Rates("H200", 989e12, 4.8e12)
# H200 measured: results/bench.json's ceilings (bf16 MMA 8192^3 through torch, a 2 GiB HBM read; p10, hot)
H200_MEASURED = Rates("H200", 787e12, 4.40e12)
# RTX PRO 6000 Blackwell spec sheet (as issue 28 quotes it): 4,000 sparse FP4 TOPS, halved for dense,
# for FP8 and again for bf16, is 500 TFLOP/s; 1.79 TB/s GDDR7 (docs/gpus.md's proxy section)
RTX_PRO_6000_SPEC = Rates("RTX PRO 6000", 500e12, 1.79e12)


# One row per architecture kernels/README.md's GPU table names (SM counts: the first GPU named)
GPU_MODELS = {
    80: GpuModel(80, "A100", 108, 166912),
    86: GpuModel(86, "A10 / RTX 3090", 72, SMEM_99K),
    89: GpuModel(89, "L40S / RTX 4090", 142, SMEM_99K),
    90: GpuModel(90, "H100 / H200", 132, 232448, spec_sheet=H200_SPEC, measured=H200_MEASURED),
    100: GpuModel(100, "B200", 148, 232448),
    120: GpuModel(120, "RTX PRO 6000 Blackwell / RTX 50xx", 188, SMEM_99K, spec_sheet=RTX_PRO_6000_SPEC),
    121: GpuModel(121, "DGX Spark (GB10)", 48, SMEM_99K),
}

_ARCH_RE = re.compile(r"^sm_(\d+)a?$")
_SPEC_RE = re.compile(r"^sm_(\d+)(?::(\d+))?$")


def arch_number(arch: str) -> int:
    """90 for `sm_90` or `sm_90a`; ValueError for anything else."""
    m = _ARCH_RE.match(arch)
    if m is None:
        raise ValueError(f"{arch!r} is not an architecture like sm_90, sm_90a or sm_120")
    return int(m.group(1))


def model_for(arch: str) -> GpuModel | None:
    """The table's row for an arch (`sm_120a` is sm_120's), None where it has none."""
    return GPU_MODELS.get(arch_number(arch))


@dataclass(frozen=True)
class RunAs:
    """KDTREE_GPU: the architecture and shared-memory limit every launch chooses its kernels for."""

    arch: int
    smem_optin: int

    @property
    def label(self) -> str:
        return f"sm_{self.arch} ({self.smem_optin} B)"


def parse_run_as(value: str) -> RunAs:
    """`sm_120` (the table's limit for it) or `sm_XY:BYTES`; ValueError saying what is wrong."""
    m = _SPEC_RE.match(value.strip())
    if m is None:
        raise ValueError("use an architecture like sm_120, or sm_XY:BYTES for a shared-memory limit "
                         "of your own (e.g. sm_120:101376)")
    arch = int(m.group(1))
    if m.group(2) is not None:
        smem = int(m.group(2))
        if not 48 * 1024 <= smem <= 1 << 20:
            raise ValueError(f"{smem} B is not a shared-memory limit a block could have (49152 to 1048576)")
        return RunAs(arch, smem)
    model = GPU_MODELS.get(arch)
    if model is None:
        raise ValueError(f"sm_{arch} has no usual shared-memory limit here (known: "
                         f"{', '.join(f'sm_{a}' for a in GPU_MODELS)}); give one as sm_{arch}:BYTES")
    return RunAs(arch, model.smem_optin)
