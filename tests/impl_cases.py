"""Small generated cases for the kdtr.impl tests: (op, inputs, params) from the op's own generator."""

from __future__ import annotations

from kdtr.ops import get_op
from kdtr.ops.base import Case


def small_case(op_name: str, variant: str = "default", seed: int = 7, **overrides):
    op = get_op(op_name)
    params = {p.name: p.default for p in op.params} | overrides
    generated = op.generate(Case("small", op_name, variant, seed, params))
    return op, generated.inputs, generated.params


VERIFY_SMALL = dict(batch=3, heads=2, prefix=6, prefix_mode="mixed", budget=5)
ACCEPT_SMALL = dict(batch=6, budget=9, depth=4, vocab=6)
