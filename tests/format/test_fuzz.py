"""Coverage-guided fuzzing of both KDTR readers, bounded for CI: tests/format/fuzz/fuzz_kdtr_h.c (kdtr.h
under libFuzzer with ASan and UBSan) and tests/format/fuzz/fuzz_format.py (kdtr.bundle.format under atheris), each
for FUZZ_SECONDS from seed bundles written at run time. Each prints its execution count and must
have found nothing. `scripts/fuzz.sh [SECONDS]` runs the same fuzzers longer.

Also here: the plumbing can see a finding (a crashing target is reported, with its input kept),
the Python target's own checks fire, its mutator stays inside the checksums, and one known memory
fault of kdtr/bundle/format.py, as a strict xfail."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

import kdtr.bundle.summary  # noqa: F401 - imported before fuzz_format so atheris leaves kdtr alone here
from kdtr.errors import BundleError
from kdtr.bundle.format import read_bundle

FUZZ = Path(__file__).resolve().parent / "fuzz"
FUZZ_SECONDS = 40
MIN_EXECUTIONS = 1000


def _load(name: str):
    """tests/format/fuzz/<name>.py by path (tests/format/fuzz is not a package; dataclasses need sys.modules)."""
    key = f"_kdtr_fuzz_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, FUZZ / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


RUN = _load("run")
SEEDS = _load("seeds")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Path:
    return RUN.write_seeds(tmp_path_factory.mktemp("seeds"))


def _report(capsys, run) -> None:
    """The execution count in the test output, whatever pytest's capture and verbosity."""
    with capsys.disabled():
        print(f"\n{run.line()}")


def _assert_clean(run) -> None:
    assert not run.found, f"{run.line()}; artifacts {run.artifacts}\n{run.log_tail}"
    assert run.executions > MIN_EXECUTIONS, run.line()


def test_seeds_are_valid_bundles(seeds):
    paths = sorted(seeds.iterdir())
    assert len(paths) == len(SEEDS.seed_bundles())
    for path in paths:
        read_bundle(path)


# ------------------------------------------------------------------------------------ kdtr.h

def _need_clang() -> None:
    why = RUN.why_no_kdtr_h()
    if why:
        pytest.skip(why)


def test_fuzz_kdtr_h(seeds, tmp_path, capsys):
    """kdtr_open_memory on FUZZ_SECONDS of libFuzzer's inputs: every input a clean error or a
    success with its tensors inside the buffer; no crash, leak, sanitizer report or oversized
    allocation."""
    _need_clang()
    run = RUN.run_fuzzer("kdtr_h", RUN.kdtr_h_target(tmp_path), FUZZ_SECONDS, tmp_path, seeds)
    _report(capsys, run)
    _assert_clean(run)


def test_fuzz_plumbing_sees_a_c_crash(seeds, tmp_path):
    """A target that aborts on a KDTR input is reported as a finding, with the input kept."""
    _need_clang()
    source = tmp_path / "crash.c"
    source.write_text(textwrap.dedent("""\
        #include <stdint.h>
        #include <stdlib.h>
        #include <string.h>
        int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
            if (size >= 4 && memcmp(data, "KDTR", 4) == 0) abort();
            return 0;
        }
        """))
    binary = tmp_path / "crash_target"
    subprocess.run(["clang", *RUN.CLANG_FLAGS, str(source), "-o", str(binary)], check=True)
    run = RUN.run_fuzzer("crash", [str(binary)], 10, tmp_path, seeds)
    assert run.found and run.returncode != 0 and run.artifacts, run.line()


# ----------------------------------------------------------------------------------- kdtr.bundle.format

def _need_atheris() -> None:
    why = RUN.why_no_format()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def target():
    """tests/format/fuzz/fuzz_format.py as a module (kdtr is already imported: not instrumented)."""
    _need_atheris()
    return _load("fuzz_format")


@pytest.fixture
def traced(target, tmp_path):
    """The target's input file and tracemalloc, as its main() sets them up."""
    target._INPUT[:] = [tmp_path / "input.kdtr"]
    tracemalloc.start()
    yield target
    tracemalloc.stop()
    target._INPUT.clear()


def test_fuzz_format(seeds, tmp_path, capsys):
    """read_bundle on FUZZ_SECONDS of atheris's inputs: BundleError or a consistent Bundle, never
    another exception, and peak allocation within the target's bound."""
    _need_atheris()
    run = RUN.run_fuzzer("format", RUN.format_target(), FUZZ_SECONDS, tmp_path, seeds)
    _report(capsys, run)
    _assert_clean(run)


