"""kdtr.bundle.spec: YAML suites -> validated cases, with fake ops injected through `lookup`.

Expected line numbers come from the fixture text: the offending line carries a `# <-` marker.
"""

from __future__ import annotations

import hashlib
import itertools
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kdtr.errors import SpecError
from kdtr.ops.base import Case, Tolerance
from kdtr.bundle.spec import (MAX_SWEEP_CASES, derive_seed, load_suite, load_suites, select)
from tests.helpers import run_kdtree
from tests.spec.fake_ops import LOOKUP, FakeAttn, expect_error, line_of, load, write

DATA = Path(__file__).parents[1] / "data" / "specs"


# -- valid suites -------------------------------------------------------------------------------

def test_defaults_and_case_merge(tmp_path):
    suite = load(tmp_path, """\
        op: fake_attn
        defaults: {heads: 16, batch: 2, sm_scale: 1}
        cases:
          - name: a
          - name: b
            heads: 8
            mode: chain
        """)
    a, b = suite.cases
    assert a.params == {"heads": 16, "prefix": 0, "batch": 2, "sm_scale": 1.0, "mode": "tree",
                        "causal": True}
    assert list(a.params) == [p.name for p in FakeAttn.params]      # the op's order
    assert isinstance(a.params["sm_scale"], float)                  # int accepted for float
    assert b.params == {**a.params, "heads": 8, "mode": "chain"}
    assert (a.variant, a.op) == ("fp32", "fake_attn")               # the op's first variant


def test_suite_fields_and_source(tmp_path):
    text = """\
        op: fake_attn
        variant: bf16_paged
        cases:
          - heads: 16  # <-
        """
    path = write(tmp_path, text)
    suite = load_suite(path, lookup=LOOKUP)
    assert suite.path == path and suite.op == "fake_attn"
    assert suite.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    (case,) = suite.cases
    assert isinstance(case, Case)
    assert case.name == "bf16_paged_h16_p0_b1" and case.variant == "bf16_paged"
    assert case.source == f"{path}:{line_of(text)}"


def test_sweep_product_and_names(tmp_path):
    suite = load(tmp_path, """\
        op: fake_attn
        defaults: {heads: 64, batch: 4}
        sweep:
          heads: [8, 16]
          prefix: [0, 128, 2048]
        """)
    assert len(suite.cases) == 6
    assert [c.name for c in suite.cases] == [f"fp32_h{h}_p{p}_b4"
                                             for h, p in itertools.product([8, 16], [0, 128, 2048])]
    assert all(c.params["batch"] == 4 for c in suite.cases)          # defaults combine
    assert all(c.inline == {} for c in suite.cases)


def test_sweep_over_variants_with_cases(tmp_path):
    suite = load(tmp_path, """\
        op: fake_attn
        cases:
          - {name: hand, heads: 3}
        sweep:
          variant: [fp32, bf16_paged]
          heads: [8]
          batch: [1, 2]
        """)
    assert [(c.name, c.variant) for c in suite.cases] == [
        ("hand", "fp32"),
        ("fp32_h8_p0_b1", "fp32"), ("fp32_h8_p0_b2", "fp32"),
        ("bf16_paged_h8_p0_b1", "bf16_paged"), ("bf16_paged_h8_p0_b2", "bf16_paged")]


def test_sweep_size_limit(tmp_path):
    axis = list(range(1, 65))
    text = f"op: fake_attn\nsweep:\n  heads: {axis}\n  prefix: {list(range(2000))}\n"
    assert len(axis) * 2000 > MAX_SWEEP_CASES
    expect_error(write(tmp_path, text), 2, "sweep", "limit")


