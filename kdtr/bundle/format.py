"""KDTR v1 read/write: the golden bundle container of docs/format.md.

The reader trusts nothing in the file: every header value is checked against the real file size
with Python integers before anything sized by it is allocated, and every tensor's crc32 (and every
bool byte) is checked before `read_bundle` returns. Tensors come back as read-only views of one
memory map. The writer lays tensors out 64-byte aligned, writes a temp file in the target folder and
renames it. kdtr/include/kdtr.h makes the same checks in C, with the same named limits.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
import zlib
from contextlib import suppress
from dataclasses import dataclass, field
from math import isfinite, prod
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from kdtr.atomic import atomic_open
from kdtr.dtypes import NUMPY_DTYPES, kdtr_dtype
from kdtr.errors import BundleError, WriteError

MAGIC = b"KDTR"
MAJOR, MINOR = 1, 0
PREAMBLE = struct.Struct("<4sHHQII")    # magic, major, minor, header_len, header crc32, reserved
ALIGN = 64

MAX_HEADER_LEN = 64 << 20               # bytes of JSON header a reader accepts
MAX_NDIM = 32                           # dimensions per tensor (kdtr.h has a fixed shape array)
MAX_JSON_DEPTH = 64                     # nesting of JSON arrays/objects, the top-level object is 1
MAX_TENSOR_BYTES = (1 << 63) - 1        # product of the non-zero dims times itemsize (int64, numpy)
MAX_INT_DIGITS = 4300                   # digits of a JSON integer (Python 3.11's int() limit)
_CHECK_CHUNK = 1 << 16                  # padding and bool bytes are scanned this many at a time

ROLES = ("input", "output", "aux")
TOP_KEYS = ("data_len", "meta", "tensors")
TENSOR_KEYS = ("name", "role", "dtype", "shape", "offset", "nbytes", "crc32")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it (offset is relative to data_start)."""

    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc32: int


@dataclass(frozen=True, eq=False)
class Bundle:
    """A fully validated bundle; its arrays are read-only views of the file's memory map."""

    path: Path
    meta: dict
    version: tuple[int, int]
    entries: tuple[TensorEntry, ...]
    data_start: int
    data_len: int
    _buffer: Any = field(repr=False)
    _index: dict = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_index", {e.name: e for e in self.entries})

    def entry(self, name: str) -> TensorEntry:
        """The header entry of `name`; a BundleError listing the names instead of a KeyError."""
        try:
            return self._index[name]
        except (KeyError, TypeError):
            have = ", ".join(repr(e.name) for e in self.entries) or "none"
            raise BundleError(f"no tensor {name!r} (has {have})", file=self.path) from None

    def array(self, name: str) -> np.ndarray:
        """A read-only, zero-copy view of tensor `name`."""
        e = self.entry(name)
        dtype = NUMPY_DTYPES[e.dtype]
        view = np.frombuffer(self._buffer, dtype=dtype, count=e.nbytes // dtype.itemsize,
                             offset=self.data_start + e.offset).reshape(e.shape)
        view.flags.writeable = False
        return view

    def arrays(self, role: str) -> dict[str, np.ndarray]:
        """All tensors of `role` ("input", "output" or "aux"), in file order."""
        if role not in ROLES:
            raise BundleError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})",
                            file=self.path)
        return {e.name: self.array(e.name) for e in self.entries if e.role == role}


# ----------------------------------------------------------------------------------------- reading

def read_bundle(path) -> Bundle:
    """Open, validate completely and map a bundle; any fault is a one-line BundleError."""
    path = Path(path)
    buf = _map_file(path)
    try:
        return _read_mapped(path, buf)
    except BaseException:
        with suppress(BufferError):     # a view still held by a traceback frame keeps it open
            buf.close()
        raise


def read_meta(path) -> dict:
    """A bundle's meta, from its preamble and header alone (the tensors neither read nor checked):
    for decisions made before a run, such as its memory estimate. Faults as read_bundle's."""
    path = Path(path)
    buf = _map_file(path)
    try:
        major, minor, header_len = _check_preamble(path, buf)
        return _check_top(path, _parse_header(path, buf[PREAMBLE.size:PREAMBLE.size + header_len]), minor)[0]
    finally:
        buf.close()


