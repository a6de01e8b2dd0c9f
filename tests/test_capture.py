"""kdtr.capture.save_bundle: round trips and every refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtr.capture import save_bundle
from kdtr.errors import BundleError
from kdtr.format import read_bundle
from kdtr.verify import load_case
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case


def torch_inputs(inputs):
    from kdtr.backends import upload

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