def test_yaml_12_floats(tmp_path):
    suite = load(tmp_path, """\
        op: fake_attn
        tolerance: {out: {atol: 1e-5, rtol: 2E+3}}
        cases:
          - {heads: 8, sm_scale: 5e-1}
          - {heads: 16, sm_scale: .5}
          - {heads: 24, sm_scale: 1_000.5}
        """)
    assert [c.params["sm_scale"] for c in suite.cases] == [0.5, 0.5, 1000.5]
    assert suite.cases[0].tolerance["out"] == Tolerance.parse({"atol": 1e-5, "rtol": 2000.0})


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.0, allow_nan=False, allow_infinity=False))
def test_float_written_as_repr_reads_back(tmp_path_factory, value):
    path = write(tmp_path_factory.mktemp("f"), f"op: fake_attn\ncases: [{{heads: 8, sm_scale: {value!r}}}]\n")
    assert load_suite(path, lookup=LOOKUP).cases[0].params["sm_scale"] == value


def test_seed_derivation(tmp_path):
    text = """\
        op: fake_attn
        seed: 1234
        cases:
          - {name: a, heads: 8}
          - {name: b, heads: 8}
          - {name: c, heads: 8, seed: 7}
        sweep:
          heads: [8, 16, 32]
          prefix: [0, 1, 2, 3]
        """
    suite = load(tmp_path, text)
    seeds = {c.name: c.seed for c in suite.cases}
    assert seeds["a"] == zlib.crc32(b"1234:a") == derive_seed(1234, "a")
    assert seeds["c"] == 7                                           # explicit wins
    assert len(set(seeds.values())) == len(seeds)                    # distinct per case
    assert seeds == {c.name: c.seed for c in load(tmp_path, text, "again.yaml").cases}  # stable
    # reordering or removing other cases changes nothing; another suite seed changes everything
    reordered = load(tmp_path, """\
        op: fake_attn
        seed: 1234
        cases:
          - {name: b, heads: 8}
          - {name: a, heads: 8}
        """, "reordered.yaml")
    assert {c.name: c.seed for c in reordered.cases} == {"a": seeds["a"], "b": seeds["b"]}
    other = load(tmp_path, text.replace("seed: 1234", "seed: 1235"), "other.yaml")
    assert all(seeds[c.name] != c.seed for c in other.cases if c.name != "c")


def test_default_suite_seed_is_zero(tmp_path):
    (case,) = load(tmp_path, "op: fake_accept\ncases: [{budget: 4}]\n").cases
    assert case.seed == zlib.crc32(b"0:b4")


def test_tolerance_parse_and_merge(tmp_path):
    suite = load(tmp_path, """\
        op: fake_attn
        tolerance: {out: {atol: 1e-5, rtol: 1e-4}, lse: exact}
        cases:
          - {name: plain, heads: 8}
          - name: tight
            heads: 8
            tolerance: {out: {atol: 0}}
        """)
    plain, tight = suite.cases
    assert plain.tolerance == {"out": Tolerance(atol=1e-5, rtol=1e-4), "lse": Tolerance(exact=True)}
    assert tight.tolerance == {"out": Tolerance(atol=0.0, rtol=0.0), "lse": Tolerance(exact=True)}
    assert plain.tolerance is not tight.tolerance


def test_no_tolerance_means_op_defaults(tmp_path):
    (case,) = load(tmp_path, "op: fake_accept\ncases: [{budget: 1}]\n").cases
    assert case.tolerance == {}


def test_inline_inputs(tmp_path):
    suite = load(tmp_path, """\
        op: fake_accept
        cases:
          - budget: 2
            inputs:
              tokens: [[42, 7, 9]]
              parents: [[-1, 0, 0]]
              target_ids: [[[1.0, 2], [3, 4]]]
          - budget: 0
            inputs: {tokens: []}
        """)
    a, b = suite.cases
    assert a.inline["tokens"].dtype == np.int64 and a.inline["tokens"].shape == (1, 3)
    np.testing.assert_array_equal(a.inline["parents"], [[-1, 0, 0]])
    assert a.inline["target_ids"].dtype == np.float64 and a.inline["target_ids"].shape == (1, 2, 2)
    assert b.inline["tokens"].shape == (0,)


REAL_ACCEPT = """\
op: tree_accept
cases:
  - name: given
    inputs:
      tokens: [[42, 100, 200]]
{rest}"""


