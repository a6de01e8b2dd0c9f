"""Run `kdtree verify` under NVIDIA's compute-sanitizer and attribute its reports to cases.

The child verify prints one line per case (`--quiet`); the sanitizer writes its reports into the same
stream as they happen, so the reports seen before a case's line belong to that case. Any report
fails its case, and a non-zero summary fails the run, even when the process itself exits 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..config import REPO_ROOT
from ..errors import DeviceError

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
PREFIX = "========="
SUMMARY = re.compile(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:errors?|hazards?)(?: displayed \((\d+) errors?)?")
CASE_LINE = re.compile(r"^(PASS|FAIL) (\S+) (\S+)")


@dataclass(frozen=True)
class SanitizedCase:
    line: str                        # the child's verify line
    passed: bool                     # verify passed and the sanitizer reported nothing for it
    reports: tuple[str, ...] = ()


@dataclass
class SanitizeResult:
    tool: str
    cases: list[SanitizedCase] = field(default_factory=list)
    errors: int | None = None        # the sanitizer's summary count (None: no summary seen)
    unattributed: list[str] = field(default_factory=list)
    returncode: int = 0

    @property
    def passed(self) -> bool:
        return (self.errors == 0 and not self.unattributed and self.returncode == 0
                and all(c.passed for c in self.cases))


def find_sanitizer() -> Path:
    for candidate in (shutil.which("compute-sanitizer"),
                      *(Path(root) / "bin" / "compute-sanitizer" for root in
                        (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda") if root)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise DeviceError("compute-sanitizer not found (looked on PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")


def parse(lines: Iterable[str], tool: str, result: SanitizeResult | None = None) -> Iterator[SanitizedCase]:
    """Fold a sanitized verify's output into per-case verdicts (yielded as they complete)."""
    result = result or SanitizeResult(tool)
    pending: list[str] = []
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith(PREFIX):
            body = line[len(PREFIX):].strip()
            match = SUMMARY.search(body)
            if match:
                result.errors = int(match.group(2) if match.group(2) is not None else match.group(1))
            elif body and not body.startswith(("COMPUTE-SANITIZER", "This tool")):
                pending.append(body)
            continue
        if CASE_LINE.match(line):
            case = SanitizedCase(line, line.startswith("PASS") and not pending, tuple(pending))
            pending = []
            result.cases.append(case)
            yield case
    result.unattributed.extend(pending)


def run(tool: str, verify_args: list[str], result: SanitizeResult, *,
        cli_module: str = "cli") -> Iterator[SanitizedCase]:
    """Start `compute-sanitizer --tool TOOL python -m CLI_MODULE verify ARGS --quiet` and parse it
    (`cli` in a checkout, `kdtree_cli` where the wheel is installed)."""
    if tool not in TOOLS:
        raise DeviceError(f"unknown sanitizer tool {tool!r}; choose one of {', '.join(TOOLS)}")
    # --report-api-errors no: cuda-bindings probes driver entry points that this driver lacks
    # (cuGetProcAddress -> CUDA_ERROR_INVALID_VALUE), which memcheck would report as errors; our own
    # CUDA calls are checked by kdtr.runtime.device, so a failing one still fails its case.
    command = [str(find_sanitizer()), "--tool", tool, "--print-limit", "50", "--report-api-errors", "no",
               sys.executable, "-m",
               cli_module, "verify", *verify_args, "--backend", "cuda", "--quiet"]
    root = str(REPO_ROOT)
    env = dict(os.environ, PYTHONUNBUFFERED="1", NO_COLOR="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        yield from parse(proc.stdout, tool, result)
    result.returncode = proc.returncode
