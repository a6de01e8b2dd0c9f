"""What the GPU did while a timing ran: clocks, power and throttling through NVML, and clock locking.

Every turn of the interleaved rounds (a batch of samples of one implementation, see
schedule.interleave) is bracketed by two NVML readings: SM clock, memory clock, board power, the
current clock-event ("throttle") reasons and the driver's cumulative power and thermal violation
counters. A turn is throttled (`throttle_reasons`) when either reading names a throttling reason
or a violation counter advanced between them; its samples are left out of the figure and counted
(docs/timing.md). NVML comes from `nvidia-ml-py` (module `pynvml`), imported on first use; without
it, or without a GPU NVML sees, there is no telemetry and the record says why.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from ..errors import UsageError

# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*/nvmlClocksThrottleReason*): those
# that lower the clocks below what the workload asks for. Left out: GpuIdle (0x1), the
# applications-clocks setting (0x2, a lock the user asked for), SyncBoost (0x10), the display
# clock setting (0x100): none of them is the device slowing a busy kernel down.
THROTTLING = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
              0x80: "hw_power_brake"}
VIOLATIONS = ("power", "thermal")          # NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL


@dataclass(frozen=True)
class Reading:
    """One NVML reading of the GPU."""

    t_s: float                             # perf_counter seconds
    sm_mhz: int
    mem_mhz: int
    power_w: float
    reasons: int                           # the clock-event reason bitmask
    violation_ns: Mapping[str, int] = field(default_factory=dict)   # cumulative, per VIOLATIONS policy


def throttle_reasons(before: Reading, after: Reading) -> tuple[str, ...]:
    """Why the turn between two readings ran throttled (empty: it did not): a throttling reason bit
    set in either reading, or a power / thermal violation counter that advanced between them (the
    counters catch a throttle that came and went between the readings)."""
    bits = before.reasons | after.reasons
    names = [name for bit, name in THROTTLING.items() if bits & bit]
    for policy in VIOLATIONS:
        if after.violation_ns.get(policy, 0) > before.violation_ns.get(policy, 0):
            names.append(f"{policy}_violation")
    return tuple(names)


def turn_record(samples: int, before: Reading, after: Reading) -> dict:
    """A turn's telemetry as the record keeps it (JSON-ready)."""
    reasons = throttle_reasons(before, after)
    return {"samples": samples, "sm_mhz": [before.sm_mhz, after.sm_mhz], "mem_mhz": [before.mem_mhz, after.mem_mhz],
            "power_w": [round(before.power_w, 1), round(after.power_w, 1)], "throttled": list(reasons)}


def kept_turns(turns: Sequence[Sequence[float]], telemetry: Sequence[dict]) -> tuple[list[int], int, str]:
    """(indices of the turns whose samples make the figure, samples left out, a note): every turn
    not throttled; where every turn was throttled, all of them (a figure needs samples) and the
    note says so. Turns without telemetry are kept."""
    flagged = [i for i, t in enumerate(telemetry) if i < len(turns) and t.get("throttled")]
    if flagged and len(flagged) == len(turns):
        return list(range(len(turns))), 0, f"every turn ran throttled ({len(turns)}): figure from throttled samples"
    kept = [i for i in range(len(turns)) if i not in set(flagged)]
    dropped = sum(len(turns[i]) for i in flagged)
    note = f"{dropped} sample(s) of {len(flagged)} throttled turn(s) left out" if flagged else ""
    return kept, dropped, note


# -- NVML ----------------------------------------------------------------------------------------------

class Nvml:
    """The current CUDA device through NVML (matched by PCI bus id: NVML's numbering ignores
    CUDA_VISIBLE_DEVICES)."""

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle

    @staticmethod
    def open() -> "Nvml | str":
        """The device, or why there is no telemetry (one line)."""
        try:
            import pynvml as nvml
        except ImportError:
            return "no telemetry: nvidia-ml-py (pynvml) is not installed"
        try:
            import torch

            nvml.nvmlInit()
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            bus = getattr(props, "pci_bus_id", None)
            if bus is None:
                handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            else:
                pci = f"{props.pci_domain_id:08x}:{bus:02x}:{props.pci_device_id:02x}.0"
                handle = nvml.nvmlDeviceGetHandleByPciBusId(pci)
            return Nvml(nvml, handle)
        except Exception as err:  # noqa: BLE001 - any NVML failure means: no telemetry, and why
            return f"no telemetry: NVML: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"

    def read(self) -> Reading:
        n, h = self.nvml, self.handle
        reasons_of = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        violation = {}
        for policy, const in zip(VIOLATIONS, ("NVML_PERF_POLICY_POWER", "NVML_PERF_POLICY_THERMAL")):
            try:
                violation[policy] = int(n.nvmlDeviceGetViolationStatus(h, getattr(n, const)).violationTime)
            except Exception:  # noqa: BLE001 - a counter this driver lacks is left out
                pass
        return Reading(time.perf_counter(), int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                       int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)), n.nvmlDeviceGetPowerUsage(h) / 1e3,
                       int(reasons_of(h)), violation)


class ClockLockRefused(UsageError):
    """--lock-clocks where the driver does not allow it (no permission, not supported)."""


TDP_CLOCK = 0xFFFFFF01          # NVML_CLOCK_LIMIT_ID_TDP: the base clock the board sustains at its TDP


@contextlib.contextmanager
def locked_clocks(device: Nvml, sm_mhz: int | None = None) -> Iterator[dict]:
    """The SM clock locked while the block runs, at `sm_mhz` or (None) the board's base (TDP)
    clock, which it holds without power throttling (as nvbench's --lock-gpu-clocks base does);
    reset on the way out, also on Ctrl-C or an error. Yields what was asked. ClockLockRefused (one
    line) where the driver refuses."""
    n, h = device.nvml, device.handle
    target = int(sm_mhz) if sm_mhz else getattr(n, "NVML_CLOCK_LIMIT_ID_TDP", TDP_CLOCK)
    try:
        n.nvmlDeviceSetGpuLockedClocks(h, target, target)
    except Exception as err:  # noqa: BLE001 - NVML's error classes are generated per return code
        raise ClockLockRefused(f"--lock-clocks: the driver refuses to lock the SM clock ({err}); it needs "
                               "root, or lock it beforehand with nvidia-smi --lock-gpu-clocks") from None
    try:
        yield {"sm_mhz": int(sm_mhz) if sm_mhz else "base (TDP)"}
    finally:
        n.nvmlDeviceResetGpuLockedClocks(h)


@dataclass
class Watch:
    """What a bench run gets: `read` (None: no telemetry) and what the record says about it."""

    read: Callable[[], Reading] | None
    info: dict


@contextlib.contextmanager
def watching(gpu: bool, lock: bool, sm_mhz: int | None = None) -> Iterator[Watch]:
    """Telemetry for a run (and its clocks locked with `lock`); `info` names the source or why
    there is none, and the lock. --lock-clocks without NVML is refused (ClockLockRefused)."""
    device = Nvml.open() if gpu else "no telemetry: no GPU"
    if isinstance(device, str):
        if lock:
            raise ClockLockRefused(f"--lock-clocks needs NVML: {device.removeprefix('no telemetry: ')}")
        yield Watch(None, {"source": None, "why": device})
        return
    info = {"source": "nvml", "driver": _driver(device)}
    with contextlib.ExitStack() as stack:
        if lock:
            info["locked"] = stack.enter_context(locked_clocks(device, sm_mhz))
        yield Watch(device.read, info)


def _driver(device: Nvml) -> str | None:
    try:
        version = device.nvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - a name only
        return None
