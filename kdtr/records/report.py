"""Machine-readable records: JSON (with provenance), JUnit XML and CSV writers."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from xml.etree import ElementTree

from .. import __version__
from ..atomic import atomic_write
from ..config import REPO_ROOT

from .record import RECORD_FORMAT


def drop_defaults(full: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`full` without the keys whose value is their default (same type and value): records leave
    out what a reader fills back in, so they stay small."""
    return {k: v for k, v in full.items()
            if not (k in defaults and type(v) is type(defaults[k]) and v == defaults[k])}


def plain(value: Any) -> Any:
    """JSON-ready: objects with `to_plain()` through it, other dataclasses to dicts, non-finite
    floats to strings (JSON has no NaN)."""
    if callable(getattr(value, "to_plain", None)) and not isinstance(value, type):
        return plain(value.to_plain())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if hasattr(value, "item") and callable(value.item):       # numpy scalars
        return plain(value.item())
    if isinstance(value, Path):
        return value.as_posix()
    return value


def _is_own_checkout(root: Path, toplevel: str) -> bool:
    """Git's repository is kdtree's own checkout: its top is the folder kdtree runs from and holds
    kdtree's pyproject.toml (an installed wheel inside another project's repository is not)."""
    try:
        same = Path(toplevel).resolve() == Path(root).resolve()
        return same and 'name = "kdtree"' in (Path(root) / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False


@lru_cache(maxsize=1)
def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """The commit and dirty flag of the checkout kdtree runs from; None for both outside git, and
    for an installed kdtree that git finds inside a foreign repository (whose commit says nothing
    of kdtree's code: sources_sha256 does)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    try:
        if _is_own_checkout(root, git("rev-parse", "--show-toplevel")):
            return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None}


# What sources_sha256 covers, under names that do not depend on how kdtree was installed: the
# kernels (the checkout's kernels/, a wheel's kdtr/_kernels, or KDTREE_KERNELS_DIR), the library
# with its C headers, and the CLI (the checkout's cli/, a wheel's kdtree_cli).
SOURCE_PATTERNS = {"kernels": ("*.cu", "*.cuh"), "kdtr": ("**/*.py", "include/*.h"), "cli": ("**/*.py",)}


def code_folders() -> dict[str, Path]:
    """The folders of the code this kdtree runs (see SOURCE_PATTERNS)."""
    import importlib.util

    from ..config import config

    library = Path(__file__).resolve().parents[1]         # kdtr/
    checkout_cli = library.parent / "cli"
    if (library.parent / "pyproject.toml").is_file() and checkout_cli.is_dir():
        cli = checkout_cli
    else:
        spec = importlib.util.find_spec("kdtree_cli")
        cli = Path(spec.origin).parent if spec is not None and spec.origin else checkout_cli
    return {"kernels": config().kernels_dir, "kdtr": library, "cli": cli}


@lru_cache(maxsize=1)
def source_digest(root: Path | None = None) -> str:
    """sha256 over the code a record's numbers come from (kernels, kdtr, cli: paths and bytes), of
    the folders kdtree runs from (`root`: a tree laid out like the checkout instead).

    Git's commit names the checkout, but a copy of a working tree (a lent GPU machine's) can carry a
    stale .git, and an installed wheel has none; this digest is computed from the files themselves,
    under the same names in a checkout and a wheel, so a record can be matched to the commit whose
    `kdtree doctor` (or this function) gives the same value.
    """
    folders = code_folders() if root is None else {name: Path(root) / name for name in SOURCE_PATTERNS}
    digest = hashlib.sha256()
    for name, folder in folders.items():
        files = sorted({path for pattern in SOURCE_PATTERNS[name] for path in folder.glob(pattern)
                        if path.is_file() and "__pycache__" not in path.parts})
        for path in files:
            digest.update(f"{name}/{path.relative_to(folder).as_posix()}".encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_info() -> dict[str, Any]:
    """GPU name, driver and versions, without initialising CUDA when none is present, and without
    importing torch for a run that did not (a numpy verify's record must not pay torch's import):
    then torch's version comes from its metadata and the GPU from nvidia-smi."""
    info: dict[str, Any] = {"gpu": None}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}",
                        multiprocessors=props.multi_processor_count, cuda_runtime=torch.version.cuda)
    else:
        from importlib.metadata import PackageNotFoundError, version

        try:
            info["torch"] = version("torch")
        except PackageNotFoundError:
            pass
    smi = _nvidia_smi("name,compute_cap,driver_version,clocks.sm,clocks.max.sm,clocks.mem")
    if smi:
        name, cap, driver, sm, sm_max, mem = smi
        if info["gpu"] is None:
            info.update(gpu=name, capability="sm_" + cap.replace(".", ""))
        info.update(driver=driver, clock_sm=sm, clock_sm_max=sm_max, clock_mem=mem)
    try:
        from ..runtime.nvrtc import nvrtc_version

        info["nvrtc"] = ".".join(map(str, nvrtc_version()))
    except Exception:   # NVRTC missing is a fact to record, not an error here
        info["nvrtc"] = None
    return info