def _read_mapped(path: Path, buf: mmap.mmap) -> Bundle:
    """The checks in the spec's order: preamble, header, layout, then the bytes themselves."""
    size = len(buf)
    major, minor, header_len = _check_preamble(path, buf)
    header = _parse_header(path, buf[PREAMBLE.size:PREAMBLE.size + header_len])
    meta, data_len, raw_tensors = _check_top(path, header, minor)
    entries = _check_entries(path, raw_tensors, minor)
    data_start = _align(PREAMBLE.size + header_len)
    _check_layout(path, entries, data_start, data_len, size)
    _check_zero(path, buf, PREAMBLE.size + header_len, data_start, "padding after the header")
    _check_gaps(path, buf, entries, data_start)
    for e in entries:
        _check_tensor_bytes(path, buf, e, data_start)
    return Bundle(path, meta, (major, minor), entries, data_start, data_len, buf)


def _map_file(path: Path) -> mmap.mmap:
    """mmap the whole file (never empty once it holds a preamble); OS faults become BundleError."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise BundleError("is a directory, not a KDTR bundle", file=path)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError("is not a regular file", file=path)
        with open(path, "rb") as f:
            if st.st_size < PREAMBLE.size:
                _check_short(path, f.read(PREAMBLE.size))
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:      # ValueError: emptied between stat and mmap
        raise BundleError(f"cannot read: {getattr(e, 'strerror', None) or e}", file=path) from None


def _check_short(path: Path, head: bytes) -> None:
    """A file shorter than the preamble: say 'not KDTR' if its first bytes already disagree."""
    if not MAGIC.startswith(head[:len(MAGIC)]):
        raise BundleError(f"bad magic {head[:4]!r}, not a KDTR file", file=path)
    raise BundleError(f"truncated: {len(head)} bytes, shorter than the {PREAMBLE.size}-byte preamble",
                    file=path)


def _check_preamble(path: Path, buf: mmap.mmap) -> tuple[int, int, int]:
    """Magic, major, reserved, header length (against limit and file) and header crc32."""
    magic, major, minor, header_len, crc, reserved = PREAMBLE.unpack_from(buf, 0)
    if magic != MAGIC:
        raise BundleError(f"bad magic {magic!r}, not a KDTR file", file=path)
    if major != MAJOR:
        raise BundleError(f"unsupported major version {major}.{minor} (this reader reads {MAJOR}.x)",
                        file=path)
    if reserved != 0:
        raise BundleError(f"reserved field is 0x{reserved:08x}, must be 0", file=path)
    if header_len > MAX_HEADER_LEN:
        raise BundleError(f"header_len {header_len} exceeds the limit of {MAX_HEADER_LEN} bytes",
                        file=path)
    if header_len > len(buf) - PREAMBLE.size:
        raise BundleError(f"truncated: header_len {header_len} but only "
                        f"{len(buf) - PREAMBLE.size} bytes follow the preamble", file=path)
    actual = zlib.crc32(memoryview(buf)[PREAMBLE.size:PREAMBLE.size + header_len])
    if actual != crc:
        raise BundleError(f"header crc32 mismatch (preamble 0x{crc:08x}, header 0x{actual:08x})",
                        file=path)
    return major, minor, header_len


class _JsonFault(ValueError):
    """Raised from json hooks so the reader can tell its own faults from syntax errors."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """object_pairs_hook: JSON allows duplicate keys, KDTR does not (readers would disagree)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _JsonFault(f"duplicate JSON key {key!r}")
            seen.add(key)
    return out


def _no_constant(name: str):
    """parse_constant hook: NaN / Infinity are not JSON and C readers refuse them."""
    raise _JsonFault(f"JSON constant {name} is not allowed")


def _parse_int(text: str) -> int:
    """parse_int hook: the same digit limit on every Python version and in kdtr.h."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _JsonFault(f"integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_header(path: Path, raw: bytes) -> Any:
    """Strict UTF-8 and strict JSON, then the tree limits both readers share."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(f"header is not valid UTF-8 ({e.reason} at byte {e.start})",
                        file=path) from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                         parse_int=_parse_int)
    except _JsonFault as e:
        raise BundleError(f"invalid JSON header: {e}", file=path) from None
    except RecursionError:
        raise BundleError(f"invalid JSON header: nested deeper than {MAX_JSON_DEPTH} levels",
                        file=path) from None
    except ValueError as e:
        raise BundleError(f"invalid JSON header: {e}", file=path) from None
    fault = _json_fault(doc, 1, [])
    if fault:
        raise BundleError(f"invalid JSON header: {fault}", file=path)
    return doc


