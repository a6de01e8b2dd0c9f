"""`kdtree inspect`, `doctor` and `build`: what a bundle holds, what this machine can do, what NVRTC makes."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kdtr.errors import CompileError

from . import render
from .app import JsonOpt, JsonOut, app, guarded, refuse_overwriting_inputs


@app.command("inspect")
@guarded
def inspect_cmd(
    file: Path = typer.Argument(..., help="A .kdtr bundle."),
    json_path: Optional[str] = JsonOpt,
):
    """A bundle's header, and per tensor: role, dtype, shape, min/max/mean, NaN/Inf counts."""
    from kdtr.bundle.summary import summarize

    refuse_overwriting_inputs({"--json": json_path}, [file])
    _show(summarize(file), JsonOut(json_path), render.inspect_view)


@app.command("doctor")
@guarded
def doctor_cmd(json_path: Optional[str] = JsonOpt):
    """Versions, NVRTC, CUDA headers, GPUs, the cache folder and where kernels and suites come from."""
    from kdtr.records import doctor

    json_out = JsonOut(json_path)
    _show(doctor.facts(), json_out, render.doctor_view)


@app.command("build")
@guarded
def build_cmd(
    arch: List[str] = typer.Option(["sm_90"], "--arch", help="Target architecture(s), e.g. sm_90 sm_90a sm_120."),
    json_path: Optional[str] = JsonOpt,
):
    """Compile each kernel with NVRTC (no GPU needed) for the archs its launch can pick it on and report
    registers, shared memory, spills and what it serves there; the others are listed as not applicable."""
    from kdtr.runtime import nvrtc
    from kdtr.records import report
    from kdtr.config import config
    from kdtr.ops.placement import placements

    json_out = JsonOut(json_path)
    if not nvrtc.kernel_files():
        where = config()
        raise CompileError(f"no kernel sources (*.cu) in {where.kernels_dir} (from {where.kernels_from}); "
                           "set KDTREE_KERNELS_DIR to the folder that holds them")
    for target in arch:
        nvrtc.check_arch(target)              # a bad --arch is refused before anything compiles
    places = [p for target in arch for p in placements(target)]
    for p in places:                          # what the launch would compile must exist there too
        if p.applicable:
            nvrtc.check_arch(p.compile_arch)
    built = [(p, nvrtc.compile_kernel(p.source, p.compile_arch) if p.applicable else None) for p in places]
    with json_out.tables():
        render.build_table(built)
    json_out.write(lambda: {"meta": report.record_meta("build"), "nvrtc": list(nvrtc.nvrtc_version()),
                    "modules": [_build_entry(p, m) for p, m in built]})


def _build_entry(place, module) -> dict:
    entry = {"kernel": place.kernel, "source": place.source, "op_variant": place.op_variant,
             "arch": place.arch, "applicable": place.applicable, "compiled_for": place.compile_arch,
             "dynamic_shared_bytes": place.dynamic_shared_bytes, "serves": list(place.serves)}
    if module is None:
        return {**entry, "not_applicable": place.why_not}
    return {**entry, "cache_hit": module.cache_hit, "resources": module.resources}


def _show(data, json_out: JsonOut, view) -> None:
    """The JSON record where asked, and the rich view unless the JSON took stdout."""
    json_out.write(lambda: data)
    if not json_out.to_stdout:
        view(data)
