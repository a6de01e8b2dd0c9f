"""What `kdtree doctor` reports: versions, NVRTC, CUDA headers, GPUs, cache folder."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from .. import __version__
from ..config import config

PACKAGES = ("numpy", "torch", "ml_dtypes", "typer", "rich", "pyyaml", "cuda-bindings", "cuda-core",
            "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _gpu_names() -> list[str]:
    """The GPUs the CUDA driver sees, asked of the driver itself: doctor must not pay torch's
    import (seconds) to say that there is none."""
    from cuda.bindings import driver

    def call(fn, *args):
        result, *values = fn(*args)
        if result != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{fn.__name__} failed: {result.name}")
        return values[0] if values else None

    call(driver.cuInit, 0)
    names = []
    for index in range(call(driver.cuDeviceGetCount)):
        raw = call(driver.cuDeviceGetName, 256, call(driver.cuDeviceGet, index))
        names.append(raw.split(b"\0", 1)[0].decode())
    return names


def facts() -> dict[str, Any]:
    """Each probe is independent: one missing piece is reported, never fatal."""
    out: dict[str, Any] = {"kdtree": __version__, "python": platform.python_version(),
                           "platform": platform.platform(),
                           "packages": {p: _version(p) for p in PACKAGES}}
    try:
        from ..runtime.nvrtc import cuda_include_dir, nvrtc_version

        out["nvrtc"] = ".".join(map(str, nvrtc_version()))
        out["cuda_headers"] = str(cuda_include_dir())
    except Exception as err:      # a probe's failure is the fact we report
        out.setdefault("nvrtc", None)
        out["cuda_headers"] = None
        out["nvrtc_problem"] = f"{type(err).__name__}: {err}"
    try:
        out["gpus"] = _gpu_names()
    except Exception as err:      # a missing or broken driver is reported, not raised
        out["gpus"] = []
        out["gpu_problem"] = f"{type(err).__name__}: {err}"
    where = config()
    out["cache_dir"] = str(where.cache_dir)
    out["kernels_dir"], out["kernels_from"] = str(where.kernels_dir), where.kernels_from
    out["specs_dir"], out["specs_from"] = str(where.specs_dir), where.specs_from
    out["run_as"] = where.run_as.label if where.run_as else None     # KDTREE_GPU (docs/gpus.md)
    from .report import source_digest

    out["sources_sha256"] = source_digest()       # what records carry: matches a record to its code
    return out
