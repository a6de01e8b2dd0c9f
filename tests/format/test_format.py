"""KDTR v1 (kdtr/bundle/format.py): round trips, an independent writer built from the spec, and one test
per rejection rule of docs/format.md. The REJECTIONS table is reused by tests/format/test_kdtr_h.py."""

from __future__ import annotations

import json
import mmap
import os
import struct
import tracemalloc
import zlib

import ml_dtypes
import numpy as np
import pytest

from kdtr.dtypes import NUMPY_DTYPES
from kdtr.errors import BundleError, WriteError
from kdtr.bundle.format import (MAJOR, MAX_HEADER_LEN, MAX_INT_DIGITS, MAX_JSON_DEPTH, MAX_NDIM, MINOR,
                                Bundle, TensorEntry, bundle_bytes, read_bundle, write_bundle)

# ------------------------------------------------------------------ an independent spec writer
# Written from docs/format.md with struct.pack; it deliberately makes other valid choices than
# kdtr.bundle.format's writer (spaced JSON, zero-size tensors at offset 0, optional extra zero gaps).


def _align(n: int) -> int:
    return -(-n // 64) * 64


def spec_layout(tensors, gap: int = 0) -> tuple[list[dict], bytes]:
    """Header entries and the data section for (name, role, array) triples."""
    entries, data = [], bytearray()
    for name, role, array in tensors:
        raw = np.ascontiguousarray(array).tobytes()
        dtype = next(k for k, v in NUMPY_DTYPES.items() if v == array.dtype)
        offset = 0
        if raw:
            offset = _align(len(data)) + (gap if data else 0)
            data += bytes(offset - len(data)) + raw
        entries.append({"name": name, "role": role, "dtype": dtype, "shape": list(array.shape),
                        "offset": offset, "nbytes": len(raw), "crc32": zlib.crc32(raw)})
    return entries, bytes(data)


def spec_file(header, data: bytes = b"", *, magic=b"KDTR", major=1, minor=0, crc=None,
              reserved=0, header_len=None, pad: bytes | None = None) -> bytes:
    """Preamble + header (a dict, or raw bytes) + zero padding to 64 + data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    preamble = struct.pack("<4sHHQII", magic, major, minor,
                           len(text) if header_len is None else header_len,
                           zlib.crc32(text) if crc is None else crc, reserved)
    padding = bytes((-(24 + len(text))) % 64) if pad is None else pad
    return preamble + text + padding + data


def base(meta=None) -> tuple[dict, bytes]:
    """A small valid bundle: f32 q at 0, bool mask at 64."""
    tensors = [("q", "input", np.arange(6, dtype="<f4").reshape(2, 3)),
               ("mask", "output", np.array([1, 0, 1, 1], dtype="?"))]
    entries, data = spec_layout(tensors)
    return {"data_len": len(data), "meta": meta or {"op": "demo"}, "tensors": entries}, data


def edited(edit, **kw):
    """A builder: base(), `edit(header)` in place, then spec_file with preamble overrides."""
    def build() -> bytes:
        header, data = base()
        edit(header)
        return spec_file(header, data, **kw)
    return build


def meta_text(snippet: str, **kw):
    """A builder whose meta is the raw JSON text `snippet` (for what json.dumps cannot write)."""
    def build() -> bytes:
        header, data = base()
        text = json.dumps(header).replace('{"op": "demo"}', snippet, 1)
        return spec_file(text.encode("utf-8", "surrogatepass"), data, **kw)
    return build


def data_edit(edit):
    """A builder that changes the data section (kept the same length)."""
    def build() -> bytes:
        header, data = base()
        data = bytearray(data)
        edit(header, data)
        return spec_file(header, bytes(data))
    return build


def tensor(i, **changes):
    return lambda h: h["tensors"][i].update(changes)


def drop(*keys):
    def edit(h):
        target = h["tensors"][0] if keys[0] == "tensor" else h
        target.pop(keys[-1])
    return edit


def overlapping() -> bytes:
    data = bytes(range(100))
    header = {"data_len": 100, "meta": {}, "tensors": [
        {"name": "a", "role": "input", "dtype": "u8", "shape": [100], "offset": 0, "nbytes": 100,
         "crc32": zlib.crc32(data)},
        {"name": "b", "role": "input", "dtype": "u8", "shape": [10], "offset": 64, "nbytes": 10,
         "crc32": zlib.crc32(data[64:74])}]}
    return spec_file(header, data)


def bad_bool(header, data):
    data[64] = 2
    header["tensors"][1]["crc32"] = zlib.crc32(bytes(data[64:68]))


def nested(levels: int) -> str:
    return '{"op": "demo", "deep": ' + "[" * levels + "]" * levels + "}"


def bad_header_padding() -> bytes:
    header, data = base()
    text = json.dumps(header).encode()
    pad = bytearray((-(24 + len(text))) % 64)
    assert pad, "the base header must leave padding to corrupt"
    pad[-1] = 7
    return spec_file(text, data, pad=bytes(pad))


def set_data_len(n):
    def edit(h, data):
        h["data_len"] = n
    return edit


# id -> (builder of the file's bytes, a word the error message must contain)
REJECTIONS = {
    "empty_file": (lambda: b"", "truncated"),
    "short_file": (lambda: b"KDTR\x01\x00", "truncated"),
    "bad_magic": (lambda: spec_file(*base(), magic=b"KDTX"), "magic"),
    "other_major": (lambda: spec_file(*base(), major=2), "major"),
    "reserved_nonzero": (lambda: spec_file(*base(), reserved=1), "reserved"),
    "header_len_over_limit": (lambda: spec_file(*base(), header_len=MAX_HEADER_LEN + 1), "limit"),
    "header_len_past_eof": (lambda: spec_file(*base(), header_len=1 << 20), "truncated"),
    "header_crc": (lambda: spec_file(*base(), crc=0x12345678), "crc32"),
    "invalid_utf8": (meta_text('{"op": "de\udcffmo"}'), "UTF-8"),
    "invalid_json": (meta_text('{"op": "demo",}'), "JSON"),
    "json_trailing_data": (lambda: spec_file(json.dumps(base()[0]).encode() + b" x", base()[1]),
                           "JSON"),
    "json_control_char": (meta_text('{"op": "de\tmo"}'), "JSON"),
    "json_bad_escape": (meta_text('{"op": "de\\qmo"}'), "JSON"),
    "header_not_object": (lambda: spec_file([1, 2]), "object"),
    "missing_data_len": (edited(drop("data_len")), "missing"),
    "missing_meta": (edited(drop("meta")), "missing"),
    "missing_tensors": (edited(drop("tensors")), "missing"),
    "missing_role": (edited(drop("tensor", "role")), "missing"),
    "missing_crc32": (edited(drop("tensor", "crc32")), "missing"),
    "meta_not_object": (edited(lambda h: h.update(meta=["op"])), "object"),
    "tensors_not_array": (edited(lambda h: h.update(tensors={})), "array"),
    "data_len_string": (edited(lambda h: h.update(data_len="68")), "integer"),
    "data_len_bool": (edited(lambda h: h.update(data_len=True)), "integer"),
    "entry_not_object": (edited(lambda h: h["tensors"].append("q")), "object"),
    "name_not_string": (edited(tensor(0, name=7)), "name"),
    "name_empty": (edited(tensor(0, name="")), "name"),
    "name_with_nul": (edited(tensor(0, name="q\0")), "name"),
    "offset_float": (edited(tensor(0, offset=0.0)), "integer"),
    "nbytes_negative": (edited(tensor(0, nbytes=-24)), "integer"),
    "crc32_negative": (edited(tensor(0, crc32=-1)), "crc32"),
    "crc32_too_big": (edited(tensor(0, crc32=1 << 32)), "crc32"),
    "duplicate_json_key": (meta_text('{"op": "demo", "op": "other"}'), "duplicate"),
    "duplicate_json_key_escaped": (meta_text('{"op": "demo", "\\u006fp": "other"}'), "duplicate"),
    "duplicate_tensor_name": (edited(tensor(1, name="q")), "duplicate"),
    "json_nan": (meta_text('{"op": "demo", "x": NaN}'), "NaN"),
    "json_infinity": (meta_text('{"op": "demo", "x": Infinity}'), "Infinity"),
    "json_minus_infinity": (meta_text('{"op": "demo", "x": -Infinity}'), "Infinity"),
    "json_number_overflow": (meta_text('{"op": "demo", "x": 1e400}'), "finite"),
    "json_integer_too_long": (
        meta_text('{"op": "demo", "x": -' + "9" * (MAX_INT_DIGITS + 1) + "}"), "digits"),
    "lone_surrogate_escape": (meta_text('{"op": "\\ud800x"}'), "surrogate"),
    "nesting_over_limit": (meta_text(nested(MAX_JSON_DEPTH - 1)), "nested"),
    "nesting_very_deep": (meta_text(nested(100_000)), "nested"),
    "unknown_dtype": (edited(tensor(0, dtype="float32")), "dtype"),
    "dtype_not_string": (edited(tensor(0, dtype=4)), "dtype"),
    "unknown_role": (edited(tensor(0, role="weights")), "role"),
    "negative_dim": (edited(tensor(0, shape=[-2, -3])), "dimension"),
    "float_dim": (edited(tensor(0, shape=[2.0, 3])), "dimension"),
    "bool_dim": (edited(tensor(0, shape=[True, 6])), "dimension"),
    "string_dim": (edited(tensor(0, shape=["2", 3])), "dimension"),
    "shape_not_array": (edited(tensor(0, shape=6)), "shape"),
    "too_many_dims": (edited(tensor(0, shape=[1] * (MAX_NDIM + 1) + [6])), "dimensions"),
    "zero_size_too_large": (edited(tensor(0, shape=[0, 1 << 62], nbytes=0)), "too large"),
    "nbytes_mismatch": (edited(tensor(0, nbytes=20)), "nbytes"),
    "offset_unaligned": (edited(tensor(1, offset=32)), "aligned"),
    "offset_overlapping": (overlapping, "overlap"),
    "offset_past_data_len": (edited(tensor(1, offset=128)), "past"),
    "zero_size_offset_past_data_len": (
        edited(lambda h: h["tensors"].append({"name": "z", "role": "aux", "dtype": "f32",
                                              "shape": [0], "offset": 128, "nbytes": 0,
                                              "crc32": 0})), "past"),
    "data_len_beyond_last_tensor": (
        lambda: spec_file(dict(base()[0], data_len=128), base()[1] + bytes(60)), "data_len"),
    "truncated_data": (lambda: spec_file(*base())[:-1], "truncated"),
    "trailing_bytes": (lambda: spec_file(*base()) + b"\0", "trailing"),
    "nonzero_header_padding": (bad_header_padding, "padding"),
    "nonzero_gap_padding": (data_edit(lambda h, d: d.__setitem__(40, 1)), "padding"),
    "tensor_crc32": (data_edit(lambda h, d: d.__setitem__(0, d[0] ^ 1)), "crc32"),
    "bool_byte": (data_edit(bad_bool), "bool"),
    "unknown_top_key": (edited(lambda h: h.update(extra=1)), "unknown key"),
    "unknown_tensor_key": (edited(tensor(0, stride=[3, 1])), "unknown key"),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejects(tmp_path, case):
    """Every rule of the spec: a BundleError naming the file and the fault, on one line."""
    build, word = REJECTIONS[case]
    path = tmp_path / f"{case}.kdtr"
    path.write_bytes(build())
    with pytest.raises(BundleError) as info:
        read_bundle(path)
    message = str(info.value)
    assert message.startswith(str(path) + ": ")
    assert word.lower() in message.lower(), message
    assert "\n" not in message


def test_base_is_valid(tmp_path):
    """The REJECTIONS all start from this bundle, so it must itself be accepted."""
    path = tmp_path / "base.kdtr"
    path.write_bytes(spec_file(*base()))
    bundle = read_bundle(path)
    assert bundle.array("q").tolist() == [[0, 1, 2], [3, 4, 5]]
    assert bundle.array("mask").tolist() == [True, False, True, True]


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_path(tmp_path, what):
    path = tmp_path / "nope.kdtr"
    if what == "directory":
        path.mkdir()
    with pytest.raises(BundleError, match="nope.kdtr: (cannot read|is a directory)"):
        read_bundle(path)


def test_terabyte_claim_in_small_file(tmp_path):
    """Header values are checked against the file size before anything is allocated."""
    header = {"data_len": 1 << 40, "meta": {}, "tensors": [
        {"name": "big", "role": "input", "dtype": "u8", "shape": [1 << 40], "offset": 0,
         "nbytes": 1 << 40, "crc32": 0}]}
    path = tmp_path / "big.kdtr"
    path.write_bytes(spec_file(header, bytes(1024 - 24 - _align(len(json.dumps(header))))))
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="truncated"):
            read_bundle(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# ------------------------------------------------------------------------------ round trips

SHAPES = [(), (0,), (3, 0, 2), (5,), (2, 3, 4)]


def sample(dtype: str, shape, rng) -> np.ndarray:
    """Random values of a KDTR dtype, floats including inf/nan/-0 (they must survive bitwise)."""
    np_dtype = NUMPY_DTYPES[dtype]
    size = int(np.prod(shape))
    if dtype == "bool":
        return (rng.random(size) < 0.5).reshape(shape)
    if dtype in ("f64", "f32", "f16", "bf16"):
        values = rng.standard_normal(size) * 100
        values[: min(size, 3)] = [np.inf, np.nan, -0.0][: min(size, 3)]
        return values.astype(np_dtype).reshape(shape)
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, size, dtype=np_dtype, endpoint=True).reshape(shape)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_round_trip_every_dtype(tmp_path, dtype):
    rng = np.random.default_rng(len(dtype))
    tensors = [(f"t{i}", ("input", "output", "aux")[i % 3], sample(dtype, shape, rng))
               for i, shape in enumerate(SHAPES)]
    write_bundle(tmp_path / "x.kdtr", {"op": "demo"}, tensors)
    bundle = read_bundle(tmp_path / "x.kdtr")
    for (name, role, array), entry in zip(tensors, bundle.entries):
        assert (entry.name, entry.role, entry.dtype, entry.shape) == (name, role, dtype,
                                                                      array.shape)
        assert same_bytes(bundle.array(name), array)
    assert bundle.array("t0").ndim == 0


def test_bf16_is_ml_dtypes(tmp_path):
    values = np.array([1.5, -2.25, 3e38], dtype=ml_dtypes.bfloat16)
    write_bundle(tmp_path / "b.kdtr", {}, [("h", "input", values)])
    got = read_bundle(tmp_path / "b.kdtr").array("h")
    assert got.dtype == ml_dtypes.bfloat16 and same_bytes(got, values)


def test_many_tensors_roles_and_order(tmp_path):
    rng = np.random.default_rng(0)
    tensors = [(f"n{i:03d}", ("input", "output", "aux")[i % 3],
                rng.standard_normal(i % 7 + 1).astype("<f4")) for i in range(300)]
    write_bundle(tmp_path / "many.kdtr", {}, tensors)
    bundle = read_bundle(tmp_path / "many.kdtr")
    assert [e.name for e in bundle.entries] == [t[0] for t in tensors]
    outputs = bundle.arrays("output")
    assert list(outputs) == [name for name, role, _ in tensors if role == "output"]
    for name, _, array in tensors:
        assert same_bytes(bundle.array(name), array)


def test_meta_preserved_in_order(tmp_path):
    meta = {"variant": "fp32", "op": "verify_attn", "case": "h16 \u2713 \"q\"\n",
            "params": {"budget": 16, "sm_scale": 0.14467963, "flags": [True, None, -0.0]},
            "seed": 1 << 70, "tolerance": {"out": {"atol": 1e-5, "rtol": 1e-4}}}
    write_bundle(tmp_path / "m.kdtr", meta, [])
    bundle = read_bundle(tmp_path / "m.kdtr")
    assert bundle.meta == meta and list(bundle.meta) == list(meta)
    assert (bundle.version, bundle.entries, bundle.data_len) == ((MAJOR, MINOR), (), 0)


def test_layout_follows_the_spec(tmp_path):
    tensors = [("a", "input", np.arange(3, dtype="u1")), ("z", "aux", np.zeros((0, 4), "<f8")),
               ("b", "output", np.arange(5, dtype="<i8"))]
    raw = bundle_bytes({"op": "x"}, tensors)
    magic, major, minor, header_len, crc, reserved = struct.unpack_from("<4sHHQII", raw)
    header = raw[24:24 + header_len]
    assert (magic, major, minor, reserved, crc) == (b"KDTR", 1, 0, 0, zlib.crc32(header))
    doc = json.loads(header)
    assert header == json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    data_start = _align(24 + header_len)
    assert len(raw) == data_start + doc["data_len"] == data_start + 64 + 40
    assert [t["offset"] for t in doc["tensors"]] == [0, 0, 64]
    assert all(t["offset"] % 64 == 0 for t in doc["tensors"])


def test_writes_are_deterministic(tmp_path):
    rng = np.random.default_rng(1)
    tensors = [("x", "input", rng.standard_normal((4, 5)).astype("<f2")),
               ("m", "output", rng.random(7) < 0.3)]
    write_bundle(tmp_path / "1.kdtr", {"op": "d", "seed": 3}, tensors)
    write_bundle(tmp_path / "2.kdtr", {"op": "d", "seed": 3}, tensors)
    first = (tmp_path / "1.kdtr").read_bytes()
    assert first == (tmp_path / "2.kdtr").read_bytes() == bundle_bytes({"op": "d", "seed": 3},
                                                                      tensors)


def test_reads_the_independent_writer(tmp_path):
    """Spaced JSON, unicode names, extra zero gaps, entries out of offset order, empties at 0."""
    rng = np.random.default_rng(2)
    tensors = [("q", "input", rng.standard_normal((2, 17, 3)).astype("<f4")),
               ("empty", "aux", np.zeros((4, 0), "<i4")),
               ("tok", "input", rng.integers(0, 1000, 9).astype("<i8")),
               ("\u00e9t\u00e9", "output", np.array(7, dtype="<u2")),
               ("mask", "output", rng.random(13) < 0.5)]
    entries, data = spec_layout(tensors, gap=128)
    header = {"meta": {"op": "spec"}, "tensors": entries[::-1], "data_len": len(data)}
    path = tmp_path / "spec.kdtr"
    path.write_bytes(spec_file(json.dumps(header, indent=2).encode(), data))
    bundle = read_bundle(path)
    assert [e.name for e in bundle.entries] == [t[0] for t in tensors][::-1]
    for name, role, array in tensors:
        assert bundle.entry(name).role == role
        assert same_bytes(bundle.array(name), array)


def test_limits_are_inclusive(tmp_path):
    """Nesting of exactly MAX_JSON_DEPTH (meta is level 2) and integers of MAX_INT_DIGITS digits."""
    levels = MAX_JSON_DEPTH - 2
    path = tmp_path / "deep.kdtr"
    path.write_bytes(meta_text(nested(levels))())
    assert json.dumps(read_bundle(path).meta["deep"]) == "[" * levels + "]" * levels
    path.write_bytes(meta_text('{"op": "demo", "x": -' + "9" * MAX_INT_DIGITS + "}")())
    assert read_bundle(path).meta["x"] == -(10 ** MAX_INT_DIGITS - 1)


def zero_size_at_limit() -> bytes:
    """A zero-size tensor whose other dims reach the size limit exactly (numpy can still view it)."""
    header, data = base()
    header["tensors"].append({"name": "z", "role": "aux", "dtype": "u8",
                              "shape": [0, (1 << 63) - 1], "offset": 64, "nbytes": 0, "crc32": 0})
    return spec_file(header, data)


def test_zero_size_at_the_size_limit(tmp_path):
    path = tmp_path / "z.kdtr"
    path.write_bytes(zero_size_at_limit())
    assert read_bundle(path).array("z").shape == (0, (1 << 63) - 1)


def test_higher_minor_ignores_unknown_keys(tmp_path):
    header, data = base()
    header["compression"] = None
    header["tensors"][0]["stride"] = [3, 1]
    path = tmp_path / "v1_1.kdtr"
    path.write_bytes(spec_file(header, data, minor=MINOR + 1))
    bundle = read_bundle(path)
    assert bundle.version == (1, MINOR + 1) and bundle.entry("q").shape == (2, 3)
    header["tensors"][0]["shape"] = [2.0, 3]        # a known key is still checked
    path.write_bytes(spec_file(header, data, minor=MINOR + 1))
    with pytest.raises(BundleError, match="dimension"):
        read_bundle(path)


def test_arrays_are_read_only_views_of_the_map(tmp_path):
    write_bundle(tmp_path / "v.kdtr", {}, [("a", "input", np.arange(10, dtype="<f4"))])
    array = read_bundle(tmp_path / "v.kdtr").array("a")
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0] = 1
    base_obj = array
    while isinstance(base_obj, np.ndarray):
        base_obj = base_obj.base
    assert isinstance(base_obj.obj if isinstance(base_obj, memoryview) else base_obj, mmap.mmap)


def test_lookup_errors_are_kdtr_errors(tmp_path):
    write_bundle(tmp_path / "l.kdtr", {}, [("a", "input", np.zeros(2, "u1"))])
    bundle = read_bundle(tmp_path / "l.kdtr")
    assert isinstance(bundle, Bundle) and isinstance(bundle.entry("a"), TensorEntry)
    with pytest.raises(BundleError, match=r"l\.kdtr: no tensor 'b' \(has 'a'\)"):
        bundle.array("b")
    with pytest.raises(BundleError, match="unknown role"):
        bundle.arrays("inputs")
    assert bundle.arrays("aux") == {}


def test_empty_bundle(tmp_path):
    write_bundle(tmp_path / "e.kdtr", {}, [])
    bundle = read_bundle(tmp_path / "e.kdtr")
    assert bundle.data_len == 0 and os.path.getsize(tmp_path / "e.kdtr") == bundle.data_start


# ------------------------------------------------------------------------------ the writer

@pytest.mark.parametrize("meta, tensors, word", [
    ({"x": float("nan")}, [], "finite"),
    ({"x": np.int64(3)}, [], "numpy.int64"),
    ({1: "a"}, [], "not a string"),
    (["op"], [], "meta must be a dict"),
    ({}, [("a", "input", np.zeros(3, dtype=object))], "unsupported dtype"),
    ({}, [("a", "input", np.zeros(3, dtype=">f4"))], "unsupported dtype"),
    ({}, [("a", "input", np.zeros((4, 4), "<f4")[:, 1])], "C-contiguous"),
    ({}, [("a", "input", [1, 2])], "not a numpy array"),
    ({}, [("a", "weights", np.zeros(1))], "unknown role"),
    ({}, [("a", "input", np.zeros(1)), ("a", "aux", np.zeros(1))], "duplicate"),
    ({}, [("", "input", np.zeros(1))], "non-empty"),
    ({}, [("a", "input")], "triple"),
    ({}, [("a", "input", np.array([0, 1, 2], "u1").view("?"))], "bool"),
])
def test_writer_refuses(tmp_path, meta, tensors, word):
    """A clear BundleError naming the target, and nothing left behind in the folder."""
    target = tmp_path / "out" / "w.kdtr"
    with pytest.raises(BundleError) as info:
        write_bundle(target, meta, tensors)
    assert str(info.value).startswith(str(target)) and word in str(info.value)
    assert not target.exists()
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_writer_creates_parent_folders(tmp_path):
    target = tmp_path / "a" / "b" / "c.kdtr"
    write_bundle(target, {"op": "x"}, [("a", "input", np.ones(3, "<f4"))])
    assert read_bundle(target).meta == {"op": "x"}


def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    """A fault after the temp file exists: it is removed and an older bundle stays intact."""
    target = tmp_path / "keep.kdtr"
    write_bundle(target, {"v": 1}, [("a", "input", np.ones(3, "<f4"))])
    before = target.read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(WriteError, match="keep.kdtr: cannot write: No space left") as caught:
        write_bundle(target, {"v": 2}, [("a", "input", np.zeros(1 << 16, "<f4"))])
    assert str(caught.value).count("keep.kdtr") == 1            # the path once (issue 36)
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.kdtr"]


def test_failing_tensor_iterable_leaves_nothing(tmp_path):
    def tensors():
        yield "a", "input", np.ones(3, "<f4")
        raise RuntimeError("generator broke")

    with pytest.raises(RuntimeError, match="generator broke"):
        write_bundle(tmp_path / "g.kdtr", {}, tensors())
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_a_directory_target(tmp_path):
    (tmp_path / "d.kdtr").mkdir()
    with pytest.raises(WriteError, match="cannot write"):
        write_bundle(tmp_path / "d.kdtr", {}, [])
    assert [p.name for p in tmp_path.iterdir()] == ["d.kdtr"]
