"""The GPU runtime: torch for memory, streams, events and CUDA graphs; the driver API for our cubins.

Modules are loaded into torch's primary context and kernels launched on torch's current stream, so
torch's CUDA-graph capture, events and allocator see our launches like their own. Every CUDA call's
result goes through `_check`. Nothing happens at import: torch and the driver start on first use.

`stand_in(gpu)` is the one hook for running our launches without a GPU: while it holds, the device
queries below answer as `gpu` and `get_kernel` returns its kernels (the CPU emulator of
tests/kernels/emulator/ plugs in there).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

from ..config import config
from ..errors import DeviceError, LaunchError
from .nvrtc import CompiledModule, compile_kernel

DEFAULT_SHARED_LIMIT = 48 * 1024      # dynamic shared memory a kernel gets without opting in

_lock = threading.RLock()          # re-entrant: get_kernel calls ensure_context under it
_kernels: dict[tuple, "Kernel"] = {}
_modules: dict[tuple, Any] = {}
# Per-device constants, asked of the driver once: launches ask for them every time (an eager launch
# is host-bound, so a driver round trip per launch is not free)
_archs: dict[int, str] = {}
_attributes: dict[tuple[str, int], int] = {}
_streams: dict[int, Any] = {}


def _driver():
    from cuda.bindings import driver

    return driver


def _error_text(result) -> str:
    driver = _driver()
    try:
        err, name = driver.cuGetErrorName(result)
        err2, desc = driver.cuGetErrorString(result)
        name = name.decode() if isinstance(name, bytes) else str(name)
        desc = desc.decode() if isinstance(desc, bytes) else str(desc)
        return f"{name}: {desc}"
    except Exception:  # noqa: BLE001 - the error text is best effort; the code is in the message
        return str(result)


def _check(result, what: str, *, error: type[DeviceError] = DeviceError) -> None:
    """Raise `error` naming `what` unless a driver call's result is CUDA_SUCCESS."""
    driver = _driver()
    if isinstance(result, tuple):
        result = result[0]
    if result != driver.CUresult.CUDA_SUCCESS:
        raise error(f"{what} failed: {_error_text(result)}")


def _call(fn, *args, what: str, error: type[DeviceError] = DeviceError):
    """Call a cuda-bindings driver function; check its result; return the other values."""
    out = fn(*args)
    if not isinstance(out, tuple):
        out = (out,)
    _check(out[0], what, error=error)
    rest = out[1:]
    return rest[0] if len(rest) == 1 else rest


# -- a stand-in for the GPU -----------------------------------------------------------------------

class StandIn(Protocol):
    """What answers for the device while `stand_in` holds: its compute capability as an integer (90
    for sm_90), SM count and opt-in shared memory per block, and its own kernels, whose `launch`
    takes Kernel.launch's arguments."""

    arch: int
    sms: int
    smem_optin: int

    def get_kernel(self, source: str | Path, name: str, defines: Mapping[str, str | int],
                   arch: str | None) -> Any: ...


_stand_in: StandIn | None = None


@contextlib.contextmanager
def stand_in(gpu: StandIn) -> Iterator[StandIn]:
    """While the block runs, `gpu` is the device: gpu_available() is True, device_arch,
    multiprocessor_count and max_shared_optin answer from it (KDTREE_GPU aside) and get_kernel
    returns gpu.get_kernel(source, name, defines, arch). For every thread of the process; not
    nested."""
    global _stand_in
    if _stand_in is not None:
        raise RuntimeError("a stand-in for the GPU is already in place")
    _stand_in = gpu
    try:
        yield gpu
    finally:
        _stand_in = None


# -- device queries --------------------------------------------------------------------------------

def gpu_available() -> bool:
    """True iff torch sees a CUDA GPU (or a stand-in is in place); never raises."""
    if _stand_in is not None:
        return True
    try:
        import torch

        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver install means "no GPU" here
        return False


def require_gpu() -> None:
    if gpu_available():
        return
    reason = "torch.cuda.is_available() is False"
    try:
        import torch

        reason += f" (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
    except Exception as exc:  # noqa: BLE001
        reason = f"torch cannot be imported: {exc}"
    raise DeviceError(f"no CUDA GPU found: {reason}")


def device_arch(device: int | None = None) -> str:
    """`sm_XY` of the current (or given) device, e.g. sm_90 on an H200."""
    if _stand_in is not None:
        return f"sm_{_stand_in.arch}"
    index = _device_index(device)
    arch = _archs.get(index)
    if arch is None:
        require_gpu()
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        arch = _archs[index] = f"sm_{major}{minor}"
    return arch


