"""kdtr.bundle.capture.save_bundle: round trips and every refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtr.bundle.capture import save_bundle
from kdtr.errors import BundleError
from kdtr.bundle.format import read_bundle
from kdtr.verify import load_case
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case


def torch_inputs(inputs):
    from kdtr.impl.backends import upload

    return upload(inputs, "cpu")


def test_inputs_only_round_trip_and_ask_for_the_reference(tmp_path):
    op, inputs, params = small_case("verify_attn", "bf16_paged", **VERIFY_SMALL)
    path = save_bundle(tmp_path / "c.kdtr", "verify_attn", "bf16_paged", torch_inputs(inputs), params=params,
                       case="step7", meta={"engine": "test"})
    bundle = read_bundle(path)
    assert bundle.meta["expected"] == "reference" and bundle.meta["case"] == "step7"
    assert bundle.meta["engine"] == "test" and "captured_by" not in bundle.meta
    for name, array in inputs.items():
        assert bundle.array(name).dtype == array.dtype
        np.testing.assert_array_equal(bundle.array(name).view(np.uint8), array.view(np.uint8))
    assert bundle.arrays("output") == {}


def test_captured_outputs_are_stored_as_the_expected_ones_and_verify_loads_them(tmp_path):
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    outputs = {k: torch.from_numpy(v) for k, v in op.reference("default", inputs, params).items()}
    path = save_bundle(tmp_path / "a.kdtr", "tree_accept", "default", inputs, outputs, params=params,
                       captured_by="sgl_kernel")
    loaded = load_case(path)
    assert loaded.bundle.meta["captured_by"] == "sgl_kernel" and loaded.bundle.meta["expected"] == "captured"
    for name in op.outputs:
        np.testing.assert_array_equal(loaded.expected[name], outputs[name].numpy())


def test_bf16_outputs_of_an_engine_are_kept_in_bf16(tmp_path):
    op, inputs, params = small_case("verify_attn", "bf16_paged", **VERIFY_SMALL)
    got = op.run_torch("bf16_paged", torch_inputs(inputs), params)
    path = save_bundle(tmp_path / "v.kdtr", "verify_attn", "bf16_paged", inputs, got, params=params,
                       captured_by="torch")
    assert str(read_bundle(path).array("out").dtype) == "bfloat16"


@pytest.mark.parametrize("change, message", [
    (lambda i, o, p: ("nope", "default", i, o, p), "unknown op 'nope'"),
    (lambda i, o, p: ("tree_accept", "fast", i, o, p), "tree_accept has no variant 'fast'"),
    (lambda i, o, p: ("tree_accept", "default", {**i, "extra": i["tokens"]}, o, p), "unexpected ['extra']"),
    (lambda i, o, p: ("tree_accept", "default", {k: v for k, v in i.items() if k != "parents"}, o, p),
     "missing ['parents']"),
    (lambda i, o, p: ("tree_accept", "default", {**i, "tokens": i["tokens"].astype(np.int64)}, o, p),
     "dtype int64"),
    (lambda i, o, p: ("tree_accept", "default", {**i, "parents": i["parents"] * 0 + 3}, o, p),
     "parents must be -1 at the root"),
    (lambda i, o, p: ("tree_accept", "default", {**i, "tokens": [1, 2]}, o, p), "not a torch tensor or numpy"),
    (lambda i, o, p: ("tree_accept", "default", i, {**o, "bonus": o["bonus"][:2]}, p), "'bonus' has shape"),
    (lambda i, o, p: ("tree_accept", "default", i, {k: v for k, v in o.items() if k != "bonus"}, p),
     "do not match"),
    (lambda i, o, p: ("tree_accept", "default", i, {**o, "bonus": o["bonus"].astype(np.float32)}, p),
     "'bonus' has dtype f32"),
])
def test_refusals_name_the_fault(tmp_path, change, message):
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    outputs = op.reference("default", inputs, params)
    op_name, variant, i, o, p = change(inputs, outputs, params)
    with pytest.raises(BundleError, match=None) as info:
        save_bundle(tmp_path / "x.kdtr", op_name, variant, i, o, params=p)
    assert message in str(info.value)
    assert not (tmp_path / "x.kdtr").exists()


def test_missing_kernel_params_and_reserved_meta(tmp_path):
    op, inputs, params = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    with pytest.raises(BundleError, match="params lacks"):
        save_bundle(tmp_path / "x.kdtr", "verify_attn", "fp32", inputs, params={})
    with pytest.raises(BundleError, match="meta may not set"):
        save_bundle(tmp_path / "x.kdtr", "verify_attn", "fp32", inputs, params=params, meta={"op": "x"})
    with pytest.raises(BundleError, match="no outputs were given"):
        save_bundle(tmp_path / "x.kdtr", "verify_attn", "fp32", inputs, params=params, captured_by="me")


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    """Issue 30 row 18: save_bundle silently overwrote an earlier capture."""
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    path = save_bundle(tmp_path / "a.kdtr", "tree_accept", "default", inputs, params=params, case="first")
    with pytest.raises(BundleError, match="already exists; pass overwrite=True"):
        save_bundle(path, "tree_accept", "default", inputs, params=params, case="second")
    assert read_bundle(path).meta["case"] == "first"
    save_bundle(path, "tree_accept", "default", inputs, params=params, case="second", overwrite=True)
    assert read_bundle(path).meta["case"] == "second"


@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_nan_or_inf_where_the_op_reads_is_named_and_padding_is_not(tmp_path, variant, poison):
    """Issue 30 row 18: NaN inputs were accepted, and verify then failed every row with no hint.
    The generators' own padding is NaN on purpose (a read of it shows): it stays accepted."""
    op, inputs, params = small_case("verify_attn", variant, **VERIFY_SMALL)
    save_bundle(tmp_path / "padded.kdtr", "verify_attn", variant, inputs, params=params)   # NaN padding
    queries = dict(inputs, q=inputs["q"].copy())
    queries["q"].reshape(-1)[5] = poison
    with pytest.raises(BundleError, match=r"request 0's queries hold 1 NaN or Inf value\(s\)"):
        save_bundle(tmp_path / "q.kdtr", "verify_attn", variant, queries, params=params)
    keys = dict(inputs)
    kv_name = "kv" if variant == "fp32" else "kv_buffer"
    keys[kv_name] = inputs[kv_name].copy()
    read_row = 0 if variant == "fp32" else int(inputs["kv_indices"][0]) if inputs["kv_indices"].size \
        else int(inputs["tree_slots"][0])
    keys[kv_name][(0, read_row) if variant == "fp32" else read_row] = poison
    with pytest.raises(BundleError, match="request 0's keys hold"):
        save_bundle(tmp_path / "k.kdtr", "verify_attn", variant, keys, params=params)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["padded.kdtr"]


