"""kdtr.bundle.spec's malformed suites: one per error kind, each refused naming its file, line and field."""

from __future__ import annotations

import pytest

from kdtr.errors import SpecError
from kdtr.bundle.spec import load_suite
from tests.spec.fake_ops import expect_error, line_of, write


# -- malformed suites: one per error kind -------------------------------------------------------

MALFORMED = {
    "tab_indent": ("""\
        op: fake_attn
        cases:
        \t- heads: 8  # <-
        """, None, "tabs"),
    "yaml_syntax": ("""\
        op: fake_attn
        cases:
          - heads: 8: 9  # <-
        """, None, "mapping values are not allowed"),
    "two_documents": ("""\
        op: fake_attn
        cases: [{heads: 8}]
        ---  # <-
        op: fake_attn
        """, None, "single document"),
    "top_level_list": ("""\
        - op: fake_attn  # <-
        """, None, "top level must be a mapping"),
    "top_level_scalar": ("""\
        just words  # <-
        """, None, "top level must be a mapping"),
    "unknown_top_level_key": ("""\
        op: fake_attn
        sweeps:  # <-
          heads: [8]
        """, "sweeps", "did you mean 'sweep'"),
    "missing_op": ("""\
        seed: 3  # <-
        cases: [{heads: 8}]
        """, None, "missing required key `op`"),
    "op_not_a_string": ("""\
        op: [fake_attn]  # <-
        cases: [{heads: 8}]
        """, "op", "expected an op name"),
    "unknown_op": ("""\
        variant: fp32
        op: fake_atn  # <-
        cases: [{heads: 8}]
        """, "op", "unknown op 'fake_atn'"),
    "no_cases_or_sweep": ("""\
        op: fake_attn  # <-
        seed: 3
        """, None, "needs `cases`, `sweep` or both"),
    "zero_cases": ("""\
        op: fake_attn
        cases: []  # <-
        """, "cases", "defines no cases"),
    "cases_not_a_list": ("""\
        op: fake_attn
        cases: {heads: 8}  # <-
        """, "cases", "expected a list of cases"),
    "case_not_a_mapping": ("""\
        op: fake_attn
        cases:
          - heads: 8
          - 16  # <-
        """, "cases[1]", "a case is a mapping"),
    "unknown_param": ("""\
        op: fake_attn
        cases:
          - heads: 8
            prefx: 4  # <-
        """, "cases[0].prefx", "did you mean 'prefix'"),
    "bool_is_not_int": ("""\
        op: fake_attn
        cases:
          - heads: true  # <-
        """, "cases[0].heads", "expected an integer, got a bool"),
    "float_is_not_int": ("""\
        op: fake_attn
        cases:
          - heads: 8.0  # <-
        """, "cases[0].heads", "expected an integer"),
    "null_value": ("""\
        op: fake_attn
        cases:
          - heads:  # <-
        """, "cases[0].heads", "got null"),
    "quoted_float_is_str": ("""\
        op: fake_attn
        cases:
          - heads: 8
            sm_scale: "1e-5"  # <-
        """, "cases[0].sm_scale", "expected a number, got str '1e-5'"),
    "non_finite_float": ("""\
        op: fake_attn
        cases:
          - heads: 8
            sm_scale: .inf  # <-
        """, "cases[0].sm_scale", "finite"),
    "yes_is_not_a_string": ("""\
        op: fake_attn
        cases:
          - heads: 8
            mode: yes  # <-
        """, "cases[0].mode", "quote it"),
    "below_min": ("""\
        op: fake_attn
        cases:
          - heads: 0  # <-
        """, "cases[0].heads", "below the minimum 1"),
    "above_max": ("""\
        op: fake_attn
        cases:
          - heads: 8
            batch: 65  # <-
        """, "cases[0].batch", "above the maximum 64"),
    "not_in_choices": ("""\
        op: fake_attn
        cases:
          - heads: 8
            mode: ring  # <-
        """, "cases[0].mode", "'ring' is not one of ['tree', 'chain']"),
    "missing_required": ("""\
        op: fake_attn
        cases:
          - heads: 8
          - prefix: 4  # <-
        """, "cases[1]", "missing required parameter(s) heads"),
    "check_params": ("""\
        op: fake_attn
        cases:
          - {variant: bf16_paged, heads: 12}  # <-
        """, "cases[0]", "divisible by 8"),
    "unknown_suite_variant": ("""\
        op: fake_attn
        variant: fp16  # <-
        cases: [{heads: 8}]
        """, "variant", "unknown variant 'fp16'"),
    "unknown_case_variant": ("""\
        op: fake_attn
        cases:
          - heads: 8
            variant: bf16  # <-
        """, "cases[0].variant", "expected one of: fp32, bf16_paged"),
    "unknown_sweep_variant": ("""\
        op: fake_attn
        defaults: {heads: 8}
        sweep:
          variant: [fp32, fp8]  # <-
        """, "sweep.variant[1]", "unknown variant 'fp8'"),
    "sweep_value_out_of_range": ("""\
        op: fake_attn
        sweep:
          heads: [8, 0, 16]  # <-
        """, "sweep.heads[1]", "below the minimum"),
    "empty_sweep_list": ("""\
        op: fake_attn
        defaults: {heads: 8}
        sweep:
          heads: [8]
          prefix: []  # <-
        """, "sweep.prefix", "non-empty list"),
    "sweep_axis_not_a_list": ("""\
        op: fake_attn
        sweep:
          heads: 8  # <-
        """, "sweep.heads", "non-empty list"),
    "empty_sweep": ("""\
        op: fake_attn
        sweep: {}  # <-
        """, "sweep", "the sweep is empty"),
    "sweep_of_reserved_key": ("""\
        op: fake_attn
        sweep:
          heads: [8]
          seed: [1, 2]  # <-
        """, "sweep.seed", "cannot be swept"),
    "sweep_point_fails_check": ("""\
        op: fake_attn
        sweep:  # <-
          variant: [fp32, bf16_paged]
          heads: [8, 12]
        """, "sweep", "divisible by 8 (sweep point variant='bf16_paged', heads=12)"),
    "sweep_missing_required": ("""\
        op: fake_attn
        sweep:  # <-
          prefix: [0, 1]
        """, "sweep", "missing required parameter(s) heads"),
    "defaults_not_a_mapping": ("""\
        op: fake_attn
        defaults: [heads, 8]  # <-
        cases: [{}]
        """, "defaults", "expected a mapping"),
    "defaults_bad_value": ("""\
        op: fake_attn
        defaults:
          heads: 16
          batch: -1  # <-
        cases: [{}]
        """, "defaults.batch", "below the minimum"),
    "defaults_reserved_key": ("""\
        op: fake_attn
        defaults:
          variant: fp32  # <-
        cases: [{heads: 8}]
        """, "defaults.variant", "not a parameter"),
    "unknown_tolerance_output": ("""\
        op: fake_attn
        tolerance:
          out: exact
          lsе: exact  # <-
        cases: [{heads: 8}]
        """, "tolerance.lsе", "unknown output"),
    "bad_tolerance_value": ("""\
        op: fake_attn
        tolerance:
          out: {atol: -1e-5}  # <-
        cases: [{heads: 8}]
        """, "tolerance.out", "atol must be a finite number"),
    "bad_case_tolerance": ("""\
        op: fake_attn
        cases:
          - heads: 8
            tolerance: {lse: approximately}  # <-
        """, "cases[0].tolerance.lse", "tolerance"),
    "negative_seed": ("""\
        op: fake_attn
        seed: -1  # <-
        cases: [{heads: 8}]
        """, "seed", "a seed is an integer"),
    "bool_case_seed": ("""\
        op: fake_attn
        cases:
          - heads: 8
            seed: false  # <-
        """, "cases[0].seed", "a seed is an integer"),
    "unsafe_name_path": ("""\
        op: fake_attn
        cases:
          - name: ../escape  # <-
            heads: 8
        """, "cases[0].name", "safe file stem"),
    "unsafe_name_hidden": ("""\
        op: fake_attn
        cases:
          - heads: 8
            name: .hidden  # <-
        """, "cases[0].name", "safe file stem"),
    "name_not_a_string": ("""\
        op: fake_attn
        cases:
          - heads: 8
            name: [a]  # <-
        """, "cases[0].name", "safe file stem"),
    "generated_name_unsafe": ("""\
        op: fake_bad_names
        cases:
          - n: 3  # <-
        """, "cases[0]", "not a safe file stem"),
    "unknown_inline_input": ("""\
        op: fake_attn
        cases:
          - heads: 8
            inputs:
              visibilty: [[1]]  # <-
        """, "cases[0].inputs.visibilty", "did you mean 'visibility'"),
    "inline_input_not_a_list": ("""\
        op: fake_attn
        cases:
          - heads: 8
            inputs: {visibility: 1}  # <-
        """, "cases[0].inputs.visibility", "nested list of numbers"),
    "inline_input_ragged": ("""\
        op: fake_attn
        cases:
          - heads: 8
            inputs:
              visibility:
                - [1, 0, 0]
                - [1, 1]  # <-
        """, "cases[0].inputs.visibility[1]", "not rectangular"),
    "inline_input_non_numeric": ("""\
        op: fake_attn
        cases:
          - heads: 8
            inputs:
              visibility:
                - [1, 0]
                - [1, x]  # <-
        """, "cases[0].inputs.visibility[1][1]", "expected a number, got str 'x'"),
    "inline_input_bool": ("""\
        op: fake_attn
        cases:
          - heads: 8
            inputs:
              visibility: [true]  # <-
        """, "cases[0].inputs.visibility[0]", "expected a number, got a bool"),
    "unsupported_tag": ("""\
        op: !!python/name:os.system fake_attn  # <-
        cases: [{heads: 8}]
        """, "op", "could not determine a constructor"),
    "unsupported_collection_tag": ("""\
        op: fake_attn
        cases: !!set {a, b}  # <-
        """, "cases", "unsupported YAML tag"),
    "recursive_alias": ("""\
        op: fake_attn
        defaults: &d  # <-
          <<: *d
        cases: [{heads: 8}]
        """, "defaults", "recursive"),
    "non_scalar_key": ("""\
        op: fake_attn
        cases:
          - heads: 8
            ? [a, b]  # <-
            : 1
        """, "cases[0]", "keys must be plain scalars"),
    "bad_timestamp_scalar": ("""\
        op: fake_attn
        cases:
          - heads: 8
            name: 2024-13-45  # <-
        """, "cases[0].name", "bad scalar"),
}