def _device_index(device: int | None = None) -> int:
    import torch

    if device is not None:
        return int(device)
    if not _archs:                    # nothing asked of a device yet: a missing GPU says so first
        require_gpu()
    return torch.cuda.current_device()


_contexts: dict[int, Any] = {}


def ensure_context(device: int | None = None):
    """Make torch's primary context of `device` current on this thread; returns it."""
    require_gpu()
    import torch

    index = _device_index(device)
    driver = _driver()
    ctx = _contexts.get(index)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(index)
            if ctx is None:
                torch.cuda.init()
                with torch.cuda.device(index):
                    torch.cuda.current_stream().synchronize()     # forces torch's context up
                _call(driver.cuInit, 0, what="cuInit")
                dev = _call(driver.cuDeviceGet, index, what=f"cuDeviceGet({index})")
                ctx = _call(driver.cuDevicePrimaryCtxRetain, dev,
                            what=f"cuDevicePrimaryCtxRetain({index})")
                _contexts[index] = ctx
    current = _call(driver.cuCtxGetCurrent, what="cuCtxGetCurrent")
    if current is None or int(current) != int(ctx):
        _call(driver.cuCtxSetCurrent, ctx, what="cuCtxSetCurrent")
    return ctx


def _device_attribute(attr_name: str, device: int | None) -> int:
    index = _device_index(device)
    value = _attributes.get((attr_name, index))
    if value is None:
        ensure_context(index)
        driver = _driver()
        attr = getattr(driver.CUdevice_attribute, attr_name)
        dev = _call(driver.cuDeviceGet, index, what=f"cuDeviceGet({index})")
        value = int(_call(driver.cuDeviceGetAttribute, attr, dev, what=f"cuDeviceGetAttribute({attr_name})"))
        _attributes[(attr_name, index)] = value
    return value


def max_shared_optin(device: int | None = None, *, own: bool = False) -> int:
    """The largest dynamic shared memory one block may opt in to (227 KB on Hopper); with
    KDTREE_GPU, at most that GPU's (launches then size themselves and refuse as there), unless `own`."""
    if _stand_in is not None:
        return _stand_in.smem_optin
    limit = _device_attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", device)
    run_as = None if own else config().run_as
    return limit if run_as is None else min(limit, run_as.smem_optin)


def multiprocessor_count(device: int | None = None) -> int:
    if _stand_in is not None:
        return _stand_in.sms
    return _device_attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", device)


# -- kernels ---------------------------------------------------------------------------------------

@dataclass
class Kernel:
    """One loaded entry function. `launch` runs it on torch's current stream."""

    name: str
    module: CompiledModule
    device: int
    function: Any
    _shared_limit: int = field(default=DEFAULT_SHARED_LIMIT, repr=False)

    def _fail(self, what: str) -> LaunchError:
        return LaunchError(f"kernel {self.name} ({self.module.source.name}, {self.module.arch}): {what}")

    def _set_shared(self, shared_mem: int) -> None:
        if shared_mem <= self._shared_limit:
            return
        limit = max_shared_optin(self.device)
        static = next((r.shared_bytes for r in self.module.resources if r.kernel == self.name), 0)
        if shared_mem + static > limit:
            run_as = config().run_as
            raise self._fail(f"needs {shared_mem} B dynamic + {static} B static shared memory; "
                             f"the device allows {limit} B per block"
                             + (f" (run as {run_as.label}: KDTREE_GPU)" if run_as else ""))
        driver = _driver()
        _check(driver.cuFuncSetAttribute(
            self.function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared_mem), f"cuFuncSetAttribute({self.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={shared_mem})",
            error=LaunchError)
        self._shared_limit = shared_mem

    def _marshal(self, args: Sequence[Any]) -> tuple[list[Any], Any]:
        import torch

        values: list[Any] = []
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                if arg.get_device() != self.device:                 # -1 on the CPU
                    raise self._fail(f"argument {i} is a tensor on {arg.device}, not cuda:{self.device}")
                if not arg.is_contiguous():
                    raise self._fail(f"argument {i} (shape {tuple(arg.shape)}) is not contiguous")
                values.append(ctypes.c_void_p(arg.data_ptr()))
            elif isinstance(arg, ctypes._SimpleCData):
                values.append(arg)
            else:
                raise self._fail(f"argument {i} is a {type(arg).__name__}; pass a torch tensor or a "
                                 "ctypes scalar (c_int, c_float, c_double...)")
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        return values, pointers

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
               shared_mem: int = 0, stream: Any = None, *, dependent: bool = False) -> None:
        """Launch on `stream` (a torch.cuda.Stream; default torch's current stream).

        `dependent` launches it as a programmatic dependent of the grid before it in the stream
        (sm_90+): it may be scheduled while that grid finishes, so the kernel must pass
        griddepcontrol.wait (attn_common.cuh's grid_dep_wait) before it touches global memory.
        """
        import torch

        g = _dims(grid, "grid", self)
        b = _dims(block, "block", self)
        ensure_context(self.device)
        self._set_shared(int(shared_mem))
        if stream is None:
            stream = torch.cuda.current_stream(self.device)
        handle = stream.cuda_stream if hasattr(stream, "cuda_stream") else int(stream)
        values, pointers = self._marshal(args)
        driver = _driver()
        cu_stream = _streams.get(handle)
        if cu_stream is None:
            cu_stream = _streams[handle] = driver.CUstream(handle)
        what = f"cuLaunchKernel{'Ex' if dependent else ''}({self.name}, grid={g}, block={b}, shared={shared_mem})"
        if dependent:
            result = driver.cuLaunchKernelEx(_dependent_config(g, b, int(shared_mem), cu_stream), self.function,
                                             ctypes.addressof(pointers), 0)
        else:
            result = driver.cuLaunchKernel(self.function, *g, *b, int(shared_mem), cu_stream,
                                           ctypes.addressof(pointers), 0)
        _check(result, what, error=LaunchError)
        del values                                        # kept alive until the launch returned


