"""Machine-readable records: JSON (with provenance), JUnit XML and CSV writers."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable
from xml.etree import ElementTree

from . import __version__
from .atomic import atomic_write
from .config import REPO_ROOT

RECORD_FORMAT = 1
VERIFY_KIND = "kdtree.verify"


def plain(value: Any) -> Any:
    """JSON-ready: dataclasses to dicts, non-finite floats to strings (JSON has no NaN)."""
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


@lru_cache(maxsize=1)
def git_state() -> dict[str, Any]:
    """The commit and dirty flag of the checkout kdtree runs from (None outside git)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


SOURCE_GLOBS = ("kernels/*.cu", "kernels/*.cuh", "kdtr/**/*.py", "cli/**/*.py")


@lru_cache(maxsize=1)
def source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over the code a record's numbers come from (kernels, kdtr, cli: paths and bytes).

    Git's commit names the checkout, but a copy of a working tree (a lent GPU machine's) can carry a
    stale .git; this digest is computed from the files themselves, so a record can be matched to
    the commit whose `kdtree doctor` (or this function) gives the same value.
    """
    digest = hashlib.sha256()
    files = sorted({path for pattern in SOURCE_GLOBS for path in Path(root).glob(pattern) if path.is_file()})
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_info() -> dict[str, Any]:
    """GPU name, driver and versions, without initialising CUDA when none is present."""
    info: dict[str, Any] = {"gpu": None}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}",
                        multiprocessors=props.multi_processor_count, cuda_runtime=torch.version.cuda)
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,"
                                      "clocks.mem", "--format=csv,noheader"], capture_output=True,
                                     text=True, timeout=10)
                if out.returncode == 0:
                    driver, sm, sm_max, mem = [s.strip() for s in out.stdout.splitlines()[0].split(",")]
                    info.update(driver=driver, clock_sm=sm, clock_sm_max=sm_max, clock_mem=mem)
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass
    except ImportError:
        pass
    try:
        from .nvrtc import nvrtc_version

        info["nvrtc"] = ".".join(map(str, nvrtc_version()))
    except Exception:   # NVRTC missing is a fact to record, not an error here
        info["nvrtc"] = None
    return info


def record_meta(command: str) -> dict[str, Any]:
    import numpy

    return {"format": RECORD_FORMAT, "kdtree": __version__, "command": command,
            "argv": list(sys.argv), "python": platform.python_version(), "numpy": numpy.__version__,
            "host": platform.node(), **git_state(), "sources_sha256": source_digest(),
            "device": device_info()}


def write_json(path: str | Path, record: dict) -> None:
    atomic_write(path, json.dumps(plain(record), indent=2, allow_nan=False) + "\n")


def verify_record(rows: Iterable[Any], errors: Iterable[str], command: str = "verify") -> dict:
    rows = list(rows)
    return {"kind": VERIFY_KIND, "meta": record_meta(command),
            "summary": {"cases": len(rows), "passed": sum(r.passed for r in rows),
                        "failed": sum(not r.passed for r in rows), "errors": list(errors)},
            "rows": rows}


def merge_verify(records: list[dict]) -> dict:
    """One verify record from the records of shards or workers (JSON form), rows in input order."""
    rows = [row for record in records for row in record["rows"]]
    errors = [e for record in records for e in record["summary"]["errors"]]
    return {"kind": VERIFY_KIND, "meta": record_meta("report --merge") | {"merged_from": [r["meta"] for r in records]},
            "summary": {"cases": len(rows), "passed": sum(bool(r["passed"]) for r in rows),
                        "failed": sum(not r["passed"] for r in rows), "errors": errors},
            "rows": rows}


def junit_xml(rows: Iterable[Any], errors: Iterable[str]) -> str:
    """One testcase per row; a failure carries every failing output's reason."""
    rows, errors = list(rows), list(errors)
    suite = ElementTree.Element("testsuite", name="kdtree.verify", tests=str(len(rows) + len(errors)),
                                failures=str(sum(not r.passed for r in rows)), errors=str(len(errors)))
    for row in rows:
        name = row.case + (f"[trial{row.trial}]" if row.trial else "")
        case = ElementTree.SubElement(suite, "testcase", classname=f"{row.op}.{row.variant}", name=name,
                                      time=f"{row.seconds:.6f}")
        if not row.passed:
            reasons = [row.error] if row.error else [f"{o.name}: {o.reason}" for o in row.outputs if not o.passed]
            ElementTree.SubElement(case, "failure", message="; ".join(reasons)).text = "\n".join(reasons)
    for message in errors:
        case = ElementTree.SubElement(suite, "testcase", classname="kdtree", name="input")
        ElementTree.SubElement(case, "error", message=message)
    return ElementTree.tostring(suite, encoding="unicode") + "\n"


def csv_text(header: list[str], rows: Iterable[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()
