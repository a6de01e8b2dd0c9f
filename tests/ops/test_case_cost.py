"""`Op.case_cost`, the cost model priced from a case's shapes (the roofline's large cases are never
generated), against `Op.cost` on the inputs the case generates."""

from __future__ import annotations

import pytest

from kdtr.ops import get_op
from kdtr.ops.base import Case
from kdtr.config import REPO_ROOT
from kdtr.bundle.spec import load_suite

VERIFY_ATTN = get_op("verify_attn")

SMALL = {
    "mixed_best": dict(batch=5, heads=3, prefix=40, prefix_mode="mixed", budget=6),
    "mixed_chain": dict(batch=4, heads=2, prefix=70, prefix_mode="mixed", budget=3, tree="chain"),
    "same_best": dict(batch=2, heads=4, prefix=33, budget=9),
    "one_request_mixed": dict(batch=1, heads=2, prefix=17, prefix_mode="mixed", budget=4),
    "no_prefix_no_tree": dict(batch=3, heads=1, prefix=0, budget=0),
}


def priced_both_ways(variant: str, seed: int, params: dict):
    """(case_cost, cost of the generated inputs, the generated prefix lengths)."""
    case = Case("t", VERIFY_ATTN.name, variant, seed, VERIFY_ATTN._defaults | params)
    generated = VERIFY_ATTN.generate(case)
    prefixes = [int(p) for _, _, p, _ in VERIFY_ATTN.requests(variant, generated.inputs)]
    return VERIFY_ATTN.case_cost(case), VERIFY_ATTN.cost(variant, generated.inputs, generated.params), prefixes


# Both costs count whole keys, rows and bytes (integers far below 2^53): equal to the last bit.
@pytest.mark.parametrize("variant,slots", [("bf16_paged", "tokens"), ("bf16_paged", "pages64"), ("fp32", "tokens")])
@pytest.mark.parametrize("shape", sorted(SMALL))
def test_case_cost_is_the_cost_of_the_generated_inputs(shape, variant, slots):
    shape_level, materialised, prefixes = priced_both_ways(variant, 11, SMALL[shape] | {"slots": slots})
    assert shape_level == materialised
    if shape.startswith("mixed"):            # the drawn prefixes are exercised, not `prefix` for all
        assert len(set(prefixes)) > 1


@pytest.mark.parametrize("name", ["b1_h8_q9_p21", "b1_h8_q4_p2048_chain", "b1_h16_q4_p2048_chain"])
def test_case_cost_of_small_serving_cases_as_the_suite_gives_them(name):
    """The suite's own seeds and params (best-first trees, chain trees in pages64 pools)."""
    suite = load_suite(REPO_ROOT / "specs" / "bench" / "verify_attn_serving.yaml")
    (case,) = [c for c in suite.cases if c.name == name]
    generated = VERIFY_ATTN.generate(case)
    assert VERIFY_ATTN.case_cost(case) == VERIFY_ATTN.cost(case.variant, generated.inputs, generated.params)


def test_ops_without_a_shape_level_cost_say_so():
    tree_build = get_op("tree_build")
    assert tree_build.case_cost(Case("t", tree_build.name, "default", 0, tree_build._defaults)) is None
