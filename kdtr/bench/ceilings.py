"""The hardware's 100% lines (HBM bandwidth, dense matrix products), measured in the same run."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import KdtreeError
from ..runtime.gpu_identity import check_ceilings
from .settings import COMPUTE_UNITS, TimingOptions
from .stats import Timing, _fields
from ..errors import reason
from .timers import DeviceTimer


@dataclass(frozen=True)
class Ceilings:
    """The 100% lines, measured in this run (throughput at each timing's p10, the best decile)."""

    hbm_read_gbps: float
    hbm_copy_gbps: float           # read + write bytes counted
    bf16_mma_tflops: float
    fp32_fma_tflops: float
    l2_bytes: int
    timings: dict[str, Timing] = field(default_factory=dict)

    @property
    def bandwidth_gbps(self) -> float:
        return max(self.hbm_read_gbps, self.hbm_copy_gbps)

    def compute_tflops(self, unit: str) -> float:
        if unit not in COMPUTE_UNITS:
            raise KdtreeError(f"unknown compute unit {unit!r}; expected one of {', '.join(COMPUTE_UNITS)}")
        return {"bf16_mma": self.bf16_mma_tflops, "fp32_fma": self.fp32_fma_tflops,
                "bf16_mma_x6": self.bf16_mma_tflops / 6}[unit]

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> "Ceilings":
        """A record's ceilings (UsageError naming the one that is missing, zero or not a number)."""
        check_ceilings(d, "ceilings")
        return Ceilings(**{**_fields(Ceilings, d),
                           "timings": {k: Timing.from_plain(v) for k, v in d.get("timings", {}).items()}})


CEILING_OPTIONS = TimingOptions(budget_s=0.5, target=0.005, min_samples=10, max_samples=200, warmup_s=0.2)


def measure_ceilings(timer: DeviceTimer, options: TimingOptions = CEILING_OPTIONS) -> Ceilings:
    """HBM read (a sum over 2 GiB) and copy (2 GiB -> 2 GiB) bandwidth, dense bf16 (8192^3) and
    fp32 without TF32 (4096^3) matrix products, all on random data, CUDA graphs, hot mode (the
    footprints dwarf the L2)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1)
    timings: dict[str, Timing] = {}
    n = 8192
    a = torch.randn((n, n), device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn((n, n), device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    timings["bf16_mma"] = timer.measure([lambda: torch.mm(a, b, out=c)], options=options)
    bf16 = 2 * n ** 3 / (timings["bf16_mma"].p10 * 1e-3) / 1e12
    del a, b, c
    n = 4096
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn((n, n), device="cuda", generator=gen)
        b = torch.randn((n, n), device="cuda", generator=gen)
        c = torch.empty((n, n), device="cuda")
        timings["fp32_fma"] = timer.measure([lambda: torch.mm(a, b, out=c)], options=options)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    fp32 = 2 * n ** 3 / (timings["fp32_fma"].p10 * 1e-3) / 1e12
    del a, b, c
    count = 512 << 20                                    # 2 GiB of fp32
    src = torch.randn(count, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    total = torch.empty((), device="cuda")
    timings["hbm_read"] = timer.measure([lambda: torch.sum(src, dim=0, out=total)], options=options)
    # a copy captured in a graph is a memcpy node (the copy engines?): on the H200 of results/bench.json
    # it went 2.8 TB/s, an eager copy_ 4.3 TB/s (its ceilings' timings): time both, the faster is the ceiling
    timings["hbm_copy"] = timer.measure([lambda: dst.copy_(src)], options=options)
    timings["hbm_copy_eager"] = timer.measure([lambda: dst.copy_(src)], options=options, graph=False)
    read = src.nbytes / (timings["hbm_read"].p10 * 1e-3) / 1e9
    copy = 2 * src.nbytes / (min(timings["hbm_copy"].p10, timings["hbm_copy_eager"].p10) * 1e-3) / 1e9
    del src, dst, total
    torch.cuda.empty_cache()
    return Ceilings(read, copy, bf16, fp32, timer.l2_bytes, timings)


EMPTY_KERNEL_SOURCE = 'extern "C" __global__ void kdtr_empty() {}\n'


def _empty_kernel():
    """A zero-argument launcher of an empty kernel: ours through NVRTC + the driver (the launch path
    our kernels take) where that works, else torch's spin kernel with zero cycles."""
    try:
        from ..config import config
        from ..runtime.device import get_kernel

        folder = config().cache_dir / "bench"
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "empty.cu"
        if not source.exists() or source.read_text() != EMPTY_KERNEL_SOURCE:
            source.write_text(EMPTY_KERNEL_SOURCE)
        kernel = get_kernel(source, "kdtr_empty")
        kernel.launch(1, 32, [])
        return (lambda: kernel.launch(1, 32, [])), "nvrtc", None
    except Exception as err:  # noqa: BLE001 - fall back, and say why
        import torch

        return (lambda: torch.cuda._sleep(0)), "torch", f"NVRTC empty kernel unavailable ({reason(err)})"


def gpu_clocks() -> dict[str, str] | None:
    """SM / memory clocks, temperature and power now (nvidia-smi), or None."""
    query = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    values = [v.strip() for v in out.stdout.splitlines()[0].split(",")]
    return dict(zip(("sm", "mem", "temperature", "power"), values))
