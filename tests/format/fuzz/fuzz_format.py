"""Atheris (libFuzzer for Python) target for kdtr.bundle.format.read_bundle.

    python tests/format/fuzz/fuzz_format.py [libFuzzer flags] CORPUS_DIR [SEED_DIR...]
    python tests/format/fuzz/seeds.py seeds && python tests/format/fuzz/fuzz_format.py -max_total_time=60 \\
        -dict=tests/format/fuzz/kdtr.dict corpus seeds

(tests/format/test_fuzz.py and scripts/fuzz.sh do both.) Every input must end in a BundleError, whose text
is one line "<path>: <fault>", or in a Bundle whose arrays are views of the file at the header's
offsets with the header's crc32 (and kdtree inspect's statistics run on them); any other exception
is a finding. So is memory: read_bundle may allocate in proportion to the input (the JSON header
becomes Python objects, measured up to about 50 bytes per header byte for `[{"":0},...]`) but
nothing sized by what the header declares. The peak traced allocation (tracemalloc: Python objects
and numpy buffers, not the memory map) must stay within HEADER_FACTOR bytes per header byte, plus
DATA_FACTOR per data byte, plus a fixed SLACK.

A custom mutator, the twin of fuzz_kdtr_h.c's, keeps most mutations inside the format's
checksums: it mutates the header or the data section alone, re-assembles the file (header_len,
header crc32, zero padding) and rewrites the tensors' crc32 values where the new digits fit. One
mutation in eight is left raw.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["kdtr"]):
    from kdtr.errors import BundleError
    from kdtr.bundle.format import read_bundle
    from kdtr.bundle.summary import tensor_stats
    from kdtr.dtypes import NUMPY_DTYPES

# kdtr.dtypes imports ml_dtypes on the first bf16 lookup (megabytes, once per process): done here,
# outside the traced reads, so the memory bound below measures read_bundle alone
NUMPY_DTYPES["bf16"]

PREAMBLE = struct.Struct("<4sHHQII")
ALIGN = 64
HEADER_FACTOR = 64          # bytes of Python objects per header byte (json: lists, dicts, ints)
# Bytes per data byte: the reader checks data in place (mmap) and scans padding and bool bytes in
# 64 KiB chunks (tests/format/test_fuzz.py::test_fault_scan_allocates_within_the_input).
DATA_FACTOR = 1
SLACK = 64 << 10            # fixed cost of a read (the Bundle, its entries, messages): ~5 KiB


class Finding(Exception):
    """Anything the reader must never do; atheris reports it with the input."""


_INPUT: list[Path] = []       # the file each input is written to, and unlinked from (set by main)


def _allowed(data: bytes) -> int:
    header_len = PREAMBLE.unpack_from(data)[3] if len(data) >= PREAMBLE.size else 0
    header_len = min(header_len, len(data))
    return HEADER_FACTOR * header_len + DATA_FACTOR * (len(data) - header_len) + SLACK


def _check_bundle(bundle, path: Path, size: int) -> None:
    if bundle.data_start % ALIGN or bundle.data_start + bundle.data_len != size:
        raise Finding(f"layout data_start {bundle.data_start} + data_len {bundle.data_len} != "
                      f"size {size}")
    base = bundle.data_start
    for e in bundle.entries:
        array = bundle.array(e.name)
        if array.nbytes != e.nbytes or tuple(array.shape) != e.shape or array.flags.writeable:
            raise Finding(f"tensor {e.name!r}: array {array.shape} {array.nbytes} bytes, "
                          f"header {e.shape} {e.nbytes} bytes")
        if e.nbytes and zlib.crc32(array.reshape(-1).view("u1")) != e.crc32:
            raise Finding(f"tensor {e.name!r}: crc32 of the array differs from the header's")
        if e.nbytes and not (0 <= e.offset and base + e.offset + e.nbytes <= size):
            raise Finding(f"tensor {e.name!r}: bytes outside the file")
        if e.dtype == "bool" and e.nbytes and int(array.view("u1").max()) > 1:
            raise Finding(f"tensor {e.name!r}: bool byte > 1 accepted")
        tensor_stats(array, e.dtype)
    for role in ("input", "output", "aux"):
        bundle.arrays(role)


def TestOneInput(data: bytes) -> None:
    path = _INPUT[0]
    path.write_bytes(data)
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        bundle = read_bundle(path)
    except BundleError as e:
        text = str(e)
        if not text.startswith(f"{path}: ") or "\n" in text or "\r" in text:
            raise Finding(f"error message is not one line '<path>: <fault>': {text!r}") from e
        bundle = None
    peak = tracemalloc.get_traced_memory()[1] - before
    if peak > _allowed(data):
        raise Finding(f"read_bundle of a {len(data)}-byte input allocated {peak} bytes at its peak "
                      f"(allowed {_allowed(data)})")
    try:
        if bundle is not None:
            _check_bundle(bundle, path, len(data))
    finally:
        del bundle
        path.unlink()


# --------------------------------------------------------------------------- custom mutator

def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _split(data: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(preamble, header, data section) when the preamble's header_len fits the input."""
    if len(data) < PREAMBLE.size or data[:4] != b"KDTR":
        return None
    header_len = PREAMBLE.unpack_from(data)[3]
    if header_len > len(data) - PREAMBLE.size:
        return None
    start = min(_align(PREAMBLE.size + header_len), len(data))
    return data[:PREAMBLE.size], data[PREAMBLE.size:PREAMBLE.size + header_len], data[start:]