def _json_fault(value: Any, depth: int, where: list[str]) -> str | None:
    """The first thing in a JSON tree that KDTR refuses (deep nesting, lone surrogates, inf,
    non-string keys, non-JSON types), or None; shared by reader and writer so they agree."""
    def at() -> str:
        return "".join(where).lstrip(".") or "header"

    if isinstance(value, (dict, list, tuple)):
        if depth > MAX_JSON_DEPTH:
            return f"{at()}: nested deeper than {MAX_JSON_DEPTH} levels"
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict):
                if not isinstance(key, str):
                    return f"{at()}: key {key!r} is not a string"
                fault = _string_fault(key)
                if fault:
                    return f"{at()}: key {key!r} {fault}"
            where.append(f".{key}" if isinstance(value, dict) else f"[{key}]")
            fault = _json_fault(item, depth + 1, where)
            where.pop()
            if fault:
                return fault
        return None
    if isinstance(value, str):
        fault = _string_fault(value)
        return f"{at()}: {fault}" if fault else None
    if isinstance(value, float):
        return None if isfinite(value) else f"{at()}: number {value} is not finite"
    if value is None or isinstance(value, int):
        return None
    return f"{at()}: {type(value).__module__}.{type(value).__qualname__} is not a JSON value"


def _string_fault(text: str) -> str | None:
    """A string that cannot be UTF-8 (a lone surrogate from a \\uD800 escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate, not valid Unicode"
    return None


def _is_int(value: Any) -> bool:
    """A JSON integer: `true` and `2.0` are not (bool is a subclass of int in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    """A short rendering of a header value for a message."""
    text = json.dumps(value, ensure_ascii=True, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_keys(path: Path, obj: dict, known: tuple[str, ...], minor: int, where: str) -> None:
    """Required keys present; unknown ones refused unless the file is of a newer minor."""
    missing = [k for k in known if k not in obj]
    if missing:
        raise BundleError(f"missing key {missing[0]!r}", file=path, field=where or None)
    unknown = [k for k in obj if k not in known]
    if unknown and minor <= MINOR:
        raise BundleError(f"unknown key {unknown[0]!r} in a v{MAJOR}.{minor} file", file=path,
                        field=where or None)


def _check_top(path: Path, doc: Any, minor: int) -> tuple[dict, int, list]:
    """The top-level object: data_len, meta, tensors with their types."""
    if not isinstance(doc, dict):
        raise BundleError(f"header must be a JSON object, got {_show(doc)}", file=path)
    _check_keys(path, doc, TOP_KEYS, minor, "")
    if not _is_int(doc["data_len"]) or doc["data_len"] < 0:
        raise BundleError(f"must be an integer >= 0, got {_show(doc['data_len'])}", file=path,
                        field="data_len")
    if not isinstance(doc["meta"], dict):
        raise BundleError(f"must be an object, got {_show(doc['meta'])}", file=path, field="meta")
    if not isinstance(doc["tensors"], list):
        raise BundleError(f"must be an array, got {_show(doc['tensors'])}", file=path,
                        field="tensors")
    return doc["meta"], doc["data_len"], doc["tensors"]


def _check_entries(path: Path, raw: list, minor: int) -> tuple[TensorEntry, ...]:
    """Every tensor entry on its own, then unique names."""
    entries = tuple(_check_entry(path, i, item, minor) for i, item in enumerate(raw))
    seen: set[str] = set()
    for i, e in enumerate(entries):
        if e.name in seen:
            raise BundleError(f"duplicate tensor name {e.name!r}", file=path, field=f"tensors[{i}]")
        seen.add(e.name)
    return entries


def _check_entry(path: Path, i: int, item: Any, minor: int) -> TensorEntry:
    """Types, enumerations, dimensions and nbytes = prod(shape) * itemsize of one entry."""
    where = f"tensors[{i}]"

    def fail(key: str, message: str):
        raise BundleError(message, file=path, field=f"{where}.{key}")

    if not isinstance(item, dict):
        raise BundleError(f"must be an object, got {_show(item)}", file=path, field=where)
    _check_keys(path, item, TENSOR_KEYS, minor, where)
    name, role, dtype, shape = item["name"], item["role"], item["dtype"], item["shape"]
    if not isinstance(name, str) or not name or "\0" in name:
        fail("name", f"must be a non-empty string without NUL, got {_show(name)}")
    if not isinstance(role, str) or role not in ROLES:
        fail("role", f"unknown role {_show(role)} (expected one of {', '.join(ROLES)})")
    if not isinstance(dtype, str) or dtype not in NUMPY_DTYPES:
        fail("dtype", f"unknown dtype {_show(dtype)} (expected one of {', '.join(NUMPY_DTYPES)})")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        fail("shape", f"must be an array of at most {MAX_NDIM} dimensions, got {_show(shape)}")
    for d in shape:
        if not _is_int(d) or d < 0:
            fail("shape", f"dimension {_show(d)} is not a non-negative integer")
    for key in ("offset", "nbytes"):
        if not _is_int(item[key]) or item[key] < 0:
            fail(key, f"must be an integer >= 0, got {_show(item[key])}")
    if not _is_int(item["crc32"]) or not 0 <= item["crc32"] < 1 << 32:
        fail("crc32", f"must be an integer in [0, 2**32), got {_show(item['crc32'])}")
    itemsize = NUMPY_DTYPES[dtype].itemsize
    if prod(d for d in shape if d) * itemsize > MAX_TENSOR_BYTES:
        fail("shape", f"shape {shape} of {dtype} is too large (over {MAX_TENSOR_BYTES} bytes)")
    expected = prod(shape) * itemsize
    if item["nbytes"] != expected:
        fail("nbytes", f"nbytes {item['nbytes']} != prod(shape {shape}) * {itemsize} = {expected}")
    if item["offset"] % ALIGN:
        fail("offset", f"offset {item['offset']} is not aligned to {ALIGN}")
    return TensorEntry(name, role, dtype, tuple(shape), item["offset"], item["nbytes"],
                       item["crc32"])


def _check_layout(path: Path, entries, data_start: int, data_len: int, size: int) -> None:
    """The declared layout covers the file exactly; tensors lie inside data_len, disjoint."""
    if size != data_start + data_len:
        kind = "truncated" if size < data_start + data_len else "trailing bytes"
        raise BundleError(f"{kind}: file is {size} bytes but data_start {data_start} + data_len "
                        f"{data_len} = {data_start + data_len}", file=path)
    end = 0
    for e in entries:
        if e.offset + e.nbytes > data_len:
            raise BundleError(f"bytes [{e.offset}, {e.offset + e.nbytes}) run past data_len "
                            f"{data_len}", file=path, field=f"tensor {e.name!r}")
        if e.nbytes:
            end = max(end, e.offset + e.nbytes)
    if end != data_len:
        raise BundleError(f"data_len {data_len} is not the end of the last tensor ({end}); "
                        "nothing may follow it", file=path, field="data_len")
    placed = sorted((e for e in entries if e.nbytes), key=lambda e: e.offset)
    for a, b in zip(placed, placed[1:]):
        if b.offset < a.offset + a.nbytes:
            raise BundleError(f"overlaps tensor {a.name!r} (bytes [{a.offset}, "
                            f"{a.offset + a.nbytes}) and [{b.offset}, {b.offset + b.nbytes}))",
                            file=path, field=f"tensor {b.name!r}")


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True, without an index array the size of the faults."""
    return int(mask.argmax()) if mask.any() else None


def _check_zero(path: Path, buf: mmap.mmap, start: int, stop: int, what: str) -> None:
    """Padding must be zero bytes (checked in bounded chunks, without copying the file)."""
    for lo in range(start, stop, _CHECK_CHUNK):
        view = np.frombuffer(buf, dtype=np.uint8, count=min(_CHECK_CHUNK, stop - lo), offset=lo)
        at = _first(view != 0)
        if at is not None:
            raise BundleError(f"non-zero {what} byte 0x{view[at]:02x} at file offset {lo + at}", file=path)


def _check_gaps(path: Path, buf: mmap.mmap, entries, data_start: int) -> None:
    """Every data byte outside a tensor is padding and must be zero."""
    cursor = 0
    for e in sorted((e for e in entries if e.nbytes), key=lambda e: e.offset):
        _check_zero(path, buf, data_start + cursor, data_start + e.offset, "padding")
        cursor = e.offset + e.nbytes


def _check_tensor_bytes(path: Path, buf: mmap.mmap, e: TensorEntry, data_start: int) -> None:
    """crc32 of the tensor's bytes, and for bool that every byte is 0 or 1."""
    start = data_start + e.offset
    with memoryview(buf) as whole, whole[start:start + e.nbytes] as view:
        actual = zlib.crc32(view)
    if actual != e.crc32:
        raise BundleError(f"crc32 mismatch (header 0x{e.crc32:08x}, data 0x{actual:08x})",
                        file=path, field=f"tensor {e.name!r}")
    if e.dtype == "bool":
        for lo in range(0, e.nbytes, _CHECK_CHUNK):
            n = min(_CHECK_CHUNK, e.nbytes - lo)
            chunk = np.frombuffer(buf, dtype=np.uint8, count=n, offset=start + lo)
            bad = _first(chunk > 1)
            if bad is not None:
                raise BundleError(f"bool byte 0x{chunk[bad]:02x} at element {lo + bad}"
                                " is neither 0 nor 1", file=path, field=f"tensor {e.name!r}")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# ----------------------------------------------------------------------------------------- writing

def bundle_bytes(meta: dict, tensors: Iterable[tuple[str, str, np.ndarray]]) -> bytes:
    """The whole bundle in memory (small bundles and tests); same bytes write_bundle writes."""
    head, parts = _plan(meta, tensors, None)
    return head + b"".join(bytes(pad) + raw.tobytes() for pad, raw in parts)


def write_bundle(path, meta: dict, tensors: Iterable[tuple[str, str, np.ndarray]], *,
                 sweep: bool = True) -> None:
    """Validate, then write atomically: temp file in the same folder, fsync, os.replace (`sweep`:
    see kdtr.atomic.atomic_open)."""
    path = Path(path)
    head, parts = _plan(meta, tensors, path)
    try:
        with atomic_open(path, sweep=sweep) as handle:
            handle.write(head)
            for pad, raw in parts:
                handle.write(bytes(pad))
                handle.write(raw)
    except WriteError:
        raise                          # atomic_open's own line, which names the path already
    except OSError as e:
        raise BundleError(f"cannot write: {e.strerror or e}", file=path) from e
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable where the platform allows it (best effort)."""
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _plan(meta: dict, tensors, file) -> tuple[bytes, list[tuple[int, np.ndarray]]]:
    """Validate the inputs and lay them out: (preamble + header + padding, [(pad, bytes view)])."""
    if not isinstance(meta, dict):
        raise BundleError(f"meta must be a dict, got {type(meta).__name__}", file=file)
    entries, parts, cursor, seen = [], [], 0, set()
    for i, item in enumerate(tensors):
        name, role, array = _check_item(i, item, seen, file)
        raw = array.reshape(-1).view(np.uint8)
        offset = _align(cursor) if raw.size else cursor // ALIGN * ALIGN
        if raw.size:
            parts.append((offset - cursor, raw))
            cursor = offset + raw.size
        entries.append({"name": name, "role": role, "dtype": kdtr_dtype(array.dtype),
                        "shape": list(array.shape), "offset": offset, "nbytes": raw.size,
                        "crc32": zlib.crc32(raw)})
    header = _encode_header({"data_len": cursor, "meta": meta, "tensors": entries}, file)
    pad = _align(PREAMBLE.size + len(header)) - PREAMBLE.size - len(header)
    preamble = PREAMBLE.pack(MAGIC, MAJOR, MINOR, len(header), zlib.crc32(header), 0)
    return preamble + header + bytes(pad), parts


def _check_item(i: int, item, seen: set, file) -> tuple[str, str, np.ndarray]:
    """One (name, role, array) the writer can store exactly as given, or a BundleError saying why."""
    where = f"tensors[{i}]"
    try:
        name, role, array = item
    except (TypeError, ValueError):
        raise BundleError("must be a (name, role, array) triple", file=file, field=where) from None
    if not isinstance(name, str) or not name or "\0" in name:
        raise BundleError(f"name must be a non-empty string without NUL, got {name!r}", file=file,
                        field=where)
    where = f"tensor {name!r}"
    if name in seen:
        raise BundleError("duplicate tensor name", file=file, field=where)
    seen.add(name)
    if role not in ROLES:
        raise BundleError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})", file=file,
                        field=where)
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise BundleError(f"is a {type(array).__name__}, not a numpy array", file=file, field=where)
    try:
        kdtr_dtype(array.dtype)
    except ValueError:
        raise BundleError(f"unsupported dtype {array.dtype} (KDTR holds "
                        f"{', '.join(NUMPY_DTYPES)}, little-endian)", file=file,
                        field=where) from None
    if not array.flags.c_contiguous:
        raise BundleError("array is not C-contiguous (pass np.ascontiguousarray(a))", file=file,
                        field=where)
    if array.ndim > MAX_NDIM:
        raise BundleError(f"{array.ndim} dimensions, more than {MAX_NDIM}", file=file, field=where)
    if array.dtype == NUMPY_DTYPES["bool"] and np.any(array.reshape(-1).view(np.uint8) > 1):
        raise BundleError("bool array holds bytes other than 0 and 1", file=file, field=where)
    return name, role, array


def _encode_header(doc: dict, file) -> bytes:
    """Compact UTF-8 JSON in the given key order; refuses what a reader would refuse."""
    fault = _json_fault(doc, 1, [])
    if fault:
        raise BundleError(f"header cannot be written: {fault}", file=file)
    try:
        header = json.dumps(doc, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise BundleError(f"header cannot be written: {e}", file=file) from None
    if len(header) > MAX_HEADER_LEN:
        raise BundleError(f"header of {len(header)} bytes exceeds the limit of {MAX_HEADER_LEN}",
                        file=file)
    return header