def _dependent_config(grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, stream: Any):
    """A CUlaunchConfig with programmatic stream serialization allowed."""
    driver = _driver()
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_mem
    config.hStream = stream
    config.attrs = [attr]
    config.numAttrs = 1
    return config


def _dims(value: int | Sequence[int], what: str, kernel: Kernel) -> tuple[int, int, int]:
    if type(value) is int and value >= 1:
        return value, 1, 1
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise kernel._fail(f"{what} {value!r} must be 1 to 3 positive sizes")
    return tuple(dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]


def _load_module(module: CompiledModule, device: int):
    key = (module.key, device)
    loaded = _modules.get(key)
    if loaded is None:
        driver = _driver()
        image = ctypes.create_string_buffer(module.cubin, len(module.cubin))   # the driver copies it
        loaded = _call(driver.cuModuleLoadData, ctypes.addressof(image),
                       what=f"cuModuleLoadData({module.source.name}, {module.arch})")
        _modules[key] = loaded
    return loaded


def get_kernel(source: str | Path, name: str, *, defines: Mapping[str, str | int] = {},
               device: int | None = None, arch: str | None = None) -> Kernel:
    """Compile `source` for the device's arch (through the cubin cache), load it, find `name`.

    `arch` overrides the arch compiled for; it must be the device's own, optionally with the `a`
    suffix (`sm_90a` on an sm_90 device, for wgmma kernels). Cached per (source, name, defines,
    device, arch). Call it before a CUDA-graph capture begins: loading a module is not allowed
    while a stream captures.
    """
    if _stand_in is not None:
        return _stand_in.get_kernel(source, name, defines, arch)
    index = _device_index(device)
    key = (str(source), name, tuple(sorted((k, str(v)) for k, v in defines.items())), index, arch)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    require_gpu()
    with _lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel
        own = device_arch(index)
        if arch is not None and arch not in (own, own + "a"):
            raise DeviceError(f"cannot run {arch} code on this device ({own}): {source} {name}")
        compiled = compile_kernel(source, arch or own, defines=defines)
        if compiled.resources and name not in {r.kernel for r in compiled.resources}:
            raise DeviceError(f"{compiled.source.name} has no kernel {name!r} "
                              f"(it has {sorted(r.kernel for r in compiled.resources)})")
        ensure_context(index)
        module = _load_module(compiled, index)
        driver = _driver()
        result, function = driver.cuModuleGetFunction(module, name.encode())
        if result == driver.CUresult.CUDA_ERROR_NOT_FOUND:      # resources may be absent from the log
            raise DeviceError(f"{compiled.source.name} has no kernel {name!r}")
        _check(result, f"cuModuleGetFunction({compiled.source.name}, {name})")
        kernel = Kernel(name=name, module=compiled, device=index, function=function)
        _kernels[key] = kernel
        return kernel


def synchronize(device: int | None = None) -> None:
    """Wait for the device; a failed kernel's error surfaces here as a DeviceError."""
    import torch

    try:
        torch.cuda.synchronize(device)
    except RuntimeError as exc:
        raise DeviceError(f"CUDA error after launch: {exc}") from exc


def loaded_kernels() -> list[dict]:
    """What this process compiled or took from the cubin cache: evidence that a rerun compiles nothing."""
    return [{"kernel": k.name, "source": k.module.source.name, "arch": k.module.arch,
             "cache_hit": k.module.cache_hit} for k in list(_kernels.values())]