def _assemble(preamble: bytes, header: bytes, section: bytes) -> bytes:
    magic, major, minor, _, _, reserved = PREAMBLE.unpack(preamble)
    pad = bytes(_align(PREAMBLE.size + len(header)) - PREAMBLE.size - len(header))
    return PREAMBLE.pack(magic, major, minor, len(header), zlib.crc32(header),
                         reserved) + header + pad + section


_CRC_FIELD = re.compile(rb'"crc32"[ \t\r\n]*:( *)([0-9]+)')


def _fix_tensor_crcs(header: bytes, section: bytes) -> bytes:
    """Each tensor's crc32 in the header text set to its bytes' crc32 where the digits fit."""
    try:
        doc = json.loads(header)
        tensors = doc["tensors"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return header
    if not isinstance(tensors, list):
        return header
    for entry in tensors:
        try:
            offset, nbytes, old = int(entry["offset"]), int(entry["nbytes"]), int(entry["crc32"])
        except (TypeError, KeyError, ValueError, OverflowError):
            continue
        if not 0 <= offset <= offset + nbytes <= len(section):
            continue
        new = zlib.crc32(section[offset:offset + nbytes])
        for m in _CRC_FIELD.finditer(header):
            if int(m.group(2)) != old:
                continue
            width = m.end() - m.start(1)
            digits = str(new).encode()
            if len(digits) <= width:
                header = header[:m.start(1)] + digits.rjust(width) + header[m.end():]
            break
    return header


def CustomMutator(data: bytes, max_size: int, seed: int) -> bytes:
    mode = seed % 8                     # 0: raw; 1-5: header; 6-7: data section
    parts = _split(data) if mode else None
    if parts is None or max_size < len(data) + ALIGN:
        return atheris.Mutate(data, max_size)
    preamble, header, section = parts
    if mode <= 5:
        header = atheris.Mutate(header, max_size - PREAMBLE.size - ALIGN - len(section))
    else:
        section = atheris.Mutate(section, max_size - _align(PREAMBLE.size + len(header)))
    if seed % 16 != 1:
        header = _fix_tensor_crcs(header, section)
    return _assemble(preamble, header, section)


def main(argv: list[str]) -> None:
    shm = Path("/dev/shm")
    folder = Path(shm if shm.is_dir() else tempfile.gettempdir())
    _INPUT.append(folder / f"fuzz_format.{os.getpid()}.kdtr")
    tracemalloc.start()
    atheris.Setup(argv, TestOneInput, custom_mutator=CustomMutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
