"""kdtr/include/kdtr.h, the C reader: compiled as C99 (with ASan/UBSan where the toolchain has them)
and as C++17, it must read what kdtr.bundle.format writes and refuse exactly what kdtr.bundle.format refuses.

tests/format/c/read_bundle.c prints one JSON object per file and per tensor; see its header comment."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
import struct
import subprocess
import warnings
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kdtr.errors import BundleError
from kdtr.bundle.format import read_bundle, write_bundle

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "kdtr" / "include"
SOURCE = Path(__file__).resolve().parent / "c" / "read_bundle.c"
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-pedantic"]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g"]
LANGUAGES = {"c99": ("cc", ["-std=c99"]), "c++17": ("c++", ["-x", "c++", "-std=c++17"])}
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
           UBSAN_OPTIONS="print_stacktrace=1")


def _load_sibling(name: str):
    """A sibling test module by path (works whatever pytest's import mode is)."""
    spec = importlib.util.spec_from_file_location(f"_kdtr_h_{name}", Path(__file__).with_name(
        f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC = _load_sibling("test_format")


def _try(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=ENV, timeout=120)


def _sanitizers_work(compiler: str, lang: list[str], folder: Path) -> tuple[bool, str]:
    """Whether a sanitized program links and runs here (LSan fails under some ptrace sandboxes)."""
    probe = folder / "probe.c"
    probe.write_text("#include <stdlib.h>\nint main(void) { free(malloc(8)); return 0; }\n")
    built = _try([compiler, *lang, *SANITIZERS, str(probe), "-o", str(folder / "probe")], folder)
    if built.returncode:
        return False, built.stderr.strip()[-300:]
    ran = _try([str(folder / "probe")], folder)
    return ran.returncode == 0, ran.stderr.strip()[-300:]


def build(language: str, source: Path, folder: Path) -> Path:
    """`source` built as `language` with -Wall -Wextra -Werror, sanitized when the toolchain allows."""
    name, lang = LANGUAGES[language]
    compiler = shutil.which(name) or shutil.which("gcc" if name == "cc" else "g++")
    if not compiler:
        pytest.skip(f"no {name} compiler on PATH: kdtr.h ({language}) cannot be built")
    sanitized, why = _sanitizers_work(compiler, lang, folder)
    flags = [*lang, *WARNINGS, *(SANITIZERS if sanitized else ["-O1"])]
    out = folder / source.stem
    built = _try([compiler, *flags, f"-I{INCLUDE}", str(source), "-o", str(out)], folder)
    assert built.returncode == 0, f"{' '.join(flags)}:\n{built.stderr}"
    if not sanitized:
        warnings.warn(f"kdtr.h {language}: built without sanitizers ({why})")
    return out


@pytest.fixture(scope="module", params=list(LANGUAGES))
def reader(request, tmp_path_factory) -> Path:
    """tests/format/c/read_bundle.c, built as C99 and as C++17."""
    return build(request.param, SOURCE, tmp_path_factory.mktemp(request.param.replace("+", "p")))


def run(reader: Path, *paths: Path, memory: bool = False) -> tuple[int, list[dict], str]:
    """Exit status, the JSON lines of stdout, and stderr (kdtr_open_memory when `memory`)."""
    done = _try([str(reader), *(["--memory"] if memory else []), *map(str, paths)], reader.parent)
    assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def by_file(lines: list[dict]) -> dict[str, list[dict]]:
    """The output lines grouped: file -> [file line, tensor lines...]."""
    out: dict[str, list[dict]] = {}
    for line in lines:
        if "file" in line:
            current = out.setdefault(line["file"], [])
        current.append(line)
    return out


def python_view(bundle) -> list[dict]:
    """What read_bundle.c should print for each tensor of a Python-read bundle."""
    rows = []
    for e in bundle.entries:
        array = bundle.array(e.name)
        row = {"tensor": e.name, "role": e.role, "dtype": e.dtype, "shape": list(e.shape),
               "numel": int(array.size), "nbytes": e.nbytes, "offset": e.offset, "crc32": e.crc32}
        if e.dtype in ("f64", "f32", "f16", "bf16"):
            row["sum"] = math.fsum(array.astype(np.float64).ravel().tolist())
        else:
            row["isum"] = sum(int(v) for v in array.ravel().tolist()) % (1 << 64)
        rows.append(row)
    return rows


def assert_same_tensors(c_rows: list[dict], py_rows: list[dict]) -> None:
    assert len(c_rows) == len(py_rows)
    for c, py in zip(c_rows, py_rows):
        if "sum" in py:
            scale = 1.0 + abs(py["sum"])
            assert abs(c.pop("sum") - py.pop("sum")) <= 1e-9 * scale * max(1, py["numel"])
        assert c == py


def rich_bundle(path: Path) -> None:
    """Every dtype, a scalar, a zero-size tensor, unicode names and a meta with the usual keys."""
    rng = np.random.default_rng(11)
    tensors = []
    for i, dtype in enumerate(["<f8", "<f4", "<f2", ml_dtypes.bfloat16]):
        tensors.append((f"float{i}", "input", (rng.standard_normal((3, 4)) * 8).astype(dtype)))
    for dtype in ["<i8", "<i4", "<i2", "i1", "<u8", "<u4", "<u2", "u1"]:
        info = np.iinfo(dtype)
        tensors.append((f"int_{np.dtype(dtype).name}", "output",
                        rng.integers(info.min, info.max, (2, 5), dtype=dtype, endpoint=True)))
    tensors += [("mask", "output", rng.random(17) < 0.5),
                ("scalar", "aux", np.array(-1.25, "<f4")),
                ("empty", "aux", np.zeros((3, 0, 2), "<i4")),
                ("n\u00e4me \"quoted\"", "aux", np.arange(4, dtype="<u2"))]
    meta = {"op": "verify_attn", "variant": "fp32", "case": "h16 \u2713 \"q\"",
            "params": {"batch": 2, "sm_scale": 0.14467963}, "seed": -1234}
    write_bundle(path, meta, tensors)


def test_reads_a_python_bundle(reader, tmp_path):
    path = tmp_path / "rich.kdtr"
    rich_bundle(path)
    rc, lines, err = run(reader, path)
    assert rc == 0, err
    bundle = read_bundle(path)
    head = lines[0]
    assert head == {"file": str(path), "op": "verify_attn", "variant": "fp32",
                    "case": "h16 \u2713 \"q\"", "seed": -1234, "sm_scale": 0.14467963,
                    "version": [1, 0], "ntensors": len(bundle.entries),
                    "data_start": bundle.data_start, "data_len": bundle.data_len,
                    "meta_len": len(json.dumps(bundle.meta, separators=(",", ":"),
                                               ensure_ascii=False).encode())}
    assert_same_tensors(lines[1:], python_view(bundle))


def test_rejects_what_python_rejects(reader, tmp_path):
    """Every rule of the spec, all files in one run: an error line naming the file and the fault."""
    paths = {}
    for case, (build, word) in SPEC.REJECTIONS.items():
        paths[case] = tmp_path / f"{case}.kdtr"
        paths[case].write_bytes(build())
    rc, lines, err = run(reader, *paths.values())
    assert rc == 1
    results = by_file(lines)
    for case, path in paths.items():
        (line,) = results[str(path)]
        word = SPEC.REJECTIONS[case][1]
        assert "error" in line, f"{case}: kdtr.h accepted it"
        assert line["error"].startswith(f"{path}: "), line["error"]
        assert word.lower() in line["error"].lower(), f"{case}: {line['error']}"
        assert f"{path}: " in err


@pytest.mark.parametrize("case", ["bad_magic", "tensor_crc32", "truncated_data"])
def test_one_bad_file_fails_the_run(reader, tmp_path, case):
    path = tmp_path / f"{case}.kdtr"
    path.write_bytes(SPEC.REJECTIONS[case][0]())
    rc, _, err = run(reader, path)
    assert rc != 0 and err.startswith(f"{path}: ")


def test_unreadable_paths(reader, tmp_path):
    rc, lines, _ = run(reader, tmp_path / "missing.kdtr", tmp_path)
    assert rc == 1
    assert lines[0]["error"].startswith(f"{tmp_path / 'missing.kdtr'}: cannot read")
    assert lines[1]["error"].startswith(f"{tmp_path}: cannot read")


def test_accepts_what_python_accepts(reader, tmp_path):
    """Other valid choices: the independent writer, a newer minor, nesting at the limit."""
    header, data = SPEC.base()
    newer = dict(header, future={"x": 1})
    files = {
        "base": SPEC.spec_file(header, data),
        "indented": SPEC.spec_file(json.dumps(header, indent=3).encode(), data),
        "newer_minor": SPEC.spec_file(newer, data, minor=7),
        "deep": SPEC.meta_text(SPEC.nested(SPEC.MAX_JSON_DEPTH - 2))(),
        "zero_size_at_limit": SPEC.zero_size_at_limit(),
        "long_int": SPEC.meta_text('{"op": "demo", "x": -' + "9" * SPEC.MAX_INT_DIGITS + "}")(),
        "escapes": SPEC.meta_text('{"op": "\\u0064\\u0065mo", "variant": "\\ud83d\\ude00\\n"}')(),
    }
    paths = []
    for name, raw in files.items():
        paths.append(tmp_path / f"{name}.kdtr")
        paths[-1].write_bytes(raw)
    rc, lines, err = run(reader, *paths)
    assert rc == 0, err
    results = by_file(lines)
    for path in paths:
        assert_same_tensors(results[str(path)][1:], python_view(read_bundle(path)))
    assert results[str(paths[-1])][0]["op"] == "demo"
    assert results[str(paths[-1])][0]["variant"] == "\U0001F600\n"


VALUES = [None, True, False, 0, -0.0, 1, -1, 2.0, 1 << 32, 1 << 63, 1 << 64, "", "x", "f32",
          "input", [], [0], [2, 3], {}, {"a": 1}, 1e308]


def corruptions(raw: bytes, rng: random.Random, n: int) -> list[bytes]:
    """Seeded corruptions of `raw`: header edits with a valid crc (the parser's paths), value
    replacements, and raw byte flips anywhere."""
    header_len = struct.unpack_from("<Q", raw, 8)[0]
    start = -(-(24 + header_len) // 64) * 64
    text, data = raw[24:24 + header_len], raw[start:]
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            edited = bytearray(text)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(edited))
                op = rng.choice(["flip", "del", "ins"])
                if op == "flip":
                    edited[at] ^= rng.randrange(1, 256)
                elif op == "del":
                    del edited[at]
                else:
                    edited.insert(at, rng.choice(b'{}[]",:\\0123456789-.eEtfn u'))
            out.append(with_header(bytes(edited), data))
        elif kind == 1:
            doc = json.loads(text)
            entry = rng.choice(doc["tensors"])
            key = rng.choice(list(entry) + ["data_len", "extra"])
            target = doc if key in ("data_len", "extra") else entry
            target[key] = rng.choice(VALUES)
            out.append(with_header(json.dumps(doc).encode(), data))
        else:
            flipped = bytearray(raw)
            flipped[rng.randrange(len(raw))] ^= rng.randrange(1, 256)
            out.append(bytes(flipped))
    return out


def with_header(text: bytes, data: bytes) -> bytes:
    pad = bytes(-(24 + len(text)) % 64)
    preamble = struct.pack("<4sHHQII", b"KDTR", 1, 0, len(text), zlib.crc32(text), 0)
    return preamble + text + pad + data


def test_fuzz_parity_with_python(reader, tmp_path):
    """On hundreds of corrupted files kdtr.h accepts exactly the files read_bundle accepts, and
    then reads the same tensors."""
    rich_bundle(tmp_path / "rich.kdtr")
    paths = []
    for i, raw in enumerate(corruptions((tmp_path / "rich.kdtr").read_bytes(),
                                        random.Random(1234), 450)):
        paths.append(tmp_path / f"c{i:03d}.kdtr")
        paths[-1].write_bytes(raw)
    _, lines, _ = run(reader, *paths)
    results = by_file(lines)
    accepted = 0
    for path in paths:
        try:
            py = python_view(read_bundle(path))
        except BundleError:
            py = None
        c = results[str(path)]
        assert ("error" in c[0]) == (py is None), f"{path.name}: C {c[0]}, Python {py}"
        if py is not None:
            accepted += 1
            assert_same_tensors(c[1:], py)
    assert accepted < len(paths)


# ------------------------------------------------------------------------- kdtr_open_memory

def test_open_memory_matches_open(reader, tmp_path):
    """kdtr_open_memory shares every check with kdtr_open: on the spec's rejections, the accepted
    variants and hundreds of corruptions, read_bundle --memory prints exactly what it prints from
    files (same errors, same tensors), and its exactly sized buffers show ASan any over-read."""
    rich_bundle(tmp_path / "rich.kdtr")
    files = {f"reject_{case}": build() for case, (build, _) in SPEC.REJECTIONS.items()}
    header, data = SPEC.base()
    files["base"] = SPEC.spec_file(header, data)
    files["empty"] = b""
    files["zero_size_at_limit"] = SPEC.zero_size_at_limit()
    for i, raw in enumerate(corruptions((tmp_path / "rich.kdtr").read_bytes(),
                                        random.Random(99), 150)):
        files[f"c{i:03d}"] = raw
    paths = [tmp_path / "rich.kdtr"]
    for name, raw in files.items():
        paths.append(tmp_path / f"{name}.kdtr")
        paths[-1].write_bytes(raw)
    rc_file, from_files, err_file = run(reader, *paths)
    rc_memory, from_memory, err_memory = run(reader, *paths, memory=True)
    assert (rc_memory, err_memory) == (rc_file, err_file)
    assert from_memory == from_files
    assert sum("error" in line for line in from_files) > len(SPEC.REJECTIONS)


@pytest.fixture(scope="module", params=list(LANGUAGES))
def open_memory(request, tmp_path_factory) -> Path:
    """tests/format/c/open_memory.c (the edges of kdtr_open_memory), built as C99 and as C++17."""
    folder = tmp_path_factory.mktemp("mem_" + request.param.replace("+", "p"))
    return build(request.param, SOURCE.with_name("open_memory.c"), folder)


def test_open_memory_edges(open_memory, tmp_path):
    """NULL / empty input, a NULL err buffer, alignment, the copy outliving the caller's buffer."""
    rich_bundle(tmp_path / "rich.kdtr")
    done = _try([str(open_memory), str(tmp_path / "rich.kdtr")], tmp_path)
    assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and done.stdout.count("ok ") >= 10, done.stdout


def test_errors_are_one_line(reader, tmp_path):
    """Header text quoted in a message keeps no raw newline or tab (found by fuzz_kdtr_h.c)."""
    paths = []
    for i, text in enumerate([b"[\n\t1,\r\n2]", b'{"data_len":0,"meta":[\n],"tensors":[]}',
                              b'{"data_len":\n"x","meta":{},"tensors":[]}']):
        paths.append(tmp_path / f"ws{i}.kdtr")
        paths[-1].write_bytes(with_header(text, b""))
    for memory in (False, True):
        rc, lines, err = run(reader, *paths, memory=memory)
        assert rc == 1 and len(err.splitlines()) == len(paths), err
        for line in lines:
            assert not any(ch in line["error"] for ch in "\n\r\t"), line["error"]
