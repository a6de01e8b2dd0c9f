"""kdtr.impl: resolving specs, the outputs check, running implementations (CPU: numpy and torch)."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
import torch

from kdtr.errors import UsageError
from kdtr.impl import (CaseData, Status, builtin_names, check_outputs, evaluate, resolve, resolve_all)
from tests.helpers import install_plugin
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case


def write(tmp_path, body, name="mine.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_builtins_resolve_and_serve_every_op():
    assert set(builtin_names()) == {"cuda", "torch", "numpy", "sglang_triton", "sgl_kernel", "flashinfer_fa2",
                                   "flashmla"}
    for name in ("cuda", "torch", "numpy"):
        impl = resolve(name)
        assert impl.serves("verify_attn", "fp32") and impl.serves("tree_build", "default")


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown implementation 'nope'"),
    ("verify_attn=nomodule", "expected OP[/VARIANT]=module:function"),
    ("bogus_op=x:y", "unknown op 'bogus_op'"),
    ("verify_attn/fp64=x:y", "verify_attn has no variant 'fp64'"),
    ("verify_attn=/no/such/file.py:fn", "no such file"),
    ("verify_attn=kdtree_no_such_module_xyz:fn", "cannot import kdtree_no_such_module_xyz"),
    ("verify_attn=json:no_such_function", "json has no 'no_such_function'"),
    ("verify_attn=json:__doc__", "not a callable"),
    ("", "non-empty"),
])
def test_bad_specs_are_one_line_usage_errors(spec, message):
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        resolve(spec)
    assert "\n" not in str(info.value)


def test_a_user_file_serves_its_op_and_runs(tmp_path):
    path = write(tmp_path, """
        def accept(inputs, params):
            from kdtr.ops import get_op
            return get_op("tree_accept").run_torch("default", inputs, params)
    """)
    impl = resolve(f"tree_accept={path}:accept")
    assert impl.serves("tree_accept", "default") and not impl.serves("tree_build", "default")
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    result = evaluate(impl, CaseData(op, "default", inputs, params))
    assert result.passed, result.reason
    expected = op.reference("default", inputs, params)
    for name in op.outputs:
        np.testing.assert_array_equal(result.outputs[name], expected[name])


def test_a_user_file_that_fails_to_load_is_a_usage_error(tmp_path):
    path = write(tmp_path, "raise RuntimeError('boom at import')\n")
    with pytest.raises(UsageError, match="failed to load: RuntimeError: boom at import"):
        resolve(f"tree_accept={path}:fn")


def test_a_module_function_spec_with_a_variant(tmp_path, monkeypatch):
    write(tmp_path, "def fn(inputs, params):\n    return {}\n", name="kdtree_user_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = resolve("verify_attn/fp32=kdtree_user_mod:fn")
    assert impl.serves("verify_attn", "fp32") and not impl.serves("verify_attn", "bf16_paged")


def test_an_entry_point_callable_declares_what_it_serves(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "kdtree_plugin_mod:attn", body="""
        def attn(inputs, params):
            return {}
        attn.kdtree_serves = "verify_attn/bf16_paged"
        attn.kdtree_outputs = ("out",)
    """)
    impl = resolve("myimpl")
    assert impl.serves("verify_attn", "bf16_paged") and not impl.serves("verify_attn", "fp32")
    from kdtr.ops import get_op

    assert impl.provides(get_op("verify_attn"), "bf16_paged") == ("out",)


def test_an_entry_point_without_a_declaration_is_refused(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "kdtree_plugin_mod:attn", body="def attn(inputs, params):\n    return {}\n")
    with pytest.raises(UsageError, match="must declare kdtree_serves"):
        resolve("myimpl")


def test_an_entry_point_implementation_is_taken_as_it_is(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "kdtree_plugin_mod:IMPL", body="""
        from kdtr.impl import Implementation, Serves
        IMPL = Implementation("plugged", (Serves("tree_build"),), lambda op, v, i, p: (lambda: {}))
    """)
    assert resolve("myimpl").name == "plugged"
    assert [i.name for i in resolve_all(["myimpl", "torch", "myimpl"])] == ["plugged", "torch"]


# -- the outputs check -------------------------------------------------------------------------------

def _accept_case():
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    good = {k: torch.from_numpy(v) for k, v in op.reference("default", inputs, params).items()}
    return op, inputs, params, good


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o.pop("bonus"), "returned no 'bonus'"),
    (lambda o: o.update(extra=torch.zeros(1)), "'extra', not among its declared outputs"),
    (lambda o: o.update(bonus=o["bonus"][:-1]), "'bonus' has shape"),
    (lambda o: o.update(bonus=o["bonus"].long()), "'bonus' has dtype i64, expected i32"),
    (lambda o: o.update(bonus=o["bonus"].numpy()), "'bonus' is a ndarray, not a torch tensor"),
])
def test_outputs_that_break_the_contract_name_the_fault(mutate, message):
    op, inputs, params, good = _accept_case()
    specs = op.output_specs("default", inputs, params)
    assert check_outputs(op, "default", dict(good), specs) is None
    bad = dict(good)
    mutate(bad)
    assert message in check_outputs(op, "default", bad, specs)


def test_a_nan_where_the_reference_has_none_fails():
    op, inputs, params = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    reference = op.reference("fp32", inputs, params)
    got = {k: torch.from_numpy(v.copy()) for k, v in reference.items()}
    specs = op.output_specs("fp32", inputs, params)
    assert check_outputs(op, "fp32", got, specs, reference=reference) is None
    got["out"][1, 2, 0, 7] = float("nan")
    assert "NaN at [1, 2, 0, 7]" in check_outputs(op, "fp32", got, specs, reference=reference)


def test_a_float_output_may_come_wider_but_an_exact_one_may_not():
    """numpy's bf16_paged `out` is f32 (goldens' precision); the check allows it, as compare does."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", **VERIFY_SMALL)
    result = evaluate(resolve("numpy"), CaseData(op, "bf16_paged", inputs, params))
    assert result.passed, result.reason
    assert result.outputs["out"].dtype == np.float32
    bad = {"accept_len": torch.zeros(6, dtype=torch.float32)}
    accept, accept_inputs, accept_params = small_case("tree_accept", **ACCEPT_SMALL)
    fault = check_outputs(accept, "default", bad, accept.output_specs("default", accept_inputs, accept_params),
                          provides=("accept_len",))
    assert fault == "output 'accept_len' has dtype f32, expected i32"


