"""Our CUDA kernels run on the CPU: a kernel's own source (kernels/*.cu, unchanged but for
`__shared__`, below) is compiled with g++ against host_cuda.h, a host model of CUDA's threads,
barriers, shuffles, async copies and the mma.sync / ldmatrix fragments, into a shared library; the
library's entries are launched through the very host code that launches them on a GPU (the op's
`run_cuda`: kernel choice, grid, split count, merge), with kdtr.runtime.device's GPU queries answered
as the emulated GPU would answer them (through its one hook for that, `stand_in`).

It is evidence of another kind than a GPU run: it executes every line of the kernel, its index
arithmetic, masking, splits and merge, barriers (a deadlock fails) and async-copy waits (a copy lands
only when its thread waits for it; with `early_copies`, as it is issued, so that a buffer refilled
while another thread still reads it shows), and a race shows as a difference between thread orders; it does
not model the hardware's timing, its MMA rounding or anything across blocks. docs/gpus.md says where
it stands between "compile-checked" and "verified".
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

KERNELS_DIR = Path(__file__).resolve().parents[3] / "kernels"
HEADER = Path(__file__).with_name("host_cuda.h")
# The kernels tests/kernels/test_emulated_kernels.py runs here against the float64 reference (the
# "emulated" cells of kernels/README.md's GPU table)
EMULATED_KERNELS = ("fp32_ffma99", "bf16_mma", "bf16_mma99", "sorted", "warp", "smem", "walk", "fp32_bf16x3",
                    "fp32_dmma")
ENTRY_RE = re.compile(r'extern "C" __global__ void(?:\s+__launch_bounds__\((?:[^()]|\([^()]*\))*\))?\s+(\w+)\(')
MACRO_ENTRY_RE = re.compile(r"^ATTN_MERGE(?:_BATCHED|_DEPENDENT|_LPT)?_ENTRY\((\w+),", re.M)
DYNAMIC_SHARED_RE = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+(?: \w+)*?)\s+(\w+)\[\];")


def compiler() -> str | None:
    """The C++ compiler the emulator builds with (g++), or None where there is none."""
    return shutil.which(os.environ.get("CXX", "g++"))


def host_source(text: str) -> str:
    """A kernel source as g++ compiles it here: the block's dynamic shared memory becomes a pointer
    to the emulator's buffer, and static `__shared__` arrays become function statics (one block
    runs at a time, so a static is that block's shared memory)."""
    text = DYNAMIC_SHARED_RE.sub(r"\1* const \2 = (\1*)emu_dynamic_smem;", text)
    return re.sub(r"\b__shared__\b", "static", text)


def entries(source: str, kernels_dir: Path = KERNELS_DIR) -> list[str]:
    """The kernel entries a .cu defines: its extern "C" __global__ functions and merge macros (once
    each: a source may define one in either branch of an #if)."""
    text = (kernels_dir / source).read_text()
    return list(dict.fromkeys(ENTRY_RE.findall(text) + MACRO_ENTRY_RE.findall(text)))


