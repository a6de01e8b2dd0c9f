"""What runs where: per architecture, each registered kernel's place (kdtree build --arch, docs/gpus.md).

A kernel applies to an arch where its instructions exist there and its shared memory fits that arch's
usual limit (kdtr.gpus): only there can a launch pick it (natively, or on a bigger GPU run as that
one with KDTREE_GPU), so only there is it compiled. `serves` lists the op/variants the arch's launch
picks it for, for some shape, at that limit."""

from __future__ import annotations

from dataclasses import dataclass

from ..gpus import GPU_MODELS, arch_number
from . import cuda_kernels, get_op
from .base import H200, CudaKernel, Gpu


@dataclass(frozen=True)
class Placement:
    kernel: str
    source: str
    op_variant: str                   # "verify_attn/bf16_paged"
    arch: str                         # as asked (--arch)
    compile_arch: str | None          # what the launch compiles it for there (sm_90a...); None: not applicable
    dynamic_shared_bytes: int | None  # what its launch asks for; None: sized per launch by the shape
    serves: tuple[str, ...]           # op/variants the arch's launch picks it for
    why_not: str = ""                 # why it does not apply to the arch

    @property
    def applicable(self) -> bool:
        return self.compile_arch is not None


def gpu_for(arch: str) -> Gpu:
    """The arch's usual GPU (kdtr.gpus), or for an arch the table lacks, its number with the H200's
    SM count and limit."""
    number = arch_number(arch)
    model = GPU_MODELS.get(number)
    return Gpu(number, model.sms, model.smem_optin) if model else Gpu(number, H200.sms, H200.smem_optin)


def _place(k: CudaKernel, arch: str, gpu: Gpu) -> Placement:
    op_variant = f"{k.op}/{k.variant}"
    smem = k.smem or None
    if not k.has_instructions(gpu.arch):
        need = f"sm_{k.only_sm} only" if k.only_sm is not None else f"sm_{k.min_sm}+"
        return Placement(k.name, k.source, op_variant, arch, None, smem, (), f"instructions: {need}")
    if not k.runs_on(gpu):
        return Placement(k.name, k.source, op_variant, arch, None, smem, (),
                         f"needs {k.smem + 64:,} B > {gpu.smem_optin:,} B")
    target = arch if arch.endswith("a") or not k.arch_feature else arch + k.arch_feature
    serves = (op_variant,) if k.name in get_op(k.op).kernels_serving(k.variant, gpu) else ()
    return Placement(k.name, k.source, op_variant, arch, target, smem, serves)


def placements(arch: str) -> list[Placement]:
    """Every registered kernel's place on `arch`, in registry order."""
    gpu = gpu_for(arch)
    return [_place(k, arch, gpu) for k in cuda_kernels()]