def test_numpy_scalar_params_are_stored_as_numbers(tmp_path):
    """Issue 30 row 18: `np.float32(0.1)` as sm_scale (what `layer.scaling` often is) was refused."""
    op, inputs, params = small_case("verify_attn", "fp32", **VERIFY_SMALL)
    path = save_bundle(tmp_path / "s.kdtr", "verify_attn", "fp32", inputs,
                       params={**params, "sm_scale": np.float32(0.1), "step": np.int64(7)})
    stored = read_bundle(path).meta["params"]
    assert stored["sm_scale"] == float(np.float32(0.1)) and stored["step"] == 7
    assert len(load_case(path).inputs) == len(inputs)


@pytest.mark.parametrize("path, message", [
    ("", "needs a file path"), (None, "needs a file path"), ("a\0b.kdtr", "needs a file path"),
    (".", "is a directory"), ("{tmp}", "is a directory"),
])
def test_a_bad_path_is_one_clear_error(tmp_path, path, message):
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    path = path.format(tmp=tmp_path) if isinstance(path, str) else path
    with pytest.raises(BundleError, match=message):
        save_bundle(path, "tree_accept", "default", inputs, params=params)


@pytest.mark.parametrize("case", ["../../evil", ".hidden", "a/b", "x" * 201, "", 7])
def test_case_names_are_checked_like_suite_case_names(tmp_path, case):
    """Issue 30 row 18: `case='../../evil'` was accepted (reports and --json paths use it)."""
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    with pytest.raises(BundleError, match="a case name is a safe file stem"):
        save_bundle(tmp_path / "c.kdtr", "tree_accept", "default", inputs, params=params, case=case)
    assert list(tmp_path.iterdir()) == []
