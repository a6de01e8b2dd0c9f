#!/usr/bin/env python3
"""What running an implementation under test in a worker process of its own costs (kdtr.impl.isolation):

    PYTHONPATH=. python3 scripts/isolation-overhead.py [goldens] [--repeats 5]

The torch backend stands in for a user's implementation (`OP=scripts/isolation-overhead.py:run`):
each golden is evaluated (run, contract check, comparison with its expected outputs) in this
process and in the worker, `--repeats` times each, alternating; the overhead of a case is the
difference of the two medians. Prints, per op, the median and the largest overhead per case over
its goldens (and the in-process median beside them), then the start of one worker (its first case
less a later one). Run from the repo root; on a GPU machine the implementation runs on the GPU."""

import argparse
import statistics
import sys
import time
from pathlib import Path


def run(inputs, params):
    """The torch backend, as a user's implementation (the op and variant read off the inputs' names)."""
    from kdtr.ops import get_op

    if "q" in inputs:
        return get_op("verify_attn").run_torch("bf16_paged" if "kv_buffer" in inputs else "fp32", inputs, params)
    op = get_op("tree_accept" if "target_ids" in inputs else "tree_build")
    return op.run_torch("default", inputs, params)


def _timed(evaluate, impl, case, expected, tolerances) -> float:
    started = time.perf_counter()
    outcome = evaluate(impl, case, expected, tolerances)
    if not outcome.passed:
        raise SystemExit(f"isolation-overhead: {impl.name}: {outcome.reason}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("goldens", nargs="?", default="goldens", help="a folder of bundles (default goldens/)")
    parser.add_argument("--repeats", type=int, default=5, help="evaluations per golden and way (default 5)")
    args = parser.parse_args()

    from kdtr.bundle.case import load_case
    from kdtr.impl import CaseData, ImplRef, evaluate, resolve
    from kdtr.verify import find_bundles

    bundles = find_bundles([args.goldens])
    if not bundles:
        print(f"isolation-overhead: no bundles under {args.goldens}", file=sys.stderr)
        return 2
    here = Path(__file__).resolve()
    per_op: dict[str, list[tuple[float, float]]] = {}
    starts = []
    for path in bundles:
        loaded = load_case(path)
        spec = f"{loaded.op.name}={here}:run"
        local, isolated = resolve(spec), ImplRef(spec, spec).load()
        case = CaseData(loaded.op, loaded.variant, loaded.inputs, loaded.params)
        tolerances = loaded.op.tolerances(loaded.variant)
        timings = {"here": [], "worker": []}
        for _ in range(args.repeats):
            timings["here"].append(_timed(evaluate, local, case, loaded.expected, tolerances))
            timings["worker"].append(_timed(evaluate, isolated, case, loaded.expected, tolerances))
        if loaded.op.name not in per_op:                  # its worker started with this case
            starts.append(timings["worker"][0] - statistics.median(timings["worker"][1:]))
        here_s, worker_s = statistics.median(timings["here"][1:]), statistics.median(timings["worker"][1:])
        per_op.setdefault(loaded.op.name, []).append((here_s, worker_s - here_s))
    print(f"{'op':<12} {'goldens':>7} {'in-process (median)':>20} {'overhead per case: median':>26} {'largest':>9}")
    for op, rows in sorted(per_op.items()):
        overheads = [o for _, o in rows]
        print(f"{op:<12} {len(rows):>7} {statistics.median(h for h, _ in rows) * 1e3:>17.2f} ms "
              f"{statistics.median(overheads) * 1e3:>23.2f} ms {max(overheads) * 1e3:>6.2f} ms")
    print(f"worker start (first case less a later one): median {statistics.median(starts):.2f} s over {len(starts)} worker(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
