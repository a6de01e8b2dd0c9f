"""Our kernels forced by name with compile-time knobs (`--kernel NAME`, `--define NAME:KNOB=V,...`):
the builds bench times as rows of their own, verify checks against the goldens and the GPU scripts
profile; parsed and checked once, here, for all of them."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable

from ..errors import UsageError
from ..runtime.nvrtc import source_default


@dataclass(frozen=True)
class KernelBuild:
    """One of our kernels forced by name (`--kernel`), optionally built with compile-time defines
    (`--define`, a knob build): a row of its own in every case of its op and variant."""

    name: str
    defines: tuple[tuple[str, str], ...] = ()
    launch: tuple[str, ...] = ()          # those of its defines that set the launch (launch_knobs)

    @property
    def label(self) -> str:
        """The row's implementation name: fp32_bf16x3, or fp32_bf16x3[FX_NREG_S=232] for a knob build."""
        knobs = ",".join(f"{k}={v}" for k, v in self.defines)
        return f"{self.name}[{knobs}]" if knobs else self.name


_KNOB = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VALUE = re.compile(r"[A-Za-z0-9_.+-]+")


def _launch_value_ok(kernel, knob: str, value: str) -> bool:
    """A launch knob's value: 0 or 1 for a switch (its source's default is 0 or 1: bf16_wgmma2's
    WG2_LPT, WG2_PDL; the balance knob also 2: WG2_LPT's segment schedule), else a positive integer
    (SPLITS, CHUNK, M99_ROWS)."""
    if knob == getattr(kernel, "balance_knob", None):
        return value in ("0", "1", "2")
    if source_default(kernel.source, knob) in ("0", "1"):
        return value in ("0", "1")
    return value.isdigit() and int(value) >= 1


def kernel_builds(kernels: Iterable[str] = (), defines: Iterable[str] = ()) -> tuple[KernelBuild, ...]:
    """The builds of `--kernel NAME` (each plain) then `--define NAME:KNOB=VALUE[,KNOB=VALUE...]`
    (each one build), in that order; every name one our ops can force, each build given once.
    UsageError naming the fault (an unknown kernel: with the list of known ones)."""
    from ..ops import get_op, op_names

    builds = [KernelBuild(name) for name in kernels]
    for text in defines:
        name, colon, knobs = text.partition(":")
        pairs = [knob.partition("=") for knob in knobs.split(",")] if colon else []
        if not pairs or any(not (_KNOB.fullmatch(k) and eq and _VALUE.fullmatch(v)) for k, eq, v in pairs):
            raise UsageError(f"--define {text!r}: expected KERNEL:KNOB=VALUE[,KNOB=VALUE...] (a C identifier "
                             "and a plain value)")
        builds.append(KernelBuild(name, tuple((k, v) for k, _, v in pairs)))
    registry = {k.name: k for op in map(get_op, op_names()) for k in op.kernels}
    unknown = list(dict.fromkeys(b.name for b in builds if b.name not in registry))
    if unknown:
        raise UsageError(f"unknown kernel {', '.join(map(repr, unknown))}; known: "
                         + ", ".join(f"{k.name} ({k.op})" for k in registry.values()))
    for i, build in enumerate(builds):
        launch = tuple(k for k, _ in build.defines if k in registry[build.name].launch_knobs)
        kernel = registry[build.name]
        bad = [f"{k}={v}" for k, v in build.defines if k in launch and not _launch_value_ok(kernel, k, v)]
        if bad:
            raise UsageError(f"--define {build.label}: {', '.join(bad)}: a launch knob takes a positive integer "
                             "(a switch, one whose source default is 0 or 1, takes 0 or 1; a balance knob also 2)")
        builds[i] = replace(build, launch=launch)
    twice = [label for label, n in Counter(b.label for b in builds).items() if n > 1]
    if twice:
        raise UsageError(f"kernel build given twice: {', '.join(twice)}")
    return tuple(builds)