@functools.cache
def build(source: str, defines: tuple[tuple[str, str], ...] = (), kernels_dir: Path = KERNELS_DIR) -> ctypes.CDLL:
    """The shared library of <kernels_dir>/<source> (kernels/, or a mutated copy of it) with every
    entry exported as emu_<entry>; built once per content (kernel files, header, defines) into the
    temp folder."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) to build the CPU emulator with")
    files = sorted(kernels_dir.glob("*.cu")) + sorted(kernels_dir.glob("*.cuh"))
    digest = hashlib.sha256(HEADER.read_bytes() + repr(defines).encode() + source.encode())
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    out_dir = Path(tempfile.gettempdir()) / "kdtree-emulator" / digest.hexdigest()[:24]
    library = out_dir / "kernel.so"
    if not library.exists():
        work = Path(tempfile.mkdtemp(prefix="kdtree-emu-"))
        try:
            for f in files:
                (work / f.name).write_text(host_source(f.read_text()))
            glue = f'#include "{source}"\n' + "".join(f"EMU_EXPORT({e})\n" for e in entries(source, kernels_dir))
            (work / "glue.cpp").write_text(glue)
            cmd = [cxx, "-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-strict-aliasing",
                   "-Wno-unknown-pragmas", "-include", str(HEADER), f"-I{work}",
                   *(f"-D{k}={v}" for k, v in defines), str(work / "glue.cpp"), "-o", str(work / "kernel.so")]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"g++ could not build {source} for the emulator:\n{done.stderr[-4000:]}")
            out_dir.mkdir(parents=True, exist_ok=True)
            os.replace(work / "kernel.so", library)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return ctypes.CDLL(str(library))


def arch_features(arch: str | None) -> dict[str, int]:
    """The macro NVRTC defines for an arch-specific target (sm_90a: __CUDA_ARCH_FEAT_SM90_ALL), which
    a kernel's source may test to take the path that target runs (fp32_bf16x3's FX_QREG)."""
    m = re.fullmatch(r"sm_(\d+)a", arch or "")
    return {f"__CUDA_ARCH_FEAT_SM{m.group(1)}_ALL": 1} if m else {}


class EmulatedKernel:
    """kdtr.runtime.device.Kernel's launch, run on the CPU: the same arguments (CPU tensors in place of
    device tensors), refused where the emulated GPU could not launch it."""

    def __init__(self, source: str, name: str, defines: dict, gpu: "EmulatedGpu"):
        self.name, self.gpu = name, gpu
        built = build(Path(source).name, tuple(sorted((k, str(v)) for k, v in defines.items())), gpu.kernels_dir)
        self.function = getattr(built, f"emu_{name}")

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Any = None, *, dependent: bool = False) -> None:
        import torch

        from kdtr.runtime.device import _dims

        g, b = _dims(grid, "grid", self), _dims(block, "block", self)     # checked as a GPU launch is
        if shared_mem > self.gpu.smem_optin:
            raise self._fail(f"{shared_mem} B of shared memory, over the emulated GPU's {self.gpu.smem_optin} B")
        values: list[Any] = []
        for arg in args:
            if isinstance(arg, torch.Tensor):
                assert arg.device.type == "cpu" and arg.is_contiguous(), f"{self.name}: {arg.device}, contiguous"
                values.append(ctypes.c_void_p(arg.data_ptr()))
            else:
                values.append(arg)
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        error = ctypes.create_string_buffer(512)
        rc = self.function(pointers, *map(ctypes.c_uint, g + b), ctypes.c_uint(int(shared_mem)),
                           ctypes.c_int(self.gpu.order), ctypes.c_int(int(self.gpu.early_copies)), error,
                           ctypes.c_uint(len(error)))
        if rc != 0:
            raise self._fail(f"grid {g} block {b}: {error.value.decode()}")
        self.gpu.launches.append((self.name, g, b, int(shared_mem)))

    def _fail(self, what: str) -> RuntimeError:
        return RuntimeError(f"{self.name} (emulated): {what}")


class EmulatedGpu:
    """The stand-in for a GPU while the emulator runs (kdtr.runtime.device.stand_in): its arch, SM
    count and shared-memory limit, and its get_kernel building for the CPU; `order` is the thread
    order of every block (0 ascending, 1 descending, >= 2 a seeded shuffle); `early_copies` lands a
    cp.async copy as it is issued instead of at its wait. `launches` records (entry, grid, block,
    shared memory) per launch."""

    def __init__(self, arch: int, sms: int, smem_optin: int, order: int = 0, kernels_dir: Path = KERNELS_DIR,
                 early_copies: bool = False):
        self.arch, self.sms, self.smem_optin, self.order = arch, sms, smem_optin, order
        self.early_copies = early_copies
        self.kernels_dir = kernels_dir
        self.launches: list[tuple[str, tuple, tuple, int]] = []

    def get_kernel(self, source, name: str, defines, arch: str | None) -> EmulatedKernel:
        return EmulatedKernel(source, name, {**dict(defines), **arch_features(arch)}, self)


@contextlib.contextmanager
def emulated(arch: int, sms: int, smem_optin: int, order: int = 0, kernels_dir: Path = KERNELS_DIR,
             early_copies: bool = False) -> Iterator[EmulatedGpu]:
    """kdtr.runtime.device answering as the emulated GPU, and its get_kernel building for the CPU
    (from kernels_dir: kernels/, or a mutated copy)."""
    from kdtr.runtime import device

    with device.stand_in(EmulatedGpu(arch, sms, smem_optin, order, kernels_dir, early_copies)) as gpu:
        yield gpu
