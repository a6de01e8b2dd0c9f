"""kdtr.runtime.nvrtc on the CPU: every kernel compiles to a real cubin, the cache hits / heals, errors carry
the log, the ptxas report is parsed. No GPU needed (NVRTC runs on the host)."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from kdtr.runtime import nvrtc
from kdtr.config import config
from kdtr.errors import CompileError

ARCHS = ("sm_90", "sm_120")
TARGET_ARCH = "sm_90"              # the H200
ELF_MAGIC = b"\x7fELF"

# The shape of NVRTC 13.0's `--ptxas-options=-v` log, copied from a real compile.
PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 3.277 ms
ptxas info    : Function properties for helper
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     40 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 1.813 ms
"""

SMALL_KERNEL = """\
#include "small_helper.cuh"
extern "C" __global__ void small(float* x, int n) {
    __shared__ float tile[256];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    if ((int)threadIdx.x < n) x[threadIdx.x] = twice(tile[255 - threadIdx.x]);
}
"""


@pytest.fixture()
def small_source(tmp_path) -> Path:
    (tmp_path / "small_helper.cuh").write_text("__device__ inline float twice(float v) { return 2.f * v; }\n")
    path = tmp_path / "small.cu"
    path.write_text(SMALL_KERNEL)
    return path


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / nvrtc.CACHE_SUBDIR).glob("*.kcubin"))


def test_nvrtc_version_is_13():
    major, minor = nvrtc.nvrtc_version()
    assert major == 13 and minor >= 0


def test_kernel_files_are_the_registered_kernels():
    """Every kernels/*.cu is some op's registered kernel and every registered kernel has its file."""
    from kdtr.ops import cuda_kernels

    assert {p.name for p in nvrtc.kernel_files()} == {k.source for k in cuda_kernels()}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", [p.name for p in nvrtc.kernel_files()])
def test_every_kernel_compiles_without_spills(source, arch, cache_dir):
    module = nvrtc.compile_kernel(source, arch)
    assert module.cubin.startswith(ELF_MAGIC), "NVRTC must hand back a cubin, never PTX"
    assert module.arch == arch and module.source.name == source
    assert module.resources, f"no ptxas report parsed from:\n{module.log}"
    for r in module.resources:
        assert 0 < r.registers <= 255
        if arch == TARGET_ARCH:
            # a stack frame or spill on the H200 means registers went to local memory: a slow path
            # we don't ship (other archs only need to build)
            assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), (source, arch, r)


def sm90a_only(path: Path) -> bool:
    """A kernel whose header says `Target: sm_90a only`: its real body is built only for sm_90a
    (wgmma); for any other arch it compiles to an empty stub that the host never launches."""
    return re.search(r"^// Target: sm_90a only", path.read_text(), re.MULTILINE) is not None


SM90A_FILES = [p.name for p in nvrtc.kernel_files() if sm90a_only(p)]


def test_the_wgmma_kernel_is_marked_sm90a_only():
    assert "verify_attn_bf16_wgmma2.cu" in SM90A_FILES


@pytest.mark.parametrize("source", SM90A_FILES)
def test_sm90a_kernels_build_for_sm90a_without_spills_or_serialized_wgmma(source, cache_dir):
    """The real body of an sm_90a-only kernel (for sm_90 and sm_120 the test above builds only its
    stub: wgmma does not exist there, so those archs are skipped for the body by design)."""
    module = nvrtc.compile_kernel(source, "sm_90a")
    assert module.cubin.startswith(ELF_MAGIC)
    for r in module.resources:
        assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), (source, r)
    # ptxas C7510/C7515...: wgmma serialized (accumulators touched inside a pipeline stage): slow
    assert "wgmma.mma_async instructions are serialized" not in module.log, module.log


@pytest.mark.parametrize("defines", [{}, {"WG2_LPT": 2}, {"WG2_LPT": 2, "WG2_SEG_PREFETCH": 1}])
def test_wgmma_kernel_real_body_is_large_and_stub_is_small(defines, cache_dir):
    real = nvrtc.compile_kernel("verify_attn_bf16_wgmma2.cu", "sm_90a", defines=defines)
    stub = nvrtc.compile_kernel("verify_attn_bf16_wgmma2.cu", "sm_90", defines=defines)
    assert real.resource("verify_attn_bf16_wgmma2").registers > 128
    assert stub.resource("verify_attn_bf16_wgmma2").registers < 16


@pytest.mark.parametrize("arch", ["sm_86", "sm_89", "sm_120"])
@pytest.mark.parametrize("defines", [{"M99_SUM_SCATTER": 1}, {"M99_SKEW": 1}, {"M99_SUM_SCATTER": 1, "M99_SKEW": 1},
                                     {"M99_SKEW": 1, "M99_ROWS": 32}])