def test_a_raising_implementation_fails_its_case_with_the_first_line(tmp_path):
    path = write(tmp_path, "def fn(inputs, params):\n    raise ValueError('bad tree\\nmore detail')\n")
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    result = evaluate(resolve(f"tree_accept={path}:fn"), CaseData(op, "default", inputs, params))
    assert result.status is Status.ERROR and result.reason == "ValueError: bad tree" and result.outputs is None


def test_an_unavailable_implementation_is_not_run():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: cuda is available")
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    result = evaluate(resolve("cuda"), CaseData(op, "default", inputs, params))
    assert result.status is Status.SKIPPED and result.reason.startswith("cuda: no CUDA GPU")
    assert not result.passed and not result.failed


@pytest.mark.parametrize("op_name, variant, size", [("verify_attn", "fp32", VERIFY_SMALL),
                                                     ("verify_attn", "bf16_paged", VERIFY_SMALL),
                                                     ("tree_accept", "default", ACCEPT_SMALL)])
def test_the_torch_implementation_meets_the_tolerance(op_name, variant, size):
    op, inputs, params = small_case(op_name, variant, **size)
    reference = op.reference(variant, inputs, params)
    result = evaluate(resolve("torch"), CaseData(op, variant, inputs, params), reference)
    assert result.passed, result.reason
    for name, tol in op.tolerances(variant).items():
        got, ref = result.outputs[name].astype(np.float64), reference[name].astype(np.float64)
        if tol.exact:
            np.testing.assert_array_equal(got, ref)
        else:
            assert np.all(np.abs(got - ref) <= tol.atol + tol.rtol * np.abs(ref)), name