def _nvidia_smi(fields: str) -> list[str] | None:
    """GPU 0's `fields` as nvidia-smi reports them; None where there is no nvidia-smi or GPU."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        values = [v.strip() for v in out.stdout.splitlines()[0].split(",")] if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    return values if len(values) == len(fields.split(",")) else None


def portable(path: str | os.PathLike) -> str:
    """A path as a record names it: relative to the working directory (with `..` where needed),
    never an absolute folder of the machine that wrote the record."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return Path(text).as_posix()
    try:
        return Path(os.path.relpath(text)).as_posix()
    except ValueError:                      # another drive (Windows): only the name travels
        return Path(text).name


def portable_argv(argv: Iterable[str]) -> list[str]:
    """argv with the program as `kdtree` and absolute paths (also in `--opt=/path`) made portable."""
    out = ["kdtree"]
    for arg in list(argv)[1:]:
        option, sep, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if os.path.isabs(value):
            arg = option + sep + portable(value)
        out.append(arg)
    return out


def ran_as() -> str | None:
    """With KDTREE_GPU: the GPU the launches chose kernels for and the one present, e.g. `sm_120
    (101376 B) on NVIDIA H200` (docs/gpus.md); None without it."""
    from ..config import config

    run_as = config().run_as
    if run_as is None:
        return None
    return f"{run_as.label} on {device_info().get('gpu') or 'no GPU'}"


def record_meta(command: str) -> dict[str, Any]:
    """Provenance of every record; `gpu` names the GPU its numbers come from (kdtr/runtime/gpu_identity.py),
    `ran_as` only where KDTREE_GPU made the launches choose for another GPU."""
    import numpy

    from ..runtime.gpu_identity import gpu_meta

    device = device_info()
    meta = {"format": RECORD_FORMAT, "kdtree": __version__, "command": command,
            "argv": portable_argv(sys.argv), "python": platform.python_version(), "numpy": numpy.__version__,
            "host": platform.node(), **git_state(), "sources_sha256": source_digest(),
            "device": device, "gpu": gpu_meta(device)}
    label = ran_as()
    return meta if label is None else {**meta, "ran_as": label}


def write_json(path: str | Path, record: Any) -> None:
    """Compact JSON (no indentation: a 1000-row record stays small), atomically."""
    atomic_write(path, json.dumps(plain(record), separators=(",", ":"), allow_nan=False) + "\n")