def test_bf16_mma99_knob_builds_fit_the_99k_gpus_registers_without_spills(defines, arch, cache_dir):
    """The opt-in builds device-round's mma99ab times, on the GPUs the kernel serves: one block of 384
    (or 256) threads an SM, so at most 168 registers (65,536 / 384) and nothing in local memory."""
    r = nvrtc.compile_kernel("verify_attn_bf16_mma99.cu", arch, defines=defines).resource("verify_attn_bf16_mma99")
    assert r.registers <= 65536 // (8 * int(defines.get("M99_ROWS", 48)))
    assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), (defines, arch, r)


def test_every_kernel_starts_with_its_contract():
    for path in nvrtc.kernel_files():
        head = path.read_text().lstrip()
        assert head.startswith("//"), f"{path.name} must open with its launch shape and contract"
        assert "Launch" in head[:2000], f"{path.name}: the opening comment names the launch shape"


def test_sm_90a_is_accepted(small_source, cache_dir):
    assert nvrtc.compile_kernel(small_source, "sm_90a").cubin.startswith(ELF_MAGIC)


@pytest.mark.parametrize("arch", ["compute_90", "sm90", "sm_9000", ""])
def test_bad_arch_is_a_compile_error(arch, small_source, cache_dir):
    with pytest.raises(CompileError, match="arch"):
        nvrtc.compile_kernel(small_source, arch)


def test_missing_source_is_a_compile_error(cache_dir):
    with pytest.raises(CompileError, match="not found"):
        nvrtc.compile_kernel("no_such_kernel.cu")


def test_second_compile_is_a_cache_hit(small_source, cache_dir):
    first = nvrtc.compile_kernel(small_source, "sm_90")
    second = nvrtc.compile_kernel(small_source, "sm_90")
    assert not first.cache_hit and second.cache_hit
    assert second.cubin == first.cubin and second.key == first.key
    assert second.resources == first.resources and second.log == first.log
    assert len(_entries(cache_dir)) == 1
    assert not list((cache_dir / nvrtc.CACHE_SUBDIR).glob("*.tmp")), "temp files must not linger"


def test_key_covers_arch_defines_options_and_headers(small_source, cache_dir):
    base = nvrtc.compile_kernel(small_source, "sm_90").key
    assert nvrtc.compile_kernel(small_source, "sm_120").key != base
    assert nvrtc.compile_kernel(small_source, "sm_90", defines={"N": 4}).key != base
    assert nvrtc.compile_kernel(small_source, "sm_90", extra_options=["-DEXTRA"]).key != base
    header = small_source.parent / "small_helper.cuh"
    header.write_text(header.read_text() + "// edited\n")
    edited = nvrtc.compile_kernel(small_source, "sm_90")
    assert edited.key != base and not edited.cache_hit, "an edited project header must miss the cache"


def test_no_cache_compiles_every_time(small_source, cache_dir, monkeypatch):
    monkeypatch.setenv("KDTREE_NO_CACHE", "1")
    config.cache_clear()
    assert not nvrtc.compile_kernel(small_source).cache_hit
    assert not nvrtc.compile_kernel(small_source).cache_hit
    assert not _entries(cache_dir)


def _sealed(header: bytes, cubin: bytes = b"\0" * 16) -> bytes:
    """An entry whose checksum is valid over a header that is not what the reader wants."""
    body = nvrtc.ENTRY_MAGIC + len(header).to_bytes(8, "little") + header + cubin
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "empty", "garbage_header",
                                    "list_header", "number_header", "bad_resources"])
def test_corrupt_entry_is_a_logged_miss_and_rebuilt(damage, small_source, cache_dir, caplog):
    good = nvrtc.compile_kernel(small_source, "sm_90")
    (entry,) = _entries(cache_dir)
    data = entry.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip_byte":
        data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    elif damage == "empty":
        data = b""
    elif damage == "list_header":
        data = _sealed(b"[1, 2, 3]")
    elif damage == "number_header":
        data = _sealed(b"42")
    elif damage == "bad_resources":       # the right key and cubin, resources not objects
        pos = len(nvrtc.ENTRY_MAGIC) + 8
        hlen = int.from_bytes(data[len(nvrtc.ENTRY_MAGIC):pos], "little")
        header = json.loads(data[pos:pos + hlen]) | {"resources": [17]}
        data = _sealed(json.dumps(header).encode(), data[pos + hlen:-32])
    else:
        data = nvrtc.ENTRY_MAGIC + (10**9).to_bytes(8, "little") + b"{" * 64
    entry.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="kdtr.runtime.nvrtc"):
        again = nvrtc.compile_kernel(small_source, "sm_90")
    assert not again.cache_hit and again.cubin == good.cubin
    assert any("corrupt" in rec.getMessage() for rec in caplog.records), "the miss must be logged"
    assert nvrtc.compile_kernel(small_source, "sm_90").cache_hit, "the rebuilt entry must be good"