def test_format_target_passes_seeds_and_faults(traced, seeds):
    for path in sorted(seeds.iterdir()):
        raw = path.read_bytes()
        traced.TestOneInput(raw)
        traced.TestOneInput(raw[:-1])                       # truncated: a BundleError
        traced.TestOneInput(raw[:30] + b"\xff" + raw[31:])  # header crc: a BundleError


def test_format_target_flags_other_exceptions(traced, seeds, monkeypatch):
    def broken(path):
        raise ValueError("not a BundleError")

    monkeypatch.setattr(traced, "read_bundle", broken)
    with pytest.raises(ValueError):
        traced.TestOneInput((seeds / "tree_build.kdtr").read_bytes())


def test_format_target_flags_header_sized_allocations(traced, seeds, monkeypatch):
    real = traced.read_bundle

    def greedy(path):
        scratch = np.ones(16 << 20, np.uint8)     # like np.empty(declared shape) before checks
        del scratch
        return real(path)

    monkeypatch.setattr(traced, "read_bundle", greedy)
    with pytest.raises(traced.Finding, match="allocated"):
        traced.TestOneInput((seeds / "every_dtype.kdtr").read_bytes())


def test_format_target_flags_multiline_errors(traced, seeds, monkeypatch):
    def multiline(path):
        raise BundleError("two\nlines", file=path)

    monkeypatch.setattr(traced, "read_bundle", multiline)
    with pytest.raises(traced.Finding, match="one line"):
        traced.TestOneInput((seeds / "tree_build.kdtr").read_bytes())


def test_format_mutator_keeps_checksums(target, seeds, tmp_path, monkeypatch):
    """Structured mutations keep header_len and the header crc32 right, and a mutated tensor's
    crc32 is rewritten: many mutants get past the checksums (raw ones almost never would)."""
    raw = (seeds / "verify_attn_fp32.kdtr").read_bytes()
    monkeypatch.setattr(target.atheris, "Mutate", lambda data, max_size: _flip(data, max_size))
    past_header_crc = read_ok = 0
    for seed in range(2, 200):
        if seed % 8 == 0 or seed % 16 == 1:
            continue                                        # the raw and unrepaired modes
        mutant = target.CustomMutator(raw, 1 << 16, seed)
        header_len = struct.unpack_from("<Q", mutant, 8)[0]
        assert zlib.crc32(mutant[24:24 + header_len]) == struct.unpack_from("<I", mutant, 16)[0]
        past_header_crc += 1
        read_ok += _reads(tmp_path / "mutant.kdtr", mutant)
    assert read_ok > past_header_crc // 4, (read_ok, past_header_crc)


def _flip(data: bytes, max_size: int) -> bytes:
    """A stand-in for atheris.Mutate outside a fuzzing run: one byte of the last third changed
    (mostly data bytes in the data section, the tail of the JSON in the header)."""
    if not data:
        return b"\x00"
    at = len(data) - 1 - (zlib.crc32(data) % max(1, len(data) // 3))
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _reads(path: Path, raw: bytes) -> int:
    path.write_bytes(raw)
    try:
        read_bundle(path)
        return 1
    except BundleError:
        return 0


# ------------------------------------------------------------------------- memory of a refusal

def test_fault_scan_allocates_within_the_input(tmp_path):
    """A bundle whose 1 MiB of padding is non-zero: refusing it allocates at most its size."""
    gap, tensor = 1 << 20, np.ones(64, np.uint8)
    header = (b'{"data_len":%d,"meta":{},"tensors":[{"name":"a","role":"input","dtype":"u8",'
              b'"shape":[64],"offset":%d,"nbytes":64,"crc32":%d}]}'
              % (gap + 64, gap, zlib.crc32(tensor.tobytes())))
    pad = bytes(-(24 + len(header)) % 64)
    raw = (struct.pack("<4sHHQII", b"KDTR", 1, 0, len(header), zlib.crc32(header), 0) + header +
           pad + b"\x07" * gap + tensor.tobytes())
    path = tmp_path / "gap.kdtr"
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="non-zero padding"):
            read_bundle(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= len(raw), f"{peak} bytes allocated to refuse a {len(raw)}-byte file"

