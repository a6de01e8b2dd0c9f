"""Compile `kernels/*.cu` to cubins with NVRTC (cuda-python), with an on-disk cache.

Always a cubin for a real architecture (`sm_90`, `sm_90a`, `sm_120`...), never PTX: what we test is
the machine code that runs. The cache key is a sha256 over a canonical JSON of the cache format
version, the source text, the hash of every project header it includes (recursively), the options,
the architecture and the NVRTC version. An entry is one file: a JSON header (log, resources, sizes),
the cubin, and a trailing sha256 over both; a bad checksum is a logged miss and a rebuild.

Nothing happens at import: NVRTC is loaded and the cache folder created on first use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

from ..atomic import atomic_write
from ..config import config
from ..errors import CompileError

log = logging.getLogger(__name__)

CACHE_FORMAT = 1                      # bump when the entry layout or the key recipe changes
CACHE_SUBDIR = "cubin"
ENTRY_MAGIC = b"KDTRCUBIN1\n"
HEADER_LEN_BYTES = 8                  # little-endian length of the JSON header
CHECKSUM_BYTES = 32                   # trailing sha256 over magic + header + cubin
MAX_HEADER_BYTES = 16 << 20           # a header larger than this is corrupt
BASE_OPTIONS = ("-lineinfo", "-std=c++17", "--ptxas-options=-v")
EXCERPT_CONTEXT = 3                   # source lines shown either side of the first error
_ARCH_RE = re.compile(r"^sm_(\d+)(a|f)?$")
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_ERROR_RE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?:catastrophic )?error", re.MULTILINE)


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one entry function."""

    kernel: str
    registers: int
    shared_bytes: int       # static shared memory
    local_bytes: int        # stack frame
    spill_stores: int
    spill_loads: int


@dataclass(frozen=True)
class CompiledModule:
    source: Path
    arch: str
    key: str
    cubin: bytes
    log: str
    cache_hit: bool
    resources: tuple[KernelResources, ...]

    def resource(self, kernel: str) -> KernelResources:
        """The report of one entry function; KeyError naming the ones there are."""
        for r in self.resources:
            if r.kernel == kernel:
                return r
        raise KeyError(f"{kernel!r} not in {self.source.name} (has {[r.kernel for r in self.resources]})")


# -- NVRTC -----------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _nvrtc():
    """cuda-bindings' NVRTC module, its library loaded: a missing libnvrtc is one CompileError."""
    from cuda.bindings import nvrtc

    try:
        nvrtc.nvrtcVersion()           # cuda-bindings loads libnvrtc on the first call
    except Exception as err:  # noqa: BLE001 - cuda-pathfinder's not-found error has no stable base
        raise CompileError(f"NVRTC cannot be loaded ({type(err).__name__}: {str(err).splitlines()[0]}); "
                           "install nvidia-cuda-nvrtc") from err
    return nvrtc