def _compile_in_child(args):
    source, cache = args
    import os

    os.environ["KDTREE_CACHE_DIR"] = cache
    from kdtr.runtime import nvrtc as child_nvrtc
    from kdtr.config import config as child_config

    child_config.cache_clear()
    module = child_nvrtc.compile_kernel(source, "sm_90")
    return module.key, module.cubin


def test_concurrent_processes_share_the_cache_safely(small_source, cache_dir):
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=4, mp_context=ctx) as pool:
        results = list(pool.map(_compile_in_child, [(str(small_source), str(cache_dir))] * 8))
    assert len({key for key, _ in results}) == 1 and len({cubin for _, cubin in results}) == 1
    (entry,) = _entries(cache_dir)
    assert nvrtc.compile_kernel(small_source, "sm_90").cache_hit


def test_syntax_error_carries_log_options_and_excerpt(tmp_path, cache_dir):
    source = tmp_path / "broken.cu"
    lines = [f"// line {i}" for i in range(1, 10)]
    lines.append('extern "C" __global__ void broken(float* x) {')
    lines.append("    x[0] = undefined_name + 1.0f;")            # line 11
    lines.append("}")
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(CompileError) as info:
        nvrtc.compile_kernel(source, "sm_90")
    err = info.value
    text = str(err)
    assert err.file == str(source.resolve()) and err.line == 11
    assert f"{source.resolve()}:11" in text                      # file:line
    assert "undefined_name" in text and "error" in text          # the NVRTC log
    assert "-arch=sm_90" in text and "-std=c++17" in text        # the options
    assert re.search(r"^> 11 \| +x\[0\] = undefined_name", text, re.MULTILINE), text   # marked line
    assert re.search(r"^  10 \| extern", text, re.MULTILINE)      # numbered context
    assert not _entries(cache_dir), "a failed compile must not be cached"


def test_error_in_a_header_names_the_header(tmp_path, cache_dir):
    (tmp_path / "bad.cuh").write_text("__device__ float oops() { return nope; }\n")
    source = tmp_path / "uses_bad.cu"
    source.write_text('#include "bad.cuh"\nextern "C" __global__ void k(float* x) { x[0] = oops(); }\n')
    with pytest.raises(CompileError) as info:
        nvrtc.compile_kernel(source)
    assert "bad.cuh" in str(info.value) and "nope" in str(info.value)


def test_parse_resources_from_ptxas_log():
    resources = nvrtc.parse_resources(PTXAS_LOG)
    assert resources == (
        nvrtc.KernelResources("k", registers=128, shared_bytes=1024, local_bytes=40, spill_stores=40,
                              spill_loads=36),
        nvrtc.KernelResources("k2", registers=8, shared_bytes=0, local_bytes=0, spill_stores=0, spill_loads=0),
    )


def test_resource_report_of_a_real_compile(small_source, cache_dir):
    module = nvrtc.compile_kernel(small_source, "sm_90")
    r = module.resource("small")
    assert r.shared_bytes == 256 * 4 and r.registers > 0 and r.local_bytes == 0
    with pytest.raises(KeyError):
        module.resource("absent")


def test_cache_entry_header_is_json_with_checksum(small_source, cache_dir):
    module = nvrtc.compile_kernel(small_source, "sm_90")
    (entry,) = _entries(cache_dir)
    data = entry.read_bytes()
    assert data.startswith(nvrtc.ENTRY_MAGIC)
    start = len(nvrtc.ENTRY_MAGIC)
    size = int.from_bytes(data[start:start + 8], "little")
    header = json.loads(data[start + 8:start + 8 + size])
    assert header["key"] == module.key and header["cubin_bytes"] == len(module.cubin)
    assert header["resources"][0]["kernel"] == "small"


@pytest.mark.parametrize("per_lane", [1, 2, 4, 8, 16])
def test_tree_build_warp_keeps_candidates_in_registers(per_lane, cache_dir):
    """Every TB_NPL the host may pick: the register-resident candidates must not fall to local memory."""
    module = nvrtc.compile_kernel("tree_build_warp.cu", TARGET_ARCH, defines={"TB_NPL": per_lane})
    r = module.resource("tree_build_warp")
    assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), r


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_120", "sm_121"])
def test_the_verify_attn_kernels_each_gpu_serves_fit_it_without_spills(arch, cache_dir):
    """On A100 and the 99 KB GPUs, each bf16_paged kernel the launch picks builds for the arch it is
    picked on with 0 spills and asks for no more shared memory than the GPU has (kdtr/gpus.py)."""
    from kdtr.ops.placement import gpu_for, placements

    limit = gpu_for(arch).smem_optin
    serving = [p for p in placements(arch) if "verify_attn/bf16_paged" in p.serves]
    assert serving, f"no verify_attn/bf16_paged kernel serves {arch}"
    for p in serving:
        assert p.dynamic_shared_bytes + 64 <= limit, (p.kernel, arch)
        module = nvrtc.compile_kernel(p.source, p.compile_arch)
        for r in module.resources:
            assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), (p.kernel, arch, r)