@pytest.mark.parametrize("rest, line, field, words", [
    # a wrong shape: parents has 2 nodes, tokens 3
    ("      parents: [[-1, 0]]\n      target_ids: [[1, 2, 3]]\n", 4, "cases[0].inputs", "must all be given"),
    # partly given: no target_ids
    ("      parents: [[-1, 0, 1]]\n", 4, "cases[0].inputs", "must all be given"),
    # a token that int32 cannot hold (a cast wraps it to 1215752191)
    ("      parents: [[-1, 0, 1]]\n      target_ids: [[1, 99999999999, 3]]\n",
     7, "cases[0].inputs.target_ids[0][1]", "99999999999 does not fit i32"),
    ("      parents: [[-1, 0, 1]]\n      target_ids: [[1, 2.5, 3]]\n",
     7, "cases[0].inputs.target_ids[0][1]", "2.5 is not an integer"),
    # parents[2] = 2 breaks parent[i] < i: check_inputs refuses it
    ("      parents: [[-1, 0, 2]]\n      target_ids: [[1, 2, 3]]\n",
     6, "cases[0].inputs.parents", "-1 <= parents[i] < i"),
])
def test_bad_inline_inputs_of_a_real_op_are_refused_at_load(tmp_path, rest, line, field, words):
    path = tmp_path / "inline.yaml"
    path.write_text(REAL_ACCEPT.format(rest=rest))
    with pytest.raises(SpecError) as info:
        load_suite(path)
    assert info.value.field == field and words in info.value.message
    assert str(info.value).startswith(f"{path}:{line}: {field}: ")


def test_an_inline_input_the_generator_ignores_is_refused(tmp_path):
    path = tmp_path / "ignored.yaml"                 # tree_build reads topk_ids only beside probs
    path.write_text("op: tree_build\ncases:\n  - name: ids_alone\n    budget: 4\n"
                    "    inputs: {topk_ids: [[[0, 1], [1, 0]]]}\n")
    with pytest.raises(SpecError) as info:
        load_suite(path)
    assert info.value.field == "cases[0].inputs.topk_ids" and "does not use topk_ids as given" in str(info.value)


