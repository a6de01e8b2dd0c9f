"""Build and run the two KDTR fuzzers; tests/format/test_fuzz.py (a bounded CI run) and scripts/fuzz.sh
(a longer one) both go through here, so they use the same flags.

    python tests/format/fuzz/run.py [--seconds N] [--work DIR] [--only kdtr_h|format]

runs both fuzzers side by side for N seconds each (default 600) from the seed bundles of seeds.py,
keeping each corpus under DIR (default .cache/fuzz) so that a later run goes on from it, prints one
line per fuzzer with its execution count, and exits 1 if either found anything (a crash, a leak, a
sanitizer report, a failed check, a timeout, an out-of-memory); its input is kept in DIR/<name>/
artifacts/ and the log's tail is printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
INCLUDE = ROOT / "kdtr" / "include"
DICT = HERE / "kdtr.dict"
C_SOURCE = HERE / "fuzz_kdtr_h.c"
PY_TARGET = HERE / "fuzz_format.py"
NAMES = ("kdtr_h", "format")

CLANG_FLAGS = ["-std=c99", "-g", "-O1", "-Wall", "-Wextra", "-Werror", "-pedantic",
               "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]
MAX_LEN = 16384                 # bytes of one input; the seeds are 128 B to 3 KB
INPUT_TIMEOUT_S = 10            # one input slower than this is a finding
ARTIFACT_PREFIXES = ("crash-", "leak-", "timeout-", "oom-", "slow-unit-")
REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)"
                    r"|runtime error:|== ?ERROR")
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:allocator_may_return_null=0",
                 "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


@dataclass(frozen=True)
class FuzzRun:
    """One fuzzer's run: what it executed and whether it found anything."""

    name: str
    command: tuple[str, ...]
    returncode: int
    executions: int
    seconds: float
    corpus_units: int
    artifacts: tuple[str, ...]
    log_tail: str

    @property
    def found(self) -> bool:
        return self.returncode != 0 or bool(self.artifacts) or bool(REPORT.search(self.log_tail))

    def line(self) -> str:
        verdict = "FOUND SOMETHING" if self.found else "found nothing"
        return (f"fuzz {self.name}: {self.executions} executions in {self.seconds:.0f} s "
                f"({self.executions / max(self.seconds, 1e-9):.0f}/s), corpus {self.corpus_units} "
                f"units, exit {self.returncode}: {verdict}")


@functools.cache
def why_no_kdtr_h() -> str | None:
    """None when clang can build and run a libFuzzer target with ASan/UBSan, else the reason."""
    if not shutil.which("clang"):
        return "clang is not installed (.ci/run installs it with apt-get when run as root)"
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe.c"
        probe.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                         "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) "
                         "{ (void)d; (void)n; return 0; }\n")
        built = subprocess.run(["clang", *CLANG_FLAGS, str(probe), "-o", f"{folder}/probe"],
                               capture_output=True, text=True, timeout=120)
        if built.returncode:
            return f"clang cannot build a libFuzzer target here: {built.stderr.strip()[-300:]}"
        ran = subprocess.run([f"{folder}/probe", "-runs=1"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, **SANITIZER_ENV})
        if ran.returncode:
            return f"a libFuzzer target does not run here: {ran.stderr.strip()[-300:]}"
    return None


def why_no_format() -> str | None:
    """None when atheris is importable, else the reason."""
    if importlib.util.find_spec("atheris") is None:
        return "atheris is not installed (pip install -e '.[dev]' installs it)"
    return None


def build_kdtr_h(folder: Path) -> Path:
    """fuzz_kdtr_h.c built with libFuzzer, ASan and UBSan; a RuntimeError carries clang's output."""
    out = folder / "fuzz_kdtr_h"
    done = subprocess.run(["clang", *CLANG_FLAGS, f"-I{INCLUDE}", str(C_SOURCE), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"clang {' '.join(CLANG_FLAGS)} failed:\n{done.stderr[-4000:]}")
    return out


def write_seeds(folder: Path) -> Path:
    """The seed bundles (written by kdtr.bundle.format.write_bundle) in `folder`."""
    spec = importlib.util.spec_from_file_location("_kdtr_fuzz_seeds", HERE / "seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_seeds(folder)
    return folder


def _executions(log: str) -> int:
    for pattern in (r"stat::number_of_executed_units:\s*(\d+)", r"Done (\d+) runs",
                    r"^#(\d+)\s"):
        found = re.findall(pattern, log, flags=re.MULTILINE)
        if found:
            return int(found[-1])
    return 0


def run_fuzzer(name: str, target: list[str], seconds: int, work: Path, seeds: Path) -> FuzzRun:
    """Run one libFuzzer-driven target for `seconds` on work/<name>/corpus plus the seeds."""
    base = work / name
    corpus, artifacts = base / "corpus", base / "artifacts"
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    command = [*target, f"-max_total_time={seconds}", "-print_final_stats=1",
               f"-max_len={MAX_LEN}", f"-timeout={INPUT_TIMEOUT_S}", f"-dict={DICT}",
               f"-artifact_prefix={artifacts}/", str(corpus), str(seeds)]
    env = {**os.environ, **SANITIZER_ENV}
    before = set(os.listdir(artifacts))
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", env=env,
                          timeout=seconds + 300, cwd=base)
    elapsed = time.monotonic() - start
    log = done.stdout + done.stderr
    (base / "last.log").write_text(log)
    found = tuple(sorted(n for n in set(os.listdir(artifacts)) - before
                         if n.startswith(ARTIFACT_PREFIXES)))
    return FuzzRun(name, tuple(command), done.returncode, _executions(log), elapsed,
                   sum(1 for _ in corpus.iterdir()), found, log[-6000:])


def kdtr_h_target(build: Path) -> list[str]:
    return [str(build_kdtr_h(build))]


def format_target() -> list[str]:
    return [sys.executable, str(PY_TARGET)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600, help="per fuzzer (default 600)")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "fuzz",
                        help="corpora, artifacts and logs (default .cache/fuzz)")
    parser.add_argument("--only", choices=NAMES, help="run one fuzzer")
    args = parser.parse_args(argv)
    work = args.work.resolve()
    seeds = write_seeds(work / "seeds")
    jobs = {}
    for name, why in (("kdtr_h", why_no_kdtr_h()), ("format", why_no_format())):
        if args.only and name != args.only:
            continue
        if why:
            print(f"fuzz {name}: skipped: {why}", file=sys.stderr)
            continue
        target = kdtr_h_target(work) if name == "kdtr_h" else format_target()
        jobs[name] = target
    if not jobs:
        print("fuzz: nothing to run", file=sys.stderr)
        return 2
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(run_fuzzer, name, target, args.seconds, work, seeds)
                   for name, target in jobs.items()}
        runs = [f.result() for f in futures.values()]
    for run in runs:
        if run.found:
            print(run.log_tail, file=sys.stderr)
            print(f"fuzz {run.name}: artifacts in {work / run.name / 'artifacts'}: "
                  f"{', '.join(run.artifacts) or 'none'}", file=sys.stderr)
    for run in runs:
        print(run.line())
    return 1 if any(run.found for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
