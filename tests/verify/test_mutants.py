"""The mutation suite in CI (tests/mutation; docs/numerics.md): on a few small goldens of every op,
each mutant that moves an output beyond 4x the honest error fails verify, each honest variant
passes, and each mutant is exercised (beyond 4x) somewhere, so none is a mutant in name only."""

from __future__ import annotations

import numpy as np
import pytest

from kdtr.bundle.case import load_case
from tests.helpers import invoke
from tests.mutation import attn_model, trees
from tests.mutation.suite import run_suite, sound, table

# Small shapes that give every mutant a golden to show on: prefixes longer than two online-softmax
# blocks (64 keys) and two stale pages, bushy trees (a node not seeing the next), no prefix at all,
# a prefix long enough for bf16 sums of P·V to drift (128 blocks), exact ties for tree_build and
# trees past 32 nodes for tree_accept.
SUITES = {
    "verify_attn": """\
op: verify_attn
seed: 35
cases:
  - {variant: fp32, batch: 2, heads: 4, prefix: 150, budget: 6}
  - {variant: fp32, batch: 2, heads: 2, prefix: 0, budget: 5}
  - {variant: bf16_paged, batch: 2, heads: 4, prefix: 150, budget: 6, slots: pages64}
  - {variant: bf16_paged, batch: 3, heads: 2, prefix: 40, budget: 4, prefix_mode: mixed}
  - {variant: bf16_paged, batch: 1, heads: 2, prefix: 8192, budget: 2}
""",
    "tree_build": """\
op: tree_build
seed: 35
cases:
  - {batch: 3, depth: 4, vocab: 16, budget: 12}
  - {batch: 4, depth: 5, vocab: 16, budget: 24, quantize: 2.0, sharpness: 2.0}
""",
    "tree_accept": """\
op: tree_accept
seed: 35
cases:
  - {batch: 6, budget: 12, mode: mixed}
  - {batch: 4, budget: 40, depth: 12, sharpness: 8.0, mode: full}
""",
}


@pytest.fixture(scope="module")
def mutant_goldens(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mutants")
    for op, suite in SUITES.items():
        (folder / f"{op}.yaml").write_text(suite)
    result = invoke("gen-refs", *sorted(folder.glob("*.yaml")), "-o", folder / "goldens", "-q")
    assert result.exit_code == 0, result.output
    return folder / "goldens"


def test_every_mutant_that_should_die_dies_and_every_honest_variant_passes(mutant_goldens):
    groups = run_suite([mutant_goldens])
    assert set(groups) == {"verify_attn/fp32", "verify_attn/bf16_paged", "tree_build/default", "tree_accept/default"}
    assert sound(groups), table(groups)
    for key, group in groups.items():
        assert len(group.should) >= 10, key
        idle = [name for name, count in group.should.items() if not count]
        # a bf16 output cannot show 1e-3 of one element (its own rounding is 2^-9)
        assert idle == (["one_out_element_1e-3"] if key == "verify_attn/bf16_paged" else []), (key, table(groups))
        assert all(passed == group.goldens for passed in group.honest_passed.values()), table(groups)


def test_the_mutants_start_from_the_honest_algorithm(mutant_goldens):
    """With no bug switched on, the mutants' tree code is the reference bit for bit, and the kernel
    model lands within the variant's tolerance: a kill is the bug's doing."""
    for path in sorted(mutant_goldens.rglob("*.kdtr")):
        case = load_case(path)
        if case.op.name == "verify_attn":
            got = attn_model.run(case.variant, case.inputs, case.params, attn_model.Knobs(block=64))
            for name, tol in case.op.tolerances(case.variant).items():
                error = np.abs(got[name].astype(np.float64) - case.expected[name])
                assert np.all(error <= tol.atol + tol.rtol * np.abs(case.expected[name])), (path.name, name)
            continue
        compute = trees.build if case.op is trees.TREE_BUILD else trees.accept
        got = compute(case.inputs, case.params, None)
        for name, value in case.expected.items():
            assert np.array_equal(got[name], value), (path.name, name)