@pytest.mark.parametrize("text, field, fragment", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_suite(tmp_path, text, field, fragment):
    expect_error(write(tmp_path, text), line_of(text), field, fragment)


DUPLICATES = {   # what is given twice: (suite, field, error fragment, how the first is named)
    "mapping key": ("""\
        op: fake_attn
        seed: 1  # first
        cases: [{heads: 8}]
        seed: 2  # <-
        """, "seed", "duplicate key 'seed'", "first at line"),
    "key inside a case": ("""\
        op: fake_attn
        cases:
          - heads: 8  # first
            prefix: 0
            heads: 16  # <-
        """, "cases[0].heads", "duplicate key", "first at line"),
    "case name": ("""\
        op: fake_attn
        cases:
          - name: same  # first
            heads: 8
          - heads: 16
            name: same  # <-
        """, "cases[1].name", "duplicate case name 'same'", "first defined at line"),
    "explicit case and sweep": ("""\
        op: fake_attn
        cases:
          - heads: 8  # first
        sweep:  # <-
          heads: [16, 8]
        """, "sweep", "duplicate case name 'fp32_h8_p0_b1'", "first defined at line"),
}


@pytest.mark.parametrize("what", DUPLICATES)
def test_a_duplicate_names_both_lines(tmp_path, what):
    text, field, fragment, first = DUPLICATES[what]
    err = expect_error(write(tmp_path, text), line_of(text), field, fragment)
    assert f"{first} {line_of(text, '# first')}" in str(err)


def test_sweep_with_repeated_value_is_a_duplicate(tmp_path):
    text = """\
        op: fake_attn
        sweep:  # <-
          heads: [8, 8]
        """
    expect_error(write(tmp_path, text), line_of(text), "sweep", "duplicate case name")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(tmp_path, text):
    expect_error(write(tmp_path, text), 1, None, "empty suite")


def test_non_utf8(tmp_path):
    data = b"op: fake_attn\ncases:\n  - name: caf\xe9\n    heads: 8\n"
    expect_error(write(tmp_path, data), 3, None, "not UTF-8")


def test_forbidden_control_character(tmp_path):
    data = "op: fake_attn\ncases: [{heads: 8}]\n# bell \x07\n"
    expect_error(write(tmp_path, data), 3, None, "#x0007")


def test_missing_file(tmp_path):
    expect_error(tmp_path / "absent.yaml", None, None, "cannot read suite")


def test_directory_given_as_a_suite(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    expect_error(tmp_path / "dir.yaml", None, None, "cannot read suite")


def test_unknown_op_through_the_real_registry(tmp_path):
    path = write(tmp_path, "op: tree_buld\ncases: [{budget: 4}]\n")
    with pytest.raises(SpecError) as info:
        load_suite(path)                  # default lookup: kdtr.ops.get_op
    assert str(info.value).startswith(f"{path}:1: op: unknown op 'tree_buld'")
    assert "did you mean 'tree_build'" in str(info.value)
