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
    from kdtr.summary import summarize

    refuse_overwriting_inputs({"--json": json_path}, [file])
    _show(summarize(file), JsonOut(json_path), render.inspect_view)


@app.command("doctor")
@guarded
def doctor_cmd(json_path: Optional[str] = JsonOpt):
    """Versions, NVRTC, CUDA headers, GPUs, the cache folder and where kernels and suites come from."""
    from kdtr import doctor

    json_out = JsonOut(json_path)
    _show(doctor.facts(), json_out, render.doctor_view)


@app.command("build")
@guarded
def build_cmd(
    arch: List[str] = typer.Option(["sm_90"], "--arch", help="Target architecture(s), e.g. sm_90 sm_90a sm_120."),
    json_path: Optional[str] = JsonOpt,
):
    """Compile every kernel with NVRTC (no GPU needed) and report registers, shared memory, spills."""
    from kdtr import nvrtc, report
    from kdtr.config import config

    json_out = JsonOut(json_path)
    sources = nvrtc.kernel_files()
    if not sources:
        where = config()
        raise CompileError(f"no kernel sources (*.cu) in {where.kernels_dir} (from {where.kernels_from}); "
                           "set KDTREE_KERNELS_DIR to the folder that holds them")
    for target in arch:
        nvrtc.check_arch(target)              # a bad --arch is refused before anything compiles
    modules = [nvrtc.compile_kernel(source, target) for source in sources for target in arch]
    with json_out.tables():
        render.build_table(modules)
    json_out.write(lambda: {"meta": report.record_meta("build"), "nvrtc": list(nvrtc.nvrtc_version()),
                    "modules": [{"source": m.source.name, "arch": m.arch, "cache_hit": m.cache_hit,
                                 "resources": m.resources} for m in modules]})


def _show(data, json_out: JsonOut, view) -> None:
    """The JSON record where asked, and the rich view unless the JSON took stdout."""
    json_out.write(lambda: data)
    if not json_out.to_stdout:
        view(data)
