"""Hypothesis on KDTR: a round trip of random bundles, and random corruptions of a valid bundle,
which read_bundle must refuse with BundleError (or, where the corruption left a valid file, read) and
never answer with any other exception."""

from __future__ import annotations

import itertools
import json
import struct
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdtr.dtypes import NUMPY_DTYPES
from kdtr.errors import BundleError
from kdtr.bundle.format import bundle_bytes, read_bundle, write_bundle

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MINOR_FIELD = {6, 7}        # bytes of the u16 minor version: any value there is still a valid file

_COUNTER = itertools.count()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """One folder for the module (hypothesis re-runs a test body many times per fixture)."""
    return tmp_path_factory.mktemp("fuzz")


def valid_bundle() -> bytes:
    rng = np.random.default_rng(7)
    return bundle_bytes(
        {"op": "verify_attn", "variant": "bf16_paged", "case": "fuzz \u2713",
         "params": {"budget": 16, "sm_scale": 0.125}, "tolerance": {"out": "exact"}},
        [("q", "input", rng.standard_normal((3, 5)).astype("<f4")),
         ("k", "input", rng.standard_normal(7).astype(ml_dtypes.bfloat16)),
         ("idx", "aux", rng.integers(-9, 9, (2, 2), dtype="<i8")),
         ("empty", "aux", np.zeros((0, 3), "<f2")),
         ("mask", "output", rng.random(11) < 0.5),
         ("s", "output", np.array(2.5, "<f8"))])


VALID = valid_bundle()
HEADER_LEN = struct.unpack_from("<Q", VALID, 8)[0]


def read(folder: Path, raw: bytes):
    """read_bundle on `raw`: the Bundle (every array touched) or the BundleError; nothing else."""
    path = folder / f"{next(_COUNTER)}.kdtr"
    path.write_bytes(raw)
    try:
        bundle = read_bundle(path)
    except BundleError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e), str(e)
        return e
    finally:
        path.unlink()
    for e in bundle.entries:
        assert bundle.array(e.name).nbytes == e.nbytes
    return bundle


def with_header(text: bytes, data: bytes | None = None) -> bytes:
    """VALID with its header replaced (length, crc and padding recomputed) so JSON checks run."""
    if data is None:
        start = -(-(24 + HEADER_LEN) // 64) * 64
        data = VALID[start:]
    pad = bytes(-(24 + len(text)) % 64)
    preamble = struct.pack("<4sHHQII", b"KDTR", 1, 0, len(text), zlib.crc32(text), 0)
    return preamble + text + pad + data


def test_valid_bundle_reads(folder):
    assert not isinstance(read(folder, VALID), BundleError)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1,
                max_size=8))
def test_byte_flips(folder, flips):
    raw = bytearray(VALID)
    for at, mask in flips:
        raw[at] ^= mask
    changed = {i for i in range(len(raw)) if raw[i] != VALID[i]}
    result = read(folder, bytes(raw))
    if not changed <= MINOR_FIELD:
        assert isinstance(result, BundleError)


@SETTINGS
@given(st.integers(0, len(VALID) - 1))
def test_truncation(folder, length):
    assert isinstance(read(folder, VALID[:length]), BundleError)


@settings(SETTINGS, max_examples=100)
@given(st.binary(min_size=1, max_size=200))
def test_appended_bytes(folder, tail):
    assert isinstance(read(folder, VALID + tail), BundleError)


@settings(SETTINGS, max_examples=100)
@given(st.binary(min_size=4, max_size=4).filter(lambda m: m != b"KDTR"))
def test_other_magic(folder, magic):
    assert isinstance(read(folder, magic + VALID[4:]), BundleError)


@settings(SETTINGS, max_examples=100)
@given(st.integers(0, 0xFFFF).filter(lambda v: v != 1))
def test_other_major(folder, major):
    assert isinstance(read(folder, VALID[:4] + struct.pack("<H", major) + VALID[6:]), BundleError)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, HEADER_LEN - 1), st.sampled_from(["flip", "del", "ins"]),
                          st.integers(0, 255)), min_size=1, max_size=4))
def test_header_edits_with_valid_crc(folder, edits):
    """Edits inside the header, crc recomputed: exercises the JSON parser and the entry checks."""
    text = bytearray(VALID[24:24 + HEADER_LEN])
    for at, kind, value in edits:
        at = min(at, len(text) - 1) if text else 0
        if kind == "flip" and text:
            text[at] ^= value or 1
        elif kind == "del" and text:
            del text[at]
        else:
            text.insert(at, value)
    read(folder, with_header(bytes(text)))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)
FIELDS = ["data_len", "meta", "tensors", "extra", "t.name", "t.role", "t.dtype", "t.shape",
          "t.offset", "t.nbytes", "t.crc32", "t.extra", "t.shape.0", "t"]


@SETTINGS
@given(st.sampled_from(FIELDS), st.integers(0, 5), JSON)
def test_replaced_header_values(folder, field, index, value):
    """One header value replaced by arbitrary JSON: BundleError or (rarely) still valid."""
    doc = json.loads(VALID[24:24 + HEADER_LEN])
    entries = doc["tensors"]
    entry = entries[index % len(entries)]
    parts = field.split(".")
    if parts == ["t"]:
        entries[index % len(entries)] = value
    elif parts[0] != "t":
        doc[parts[0]] = value
    elif len(parts) == 2:
        entry[parts[1]] = value
    elif entry["shape"]:
        entry["shape"][0] = value
    read(folder, with_header(json.dumps(doc).encode()))


def tensor_strategy():
    """(name, role, array) with random dtype/shape and random bytes (bool bytes 0 or 1)."""
    def build(dtype, shape, seed, role):
        np_dtype = NUMPY_DTYPES[dtype]
        rng = np.random.default_rng(seed)
        size = int(np.prod(shape)) * np_dtype.itemsize
        raw = rng.integers(0, 2 if dtype == "bool" else 256, size, dtype=np.uint8)
        return role, np.frombuffer(raw.tobytes(), dtype=np_dtype).reshape(shape)

    return st.builds(build, st.sampled_from(list(NUMPY_DTYPES)),
                     st.lists(st.integers(0, 4), max_size=3), st.integers(0, 2**32),
                     st.sampled_from(["input", "output", "aux"]))


@settings(SETTINGS, max_examples=150)
@given(st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda s: "\0" not in s),
                       tensor_strategy(), max_size=6),
       st.dictionaries(st.text(max_size=6), JSON, max_size=5))
def test_round_trip(folder, tensors, meta):
    """Any tensors and any JSON meta come back with the same bytes, order and values."""
    path = folder / f"{next(_COUNTER)}.kdtr"
    items = [(name, role, array) for name, (role, array) in tensors.items()]
    write_bundle(path, meta, items)
    try:
        bundle = read_bundle(path)
        assert bundle.meta == meta
        assert [e.name for e in bundle.entries] == list(tensors)
        for name, role, array in items:
            got = bundle.array(name)
            assert bundle.entry(name).role == role
            assert got.dtype == array.dtype and got.shape == array.shape
            assert got.tobytes() == array.tobytes()
    finally:
        path.unlink()
