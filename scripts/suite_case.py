"""One suite case for the GPU scripts (launch-case.py, graph-overlap.py): the case a name picks,
its op and generated inputs, on a machine with a CUDA GPU; else one line naming the fault on stderr
and exit 2."""

import sys


def one_case(prog: str, suite: str, pattern: str):
    """(case, op, generated inputs) of the one case of `suite` that `pattern` names, once a CUDA GPU
    is present; SystemExit(2) after one line `prog: fault` otherwise."""
    from kdtr.bundle.spec import load_suite, select
    from kdtr.errors import KdtreeError
    from kdtr.ops import get_op

    try:
        cases = select(load_suite(suite).cases, pattern)
    except KdtreeError as err:
        sys.exit(_fault(prog, str(err)))
    if len(cases) != 1:
        sys.exit(_fault(prog, f"{suite}: {pattern!r} matches {len(cases)} cases, not one"))
    import torch

    if not torch.cuda.is_available():
        sys.exit(_fault(prog, "no CUDA GPU (torch.cuda.is_available() is False)"))
    [case] = cases
    op = get_op(case.op)
    return case, op, op.generate(case)


def _fault(prog: str, text: str) -> int:
    print(f"{prog}: {text}", file=sys.stderr)
    return 2