def check_shards(metas: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None) -> list[str]:
    """Why these records' shards do not join into one whole run (empty: they do). Each meta carries
    `shard` ("I/N"; a run without --shard is "1/1") and `suite_sha256` (the selection before
    sharding): a record of another suite or selection or GPU model, a shard twice or a shard missing
    is a problem."""
    from ..runtime.gpu_identity import record_gpu

    labels = list(labels) if labels is not None else [f"record {i + 1}" for i in range(len(metas))]
    problems, seen, count, suite = [], {}, None, None
    gpus = [record_gpu(meta) for meta in metas]
    for label, gpu in zip(labels[1:], gpus[1:]):
        if (gpu.model, gpu.arch) != (gpus[0].model, gpus[0].arch):
            problems.append(f"{label}: ran on {gpu.label}, not {labels[0]}'s {gpus[0].label} (shards of one run "
                            "share one GPU model; put GPUs side by side with --compare-gpus)")
    for label, meta in zip(labels, metas):
        shard, digest = meta.get("shard"), meta.get("suite_sha256")
        parsed = _parse_shard(shard)
        if parsed is None or not isinstance(digest, str):
            problems.append(f"{label}: no shard or suite digest in its meta (re-run it with this kdtree)")
            continue
        if suite is None:
            suite, count, split, first = digest, parsed[1], parsed[2], label
        if digest != suite:
            problems.append(f"{label}: suite {digest[:12]} is not {first}'s {suite[:12]} "
                            "(a shard of another suite, selection or golden set)")
        elif parsed[2] != split:
            problems.append(f"{label}: shard {shard} was split {_split_text(parsed[2])}, {first}'s "
                            f"{_split_text(split)} (every shard needs the same --balance-from record)")
        elif parsed[1] != count:
            problems.append(f"{label}: shard {shard} is not one of {count} like {first}'s")
        elif parsed[0] in seen:
            problems.append(f"{label}: shard {shard} again (also {seen[parsed[0]]})")
        else:
            seen[parsed[0]] = label
    if count is not None and not problems:
        missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in seen]
        if missing:
            problems.append(f"shard(s) {', '.join(missing)} missing")
    return problems


def _parse_shard(text: Any) -> tuple[int, int, str] | None:
    """"I/N" (the name-hash split) or "I/N@DIGEST" (--balance-from, DIGEST naming its case times)."""
    numbers, _, split = str(text).partition("@")
    try:
        index, count = (int(part) for part in numbers.split("/"))
    except ValueError:
        return None
    return (index, count, split) if 1 <= index <= count else None


def _split_text(split: str) -> str:
    return f"by the case times {split}" if split else "by name hash"


# control characters (all but tab and newline), and lone surrogates (undecodable bytes of a file
# name), which a UTF-8 stream cannot encode
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def visible(text: str, *, one_line: bool = False) -> str:
    """`text` with each control character as its Python escape (ESC -> `\\x1b`); tab and newline
    kept unless `one_line`. The terminal's tables and the HTML report show a record's strings so."""
    return (_CONTROL_OR_NEWLINE if one_line else _CONTROL).sub(lambda m: repr(m.group())[1:-1], text)


_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with the characters XML 1.0 cannot hold (terminal escape codes among them) as
    visible escapes (ESC -> `\\x1b`): a hostile case name must not make the report unreadable."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


def junit_xml(record: Any) -> str:
    """One testcase per row of a verify record; a failure carries every failing output's reason."""
    rows, errors = list(record.rows), list(record.errors)
    suite = ElementTree.Element("testsuite", name="kdtree.verify", tests=str(len(rows) + len(errors)),
                                failures=str(sum(r.failed for r in rows)), errors=str(len(errors)),
                                skipped=str(sum(r.skipped is not None for r in rows)))
    for row in rows:
        name = xml_safe(row.case + (f"[trial{row.trial}]" if row.trial else "") + (f"[{row.impl}]" if row.impl else ""))
        case = ElementTree.SubElement(suite, "testcase", classname=f"{row.op}.{row.variant}", name=name,
                                      time=f"{row.seconds:.6f}")
        if row.loosened:           # the bundle's (or --atol/--rtol's) tolerance is looser than the op's
            properties = ElementTree.SubElement(case, "properties")
            ElementTree.SubElement(properties, "property", name="loosened",
                                   value="tolerance looser than the op's default")
        if row.skipped is not None:
            ElementTree.SubElement(case, "skipped", message=xml_safe(row.skipped))
        elif not row.passed:
            reasons = [xml_safe(row.error)] if row.error else [xml_safe(f"{o.name}: {o.reason}")
                                                               for o in row.outputs if not o.passed]
            ElementTree.SubElement(case, "failure", message="; ".join(reasons)).text = "\n".join(reasons)
    for message in errors:
        case = ElementTree.SubElement(suite, "testcase", classname="kdtree", name="input")
        ElementTree.SubElement(case, "error", message=xml_safe(message))
    return ElementTree.tostring(suite, encoding="unicode") + "\n"


def csv_text(header: list[str], rows: Iterable[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()
