"""gen-refs: cases -> golden KDTR bundles with provenance; fresh bundles are skipped."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import ml_dtypes
import numpy as np

from . import __version__
from .atomic import remove_stale_temps
from .errors import KdtrError
from .format import read_bundle, write_bundle
from .ops import get_op
from .ops.base import Case
from .spec import Suite

FRESHNESS_KEYS = ("case_sha256", "reference_sha256", "kdtree")


@dataclass(frozen=True)
class GenResult:
    case: str
    path: Path
    status: str          # "written" or "fresh" (skipped: provenance unchanged)
    seconds: float
    nbytes: int


@lru_cache(maxsize=1)
def reference_sha256() -> str:
    """Hash of every source the references and generators are made of."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for path in sorted([*(here / "ops").glob("*.py"), here / "dtypes.py"]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def case_sha256(case: Case) -> str:
    """Hash of everything that defines a case's bytes (not its position in the suite)."""
    def plain(value):
        return value.tolist() if isinstance(value, np.ndarray) else value

    canonical = {"op": case.op, "variant": case.variant, "seed": case.seed, "name": case.name,
                 "params": case.params, "inline": {k: plain(v) for k, v in case.inline.items()},
                 "tolerance": {k: t.to_json() for k, t in case.tolerance.items()}}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def provenance(suite: Suite, case: Case) -> dict:
    return {"spec": Path(suite.path).as_posix(), "spec_sha256": suite.sha256,
            "case_sha256": case_sha256(case), "reference_sha256": reference_sha256(),
            "kdtree": __version__, "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}


def bundle_path(out_dir: str | Path, case: Case) -> Path:
    return Path(out_dir) / case.op / f"{case.name}.kdtr"


def is_fresh(path: Path, wanted: dict) -> bool:
    """A readable bundle whose provenance matches on every key that decides its bytes."""
    if not path.is_file():
        return False
    try:
        stored = read_bundle(path).meta.get("provenance")
    except KdtrError:
        return False                      # corrupt or foreign: rebuild it
    return isinstance(stored, dict) and all(stored.get(k) == wanted[k] for k in FRESHNESS_KEYS)


def make_bundle(case: Case, prov: dict | None) -> tuple[dict, list[tuple[str, str, np.ndarray]]]:
    """Meta and tensors of one case's golden."""
    op = get_op(case.op)
    generated = op.generate(case)
    expected = op.reference(case.variant, generated.inputs, generated.params)
    tolerance = dict(op.tolerances(case.variant)) | dict(case.tolerance)
    meta = {"op": case.op, "variant": case.variant, "case": case.name, "seed": case.seed,
            "params": generated.params, "case_params": case.params,
            "tolerance": {name: tol.to_json() for name, tol in tolerance.items()}}
    if prov is not None:
        meta["provenance"] = prov
    tensors = [(name, "input", a) for name, a in generated.inputs.items()]
    tensors += [(name, "output", expected[name]) for name in op.outputs]
    tensors += [(name, "aux", a) for name, a in generated.aux.items()]
    return meta, tensors


def gen_refs(cases: Iterable[tuple[Suite, Case]], out_dir: str | Path, *,
             force: bool = False) -> Iterator[GenResult]:
    """Write each case's bundle (atomically), or skip it when its provenance is unchanged; first
    remove the temp files that killed writers left in the folders it writes."""
    cases = list(cases)
    for folder in dict.fromkeys(bundle_path(out_dir, case).parent for _, case in cases):
        remove_stale_temps(folder)
    for suite, case in cases:
        started = time.perf_counter()
        path = bundle_path(out_dir, case)
        prov = provenance(suite, case)
        if not force and is_fresh(path, prov):
            yield GenResult(case.name, path, "fresh", time.perf_counter() - started, path.stat().st_size)
            continue
        meta, tensors = make_bundle(case, prov)
        write_bundle(path, meta, tensors)
        yield GenResult(case.name, path, "written", time.perf_counter() - started, path.stat().st_size)


def stale_bundles(out_dir: str | Path, suites: Iterable[Suite]) -> list[Path]:
    """Bundles in the folders of the suites' ops that no case of these suites names (a renamed or
    removed case's old golden, which verify would otherwise keep checking), sorted."""
    suites = list(suites)
    named = {bundle_path(out_dir, case) for suite in suites for case in suite.cases}
    folders = sorted({Path(out_dir) / suite.op for suite in suites})
    return sorted(path for folder in folders for path in folder.glob("*.kdtr")
                  if path not in named and path.is_file())


def prune(paths: Iterable[Path]) -> list[Path]:
    """Remove the given stale bundles; the ones removed (a file gone meanwhile is no error)."""
    removed = []
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise KdtrError(f"cannot remove stale bundle: {e.strerror or e}", file=path) from e
        removed.append(path)
    return removed
