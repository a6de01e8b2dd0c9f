"""Bench cases from YAML suites and golden bundles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import UsageError
from ..ops.base import Case
from ..records.report import portable
from ..impl.builds import KernelBuild
from .settings import QUICK_CASES_PER_SUITE


@dataclass(frozen=True)
class BenchItem:
    """One case to bench, as plain data (it pickles: --devices workers receive their items): where
    its inputs come from, a suite's case (its generator draws them) or a bundle (its stored ones)."""

    name: str
    op: str
    variant: str
    params: dict[str, Any]
    source: str
    case: Case | None = None          # a suite's case
    bundle: str | None = None         # a bundle's path

    def load(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The case's inputs and params (drawn, or read and checked as `kdtree verify` checks them)."""
        if self.case is not None:
            from ..ops import get_op

            generated = get_op(self.op).generate(self.case)
            return generated.inputs, generated.params
        if self.bundle is None:
            raise ValueError(f"bench item {self.name!r} names neither a case nor a bundle")
        from ..bundle.case import load_case

        loaded = load_case(self.bundle)
        return dict(loaded.inputs), dict(loaded.params)


def collect_items(paths: Sequence[str | Path], pattern: str | None = None, quick: bool = False) -> list[BenchItem]:
    """Bench cases from .kdtr bundles and YAML suites (or folders of them), matching -k."""
    from ..bundle.spec import load_suites

    paths = [Path(p) for p in paths]
    bundles = [p for p in paths if p.suffix == ".kdtr"]
    suites = [p for p in paths if p.suffix != ".kdtr"]
    items = items_from_bundles(bundles, pattern) if bundles else []
    if suites:
        items += items_from_suites(load_suites(suites), pattern, quick)
    return items


def estimated_cost(item: BenchItem) -> float:
    """A size proxy for spreading cases over workers: the product of the case's integer parameters."""
    return float(math.prod(v for v in item.params.values()
                           if isinstance(v, int) and not isinstance(v, bool) and v > 0))


def items_from_suites(suites, pattern: str | None = None, quick: bool = False) -> list[BenchItem]:
    """Cases of the suites matching -k; with `quick`, the first QUICK_CASES_PER_SUITE of each suite."""
    from ..ops import get_op
    from ..bundle.spec import select

    items = []
    for suite in suites:
        cases = select(suite.cases, pattern)
        if quick:
            cases = cases[:QUICK_CASES_PER_SUITE]
        for case in cases:
            items.append(BenchItem(case.name, case.op, case.variant, dict(case.params),
                                   portable(case.source or str(suite.path)), case=case))
    return items


def items_from_bundles(paths: Iterable[str | Path], pattern: str | None = None) -> list[BenchItem]:
    """Cases from golden bundles (their stored inputs), checked as `kdtree verify` checks them."""
    from ..bundle.spec import name_matches
    from ..bundle.case import load_case

    items = []
    for path in map(Path, paths):
        loaded = load_case(path)
        bundle, op, variant, params, case = loaded.bundle, loaded.op, loaded.variant, loaded.params, loaded.case
        if not name_matches(case, pattern):
            continue
        case_params = bundle.meta.get("case_params") if isinstance(bundle.meta.get("case_params"), dict) else params
        items.append(BenchItem(case, op.name, variant, dict(case_params), portable(str(path)), bundle=str(path)))
    return items


def items_for_kernels(items: Sequence[BenchItem], builds: Sequence[KernelBuild]) -> list[BenchItem]:
    """With kernels forced by name, only the cases whose op and variant have one of them (as -k
    would select them): a case without any has nothing of the experiment to time. UsageError when
    none is left."""
    from ..ops import get_op

    if not builds:
        return list(items)
    names = {b.name for b in builds}
    chosen = [i for i in items if names & set(get_op(i.op).cuda_kernels(i.variant))]
    if not chosen:
        raise UsageError(f"no case to bench has kernel {', '.join(sorted(names))} (its op and variant)")
    return chosen


def selection_meta(selected: Sequence[BenchItem], shard) -> dict[str, str]:
    """What lets `report --merge` check that shards join: the shard ("I/N") and a digest of the
    whole selection before sharding (every case's op, name, variant and params)."""
    import hashlib
    import json

    from ..scaleout.parallel import Shard

    digest = hashlib.sha256(json.dumps(sorted([f"{i.op}/{i.name}", i.variant, i.params] for i in selected),
                                       sort_keys=True, default=str).encode()).hexdigest()
    return {"shard": Shard.label(shard), "suite_sha256": digest}