def test_gen_refs_refuses_an_inline_parent_cycle_in_one_line_exit_2(tmp_path):
    path = tmp_path / "cycle.yaml"
    path.write_text(REAL_ACCEPT.format(rest="      parents: [[-1, 2, 0]]\n      target_ids: [[1, 2, 3]]\n"))
    done = run_kdtree("gen-refs", path, "-o", tmp_path / "g", cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"{path}:6: cases[0].inputs.parents: inline inputs:" in done.stderr
    assert not (tmp_path / "g").exists()


def test_merge_keys_and_anchors(tmp_path):
    suite = load(tmp_path, """\
        op: fake_attn
        cases:
          - &base {name: base, heads: 8, prefix: 2}
          - <<: *base
            name: derived
            prefix: 3
        """)
    assert [(c.name, c.params["heads"], c.params["prefix"]) for c in suite.cases] == [
        ("base", 8, 2), ("derived", 8, 3)]


# -- select -------------------------------------------------------------------------------------

def _cases(*names: str) -> list[Case]:
    return [Case(name=n, op="x", variant="default", seed=0, params={}) for n in names]


@pytest.mark.parametrize("pattern, expected", [
    (None, ["fp32_h8", "fp32_h16", "bf16_h8", "tiny[1]"]),
    ("", ["fp32_h8", "fp32_h16", "bf16_h8", "tiny[1]"]),
    ("h8", ["fp32_h8", "bf16_h8"]),
    ("fp32", ["fp32_h8", "fp32_h16"]),
    ("*h8", ["fp32_h8", "bf16_h8"]),
    ("fp32*", ["fp32_h8", "fp32_h16"]),
    ("fp32_h?", ["fp32_h8"]),
    ("fp32_h??", ["fp32_h16"]),
    ("h1*", []),                          # a glob matches the whole name
    ("tiny[1]", ["tiny[1]"]),             # brackets are literal
    ("tiny[?]", ["tiny[1]"]),
    ("FP32", []),                         # case-sensitive
    ("nothing", []),
])
def test_select(pattern, expected):
    cases = _cases("fp32_h8", "fp32_h16", "bf16_h8", "tiny[1]")
    assert [c.name for c in select(cases, pattern)] == expected


def test_select_accepts_any_iterable():
    assert [c.name for c in select(iter(_cases("a", "b")), "b")] == ["b"]


# -- load_suites --------------------------------------------------------------------------------

def test_load_suites_over_a_directory():
    tree = DATA / "tree"
    suites = load_suites([tree], lookup=LOOKUP)
    assert [s.path.relative_to(tree).as_posix() for s in suites] == [
        "accept.yml", "attn.yaml"]          # sorted; hidden, .txt and subfolders (nested/) skipped
    accept, attn = suites
    (more,) = load_suites([tree / "nested"], lookup=LOOKUP)
    assert [c.name for c in accept.cases] == ["b0", "b6"]
    assert [c.name for c in attn.cases] == ["tiny", "fp32_h16_p0_b1", "fp32_h16_p128_b1",
                                            "bf16_paged_h16_p0_b1", "bf16_paged_h16_p128_b1"]
    assert attn.cases[0].tolerance["out"] == Tolerance(atol=1e-5, rtol=1e-4)
    assert [c.name for c in more.cases] == ["bf16_paged_h32_p0_b2"]


def test_load_suites_mixed_paths_and_dedup():
    tree = DATA / "tree"
    suites = load_suites([tree / "nested" / "more_attn.yaml", str(tree), tree / "accept.yml"],
                         lookup=LOOKUP)
    assert [s.path.name for s in suites] == ["more_attn.yaml", "accept.yml", "attn.yaml"]
    assert [s.path.name for s in load_suites(tree / "accept.yml", lookup=LOOKUP)] == ["accept.yml"]


def test_load_suites_empty_directory(tmp_path):
    write(tmp_path, "not a suite", "notes.txt")
    with pytest.raises(SpecError, match="no \\*.yaml or \\*.yml suites in this directory"):
        load_suites([tmp_path], lookup=LOOKUP)


def test_duplicate_case_names_across_files(tmp_path):
    first = "op: fake_attn\ncases:\n  - {name: shared, heads: 8}\n"
    second = """\
        op: fake_attn
        cases:
          - heads: 16
          - name: shared  # <-
            heads: 32
        """
    write(tmp_path, first, "a.yaml")
    path_b = write(tmp_path, second, "b.yaml")
    with pytest.raises(SpecError) as info:
        load_suites([tmp_path], lookup=LOOKUP)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path_b), line_of(second), "cases[1].name")
    assert f"also defined at {tmp_path / 'a.yaml'}:3" in str(err)
    assert str(err).startswith(f"{path_b}:{line_of(second)}: cases[1].name: duplicate case name")


def test_same_name_in_different_ops_is_fine(tmp_path):
    write(tmp_path, "op: fake_attn\ncases: [{name: shared, heads: 8}]\n", "a.yaml")
    write(tmp_path, "op: fake_accept\ncases: [{name: shared, budget: 1}]\n", "b.yaml")
    assert [s.op for s in load_suites([tmp_path], lookup=LOOKUP)] == ["fake_attn", "fake_accept"]


def test_load_suites_propagates_a_file_error(tmp_path):
    write(tmp_path, "op: fake_accept\ncases: [{budget: 1}]\n", "a.yaml")
    bad = write(tmp_path, "op: fake_accept\ncases: [{budget: -1}]\n", "b.yaml")
    with pytest.raises(SpecError) as info:
        load_suites([tmp_path], lookup=LOOKUP)
    assert str(info.value).startswith(f"{bad}:2: cases[0].budget: ")


def test_a_fifo_given_as_a_suite_is_refused_not_read(tmp_path):
    """Opening a FIFO blocks until a writer comes: gen-refs on one hung forever."""
    import os

    from kdtr.bundle import spec
    from kdtr.errors import SpecError

    fifo = tmp_path / "suite.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        spec.load_suites([fifo])
