"""The mutation suite: verify's power, measured (docs/numerics.md, "Mutation suite").

Every bundle given is verified (kdtr.verify.verify_item, the comparison `kdtree verify --impl` makes)
by each honest variant and each mutant of its op and variant (tests/mutation/attn.py, trees.py).
The honest error of an output is the largest |x - r| any honest variant made on that golden; a
mutant *should be killed* on a golden where it moves some output beyond 4x that (an exact output:
any difference; a mutant that gives no outputs, or breaks the output contract, too), and is
*killed* where verify fails it. The table: per op/variant and mutant, killed / should be killed;
per honest variant, the goldens it passed; and the gate's largest allowance over the honest error
(median, smallest and largest over the goldens' toleranced outputs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from kdtr.bundle.case import load_case
from kdtr.impl.base import Implementation
from kdtr.verify import Options, VerifyRow, find_bundles, verify_bundle
from tests.mutation import attn, trees

SHOULD_KILL = 4.0          # a mutant beyond 4x the honest error must fail


def implementations(op_name: str, variant: str) -> tuple[list[Implementation], list[Implementation]]:
    """(honest variants, mutants) of an op and variant."""
    if op_name == attn.OP.name:
        return attn.honest(variant), attn.mutants(variant)
    op = trees.TREE_BUILD if op_name == trees.TREE_BUILD.name else trees.TREE_ACCEPT
    return trees.honest(op), trees.mutants(op)


@dataclass
class Group:
    """One op/variant's results over the goldens given."""

    honest_passed: dict[str, int] = field(default_factory=dict)
    honest_failures: list[str] = field(default_factory=list)      # "impl on golden: reason"
    killed: dict[str, int] = field(default_factory=dict)
    should: dict[str, int] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)            # killed where not required to be
    survivors: list[str] = field(default_factory=list)            # "mutant on golden: how far"
    ratios: dict[str, list[float]] = field(default_factory=dict)  # output -> allowance / honest error
    goldens: int = 0


def _rows(path: Path, impls: list[Implementation]) -> dict[str, VerifyRow]:
    """Each implementation's row on the golden (one verify_bundle call: the case's gate is computed once)."""
    rows = verify_bundle(path, Options(), impls=impls)
    return {row.impl: row for row in rows}


def _errors(row: VerifyRow) -> dict[str, tuple[float, int, bool]]:
    """Per output: (max |x - r|, mismatches, exact)."""
    return {o.name: (o.max_abs, o.mismatches, o.tolerance.exact) for o in row.outputs}


def _beyond(errors: dict[str, tuple[float, int, bool]], honest: dict[str, float]) -> str | None:
    """How a mutant's outputs exceed SHOULD_KILL x the honest error (None: they do not)."""
    if not errors:
        return "no outputs"
    for name, (error, mismatches, exact) in errors.items():
        if exact and mismatches:
            return f"{name}: {mismatches} elements differ"
        if not exact and not error <= SHOULD_KILL * honest[name]:
            return f"{name}: {error:.3g} = {error / honest[name] if honest[name] else float('inf'):.3g}x honest"
    return None


def run_suite(paths: Iterable[str | Path]) -> dict[str, Group]:
    """Every golden under `paths` through its op's honest variants and mutants."""
    groups: dict[str, Group] = {}
    for path in find_bundles(paths):
        case = load_case(path)
        key = f"{case.op.name}/{case.variant}"
        group = groups.setdefault(key, Group())
        group.goldens += 1
        honest, mutants = implementations(case.op.name, case.variant)
        rows = _rows(path, honest + mutants)
        honest_rows = {impl.name: rows[impl.name] for impl in honest}
        honest_error: dict[str, float] = {}
        for name, row in honest_rows.items():
            group.honest_passed[name] = group.honest_passed.get(name, 0) + row.passed
            if not row.passed:
                group.honest_failures.append(f"{name} on {case.case}: {row.error or _reasons(row)}")
            for output, (error, _, _) in _errors(row).items():
                honest_error[output] = max(honest_error.get(output, 0.0), error)
        for output in next(iter(honest_rows.values())).outputs:
            if getattr(output, "gate", None) is not None and honest_error.get(output.name):
                group.ratios.setdefault(output.name, []).append(output.gate.allowance / honest_error[output.name])
        for impl in mutants:
            row = rows[impl.name]
            beyond = _beyond(_errors(row), honest_error)
            killed = not row.passed
            group.should.setdefault(impl.name, 0)
            group.killed.setdefault(impl.name, 0)
            group.extra.setdefault(impl.name, 0)
            if beyond:
                group.should[impl.name] += 1
                group.killed[impl.name] += killed
                if not killed:
                    group.survivors.append(f"{impl.name} on {case.case}: {beyond}")
            elif killed:
                group.extra[impl.name] += 1
    return groups


def _reasons(row: VerifyRow) -> str:
    return "; ".join(f"{o.name}: {o.reason}" for o in row.outputs if not o.passed)


def sound(groups: dict[str, Group]) -> bool:
    """Every mutant that should be killed was, and every honest variant passed every golden."""
    return not any(g.survivors or g.honest_failures for g in groups.values())


def table(groups: dict[str, Group]) -> str:
    """The kill table as Markdown."""
    lines = ["| op/variant | implementation | kind | killed / should be killed (honest: passed / goldens) | killed beyond |",
             "|---|---|---|---|---|"]
    for key, group in groups.items():
        for name, passed in group.honest_passed.items():
            lines.append(f"| {key} | {name} | honest | {passed} / {group.goldens} passed | |")
        for name in group.should:
            lines.append(f"| {key} | {name} | mutant | {group.killed[name]} / {group.should[name]} "
                         f"| {group.extra[name] or ''} |")
    lines += ["", "| op/variant | goldens | mutants killed / should be | honest passes "
                  "| gate / honest error: median (smallest to largest) |",
              "|---|---|---|---|---|"]
    for key, group in groups.items():
        honest = sum(group.honest_passed.values())
        ratios = ", ".join(f"{name} {statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"
                           for name, values in group.ratios.items()) or "exact: bit for bit"
        lines.append(f"| {key} | {group.goldens} | {sum(group.killed.values())} / {sum(group.should.values())} "
                     f"| {honest} / {group.goldens * len(group.honest_passed)} | {ratios} |")
    for group in groups.values():
        lines += [f"- survived: {s}" for s in group.survivors] + [f"- honest failed: {f}" for f in group.honest_failures]
    return "\n".join(lines)
