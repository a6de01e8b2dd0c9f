"""What `kdtree doctor` reports: versions, NVRTC, CUDA headers, GPUs, cache folder."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from . import __version__
from .config import config

PACKAGES = ("numpy", "torch", "ml_dtypes", "typer", "rich", "pyyaml", "cuda-bindings", "cuda-core",
            "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def facts() -> dict[str, Any]:
    """Each probe is independent: one missing piece is reported, never fatal."""
    out: dict[str, Any] = {"kdtree": __version__, "python": platform.python_version(),
                           "platform": platform.platform(),
                           "packages": {p: _version(p) for p in PACKAGES}}
    try:
        from .nvrtc import cuda_include_dir, nvrtc_version

        out["nvrtc"] = ".".join(map(str, nvrtc_version()))
        out["cuda_headers"] = str(cuda_include_dir())
    except Exception as err:      # a probe's failure is the fact we report
        out.setdefault("nvrtc", None)
        out["cuda_headers"] = None
        out["nvrtc_problem"] = f"{type(err).__name__}: {err}"
    try:
        import torch

        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else []
    except Exception as err:      # a broken driver is reported, not raised
        out["gpus"] = []
        out["gpu_problem"] = f"{type(err).__name__}: {err}"
    out["cache_dir"] = str(config().cache_dir)
    out["kernels_dir"] = str(config().kernels_dir)
    from .report import source_digest

    out["sources_sha256"] = source_digest()       # what records carry: matches a record to its code
    return out