def _nvrtc_check(result, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(result)
        text = msg.decode() if isinstance(msg, (bytes, bytearray)) else str(msg)
        raise CompileError(f"{what} failed: {text} ({result})")


@lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    result, major, minor = _nvrtc().nvrtcVersion()
    _nvrtc_check(result, "nvrtcVersion")
    return int(major), int(minor)


@lru_cache(maxsize=1)
def _supported_archs() -> tuple[int, ...]:
    result, archs = _nvrtc().nvrtcGetSupportedArchs()
    _nvrtc_check(result, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


@lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """The CUDA runtime headers (cuda_bf16.h...) that ship as a wheel beside NVRTC."""
    from cuda.pathfinder import find_nvidia_header_directory

    found = find_nvidia_header_directory("cudart")
    if not found:
        raise CompileError("CUDA runtime headers not found (install nvidia-cuda-runtime)")
    return Path(found)


def check_arch(arch: str) -> None:
    m = _ARCH_RE.match(arch)
    if not m:
        raise CompileError(f"arch {arch!r} is not a real architecture like sm_90, sm_90a or sm_120")
    if int(m.group(1)) not in _supported_archs():
        raise CompileError(f"arch {arch!r} is not supported by NVRTC {nvrtc_version()} "
                           f"(supports sm_{', sm_'.join(map(str, _supported_archs()))})")


# -- sources and keys ------------------------------------------------------------------------------

def kernel_files() -> list[Path]:
    """Every `kernels/*.cu`, sorted."""
    return sorted(config().kernels_dir.glob("*.cu"))


@lru_cache(maxsize=None)
def source_default(source: str, name: str) -> str | None:
    """The value kernel `source` gives `name` when the build passes no define for it (its
    `#ifndef NAME` / `#define NAME VALUE`), None without one: a launch that must agree with the
    build reads it here, so the kernel's header is the one place a default is set."""
    text = _resolve_source(source).read_text()
    found = re.search(rf"^#ifndef {re.escape(name)}\n#define {re.escape(name)} (\S+)", text, re.MULTILINE)
    return None if found is None else found.group(1)


def _resolve_source(source: str | Path) -> Path:
    path = Path(source)
    if not path.is_absolute() and not path.exists():
        path = config().kernels_dir / path
    if not path.is_file():
        raise CompileError(f"kernel source not found: {source} (looked in {config().kernels_dir})")
    return path.resolve()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _project_headers(source: Path, text: str) -> dict[str, str]:
    """{path relative to kernels/ (or absolute): sha256} of every project header, recursively.

    A quoted include is looked up beside the including file, then in kernels/; one found in
    neither is left to NVRTC (which reports it) and recorded as missing so the key still changes
    when it appears.
    """
    kernels_dir = config().kernels_dir.resolve()
    found: dict[str, str] = {}
    stack = [(source.parent, text)]
    seen: set[Path] = set()
    while stack:
        here, body = stack.pop()
        for name in _INCLUDE_RE.findall(body):
            for base in (here, kernels_dir):
                candidate = (base / name).resolve()
                if candidate.is_file():
                    break
            else:
                found.setdefault(name, "missing")
                continue
            if candidate in seen:
                continue
            seen.add(candidate)
            data = candidate.read_bytes()
            try:
                label = str(candidate.relative_to(kernels_dir))
            except ValueError:
                label = str(candidate)
            found[label] = _sha256(data)
            stack.append((candidate.parent, data.decode("utf-8", errors="replace")))
    return dict(sorted(found.items()))


def _options(arch: str, defines: Mapping[str, str | int], extra: Sequence[str]) -> list[str]:
    opts = [f"-arch={arch}", *BASE_OPTIONS,
            f"-I{config().kernels_dir.resolve()}", f"-I{cuda_include_dir()}"]
    for name in sorted(defines):
        value = defines[name]
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise CompileError(f"define {name}={value!r}: values are str or int")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise CompileError(f"define name {name!r} is not an identifier")
        opts.append(f"-D{name}={value}")
    opts.extend(extra)
    return opts


def _cache_key(text: str, headers: Mapping[str, str], options: Sequence[str], arch: str) -> str:
    blob = json.dumps({
        "format": CACHE_FORMAT,
        "source": text,
        "headers": dict(headers),
        "options": list(options),
        "arch": arch,
        "nvrtc": list(nvrtc_version()),
    }, sort_keys=True, separators=(",", ":"))
    return _sha256(blob.encode())


# -- ptxas report ------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_resources(log_text: str) -> tuple[KernelResources, ...]:
    """Per-entry-function numbers from a `ptxas -v` log (as NVRTC 13 prints it), sorted by name."""
    entries: dict[str, dict[str, int]] = {}
    current: str | None = None       # the entry the next 'Used' line belongs to
    props_for: str | None = None     # the function the next frame line belongs to
    for line in log_text.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            current = m.group(1)
            entries.setdefault(current, {})
            continue
        m = _PROPS_RE.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _FRAME_RE.search(line)
        if m and props_for is not None:
            if props_for in entries:
                e = entries[props_for]
                e["local"], e["spill_stores"], e["spill_loads"] = map(int, m.groups())
            props_for = None
            continue
        m = _USED_RE.search(line)
        if m and current is not None:
            e = entries[current]
            e["registers"] = int(m.group(1))
            s = _SMEM_RE.search(line)
            e["shared"] = int(s.group(1)) if s else 0
            current = None
    return tuple(
        KernelResources(kernel=name, registers=e.get("registers", 0), shared_bytes=e.get("shared", 0),
                        local_bytes=e.get("local", 0), spill_stores=e.get("spill_stores", 0),
                        spill_loads=e.get("spill_loads", 0))
        for name, e in sorted(entries.items()))


# -- errors ------------------------------------------------------------------------------------------

def _excerpt(path: Path, line: int) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lo, hi = max(1, line - EXCERPT_CONTEXT), min(len(lines), line + EXCERPT_CONTEXT)
    width = len(str(hi))
    return "\n".join(f"{'>' if n == line else ' '} {n:>{width}} | {lines[n - 1]}" for n in range(lo, hi + 1))


def _compile_error(source: Path, options: Sequence[str], log_text: str, what: str) -> CompileError:
    m = _ERROR_RE.search(log_text)
    line = None
    parts = [f"{what}", f"options: {' '.join(options)}", "NVRTC log:", log_text.rstrip() or "(empty)"]
    if m:
        err_file, line = Path(m.group("file")), int(m.group("line"))
        if not err_file.is_absolute():
            err_file = source.parent / err_file
        excerpt = _excerpt(err_file, line)
        if excerpt:
            parts += [f"{err_file}:{line}:", excerpt]
        if err_file.resolve() != source:
            line = None          # the error is in a header: the message names it
    return CompileError("\n".join(parts), file=source, line=line)


# -- cache -------------------------------------------------------------------------------------------

def _cache_dir() -> Path:
    return config().cache_dir / CACHE_SUBDIR


def _entry_path(key: str) -> Path:
    return _cache_dir() / f"{key}.kcubin"


def _encode_entry(key: str, source: Path, arch: str, cubin: bytes, log_text: str,
                  resources: Sequence[KernelResources]) -> bytes:
    header = json.dumps({
        "format": CACHE_FORMAT, "key": key, "source": str(source), "arch": arch,
        "cubin_bytes": len(cubin), "cubin_sha256": _sha256(cubin), "log": log_text,
        "resources": [r.__dict__ for r in resources],
    }, sort_keys=True).encode()
    body = ENTRY_MAGIC + len(header).to_bytes(HEADER_LEN_BYTES, "little") + header + cubin
    return body + hashlib.sha256(body).digest()


def _decode_entry(data: bytes, key: str) -> tuple[bytes, str, tuple[KernelResources, ...]]:
    """(cubin, log, resources); ValueError saying what is wrong with a bad entry."""
    if len(data) < len(ENTRY_MAGIC) + HEADER_LEN_BYTES + CHECKSUM_BYTES:
        raise ValueError(f"truncated ({len(data)} bytes)")
    body, checksum = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if hashlib.sha256(body).digest() != checksum:
        raise ValueError("checksum mismatch")
    if not body.startswith(ENTRY_MAGIC):
        raise ValueError("bad magic")
    pos = len(ENTRY_MAGIC)
    hlen = int.from_bytes(body[pos:pos + HEADER_LEN_BYTES], "little")
    pos += HEADER_LEN_BYTES
    if hlen > MAX_HEADER_BYTES or pos + hlen > len(body):
        raise ValueError(f"header length {hlen} out of range")
    header = json.loads(body[pos:pos + hlen])
    if not isinstance(header, dict):
        raise ValueError(f"header is a JSON {type(header).__name__}, not an object")
    cubin = body[pos + hlen:]
    if header.get("format") != CACHE_FORMAT or header.get("key") != key:
        raise ValueError("format or key mismatch")
    if header.get("cubin_bytes") != len(cubin) or header.get("cubin_sha256") != _sha256(cubin):
        raise ValueError("cubin size or hash mismatch")
    resources = tuple(KernelResources(**r) for r in header["resources"])
    return cubin, str(header["log"]), resources


def _read_cache(key: str) -> tuple[bytes, str, tuple[KernelResources, ...]] | None:
    path = _entry_path(key)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("kdtree cubin cache: cannot read %s (%s); recompiling", path, exc)
        return None
    try:
        return _decode_entry(data, key)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("kdtree cubin cache: corrupt entry %s (%s); recompiling", path, exc)
        return None


def _write_cache(key: str, entry: bytes) -> None:
    try:
        atomic_write(_entry_path(key), entry)     # readers see old or new, never half
    except OSError as exc:
        log.warning("kdtree cubin cache: cannot write %s (%s); continuing without caching", _cache_dir(), exc)


# -- compile -----------------------------------------------------------------------------------------

def _nvrtc_compile(source: Path, text: str, options: Sequence[str]) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    result, prog = nvrtc.nvrtcCreateProgram(text.encode(), str(source).encode(), 0, [], [])
    _nvrtc_check(result, f"nvrtcCreateProgram({source.name})")
    try:
        encoded = [o.encode() for o in options]
        (compile_result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        result, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _nvrtc_check(result, "nvrtcGetProgramLogSize")
        buf = bytearray(size)                      # NVRTC writes into it: bytearray, not bytes
        if size:
            (result,) = nvrtc.nvrtcGetProgramLog(prog, buf)
            _nvrtc_check(result, "nvrtcGetProgramLog")
        log_text = bytes(buf).rstrip(b"\0").decode(errors="replace")
        if compile_result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(source, options, log_text, f"NVRTC failed to compile {source}")
        result, size = nvrtc.nvrtcGetCUBINSize(prog)
        _nvrtc_check(result, "nvrtcGetCUBINSize")
        if size == 0:
            raise _compile_error(source, options, log_text, f"NVRTC made no cubin for {source}")
        cubin = bytearray(size)
        (result,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _nvrtc_check(result, "nvrtcGetCUBIN")
        return bytes(cubin), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_kernel(source: str | Path, arch: str = "sm_90", *, defines: Mapping[str, str | int] = {},
                   extra_options: Sequence[str] = ()) -> CompiledModule:
    """Compile one .cu (a path, or a name under kernels/) to a cubin for `arch`, through the cache."""
    check_arch(arch)
    path = _resolve_source(source)
    text = path.read_text()
    options = _options(arch, defines, extra_options)
    key = _cache_key(text, _project_headers(path, text), options, arch)
    use_cache = not config().no_cache
    if use_cache:
        hit = _read_cache(key)
        if hit is not None:
            cubin, log_text, resources = hit
            return CompiledModule(path, arch, key, cubin, log_text, True, resources)
        log.debug("kdtree cubin cache: miss %s %s %s", path.name, arch, key[:12])
    cubin, log_text = _nvrtc_compile(path, text, options)
    resources = parse_resources(log_text)
    if use_cache:
        _write_cache(key, _encode_entry(key, path, arch, cubin, log_text, resources))
    return CompiledModule(path, arch, key, cubin, log_text, False, resources)
