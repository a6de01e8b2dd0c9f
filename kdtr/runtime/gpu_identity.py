"""Which GPU a record's numbers come from: model, arch, SM count, clocks and the ceilings measured
in its run, as the `gpu` block of every record's meta ("host", no ceilings, where no GPU ran)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import UsageError

HOST = "host"
CEILING_FIELDS = ("hbm_read_gbps", "hbm_copy_gbps", "bf16_mma_tflops", "fp32_fma_tflops")


def check_ceilings(values: Any, field: str) -> None:
    """Measured ceilings as a record holds them (`field`: where, e.g. "ceilings"): every one of
    CEILING_FIELDS a positive finite number ("inf"/"nan" strings read as JSON holds them), else a
    UsageError naming the field; every figure is a share of them."""
    if not isinstance(values, Mapping):
        raise UsageError(f"expected an object of measured ceilings, got {type(values).__name__}", field=field)
    for name in CEILING_FIELDS:
        value = values.get(name)
        number = float(value) if value in ("inf", "-inf", "nan") else value
        if name not in values:
            raise UsageError("missing (a measured ceiling: a positive number)", field=f"{field}.{name}")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number < math.inf:
            raise UsageError(f"{value!r} is not a measured ceiling (a positive number)", field=f"{field}.{name}")


def gpu_meta(device: Mapping[str, Any]) -> dict[str, Any]:
    """meta.gpu from `report.device_info()`; `ceilings` is None until a bench run measures them."""
    return {"model": device.get("gpu") or HOST, "arch": device.get("capability"),
            "sms": device.get("multiprocessors"), "clock_sm_max": device.get("clock_sm_max"),
            "clock_mem": device.get("clock_mem"), "ceilings": None}


def with_ceilings(gpu: Mapping[str, Any], ceilings: Any) -> dict[str, Any]:
    """meta.gpu with the 100% lines a bench run measured (a bench.Ceilings, or None on the host)."""
    values = None if ceilings is None else {name: getattr(ceilings, name) for name in CEILING_FIELDS}
    return dict(gpu, ceilings=values)


@dataclass(frozen=True)
class GpuIdentity:
    """A record's GPU as read back; records written before meta.gpu existed are read from their
    meta.device and their top-level ceilings."""

    model: str
    arch: str | None = None
    sms: int | None = None
    clock_sm_max: str | None = None
    clock_mem: str | None = None
    ceilings: Mapping[str, float] | None = None

    @property
    def host(self) -> bool:
        return self.model == HOST

    @property
    def label(self) -> str:
        details = ", ".join(str(part) for part in (self.arch, f"{self.sms} SMs" if self.sms else None,
                                                   self.clock_sm_max) if part)
        return f"{self.model} ({details})" if details else self.model


def record_gpu(meta: Mapping[str, Any], ceilings: Any = None) -> GpuIdentity:
    """The GPU of a record from its meta (and, for older bench records, its Ceilings)."""
    gpu = meta.get("gpu")
    if not isinstance(gpu, Mapping):
        device = meta.get("device") if isinstance(meta.get("device"), Mapping) else {}
        gpu = with_ceilings(gpu_meta(device), ceilings)
    values = gpu.get("ceilings")
    if values is None and ceilings is not None:
        values = with_ceilings({}, ceilings)["ceilings"]
    return GpuIdentity(model=str(gpu.get("model") or HOST), arch=gpu.get("arch"), sms=gpu.get("sms"),
                       clock_sm_max=gpu.get("clock_sm_max"), clock_mem=gpu.get("clock_mem"),
                       ceilings=dict(values) if isinstance(values, Mapping) else None)
