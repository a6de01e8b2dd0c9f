"""The peers' layout conversions on the CPU, through reference models of the peers' documented
semantics (tests/impl/peer_models.py): our inputs, converted, fed to the model, converted back, must give
our numpy reference's outputs. Plus the skip paths. The calls themselves run on the GPU
(tests/impl/test_gpu.py)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from kdtr.impl.backends import upload
from kdtr.dtypes import to_numpy
from kdtr.impl import ImplUnavailable, check_outputs, resolve
from kdtr.impl.peers import flashinfer_fa2, sgl_kernel, sglang_triton
from tests.impl import peer_models
from tests.impl.peer_models import assert_within
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case


@pytest.mark.parametrize("seed", [1, 2])
def test_sglang_arguments_reproduce_the_reference(seed):
    op, inputs, params = small_case("verify_attn", "bf16_paged", seed, **VERIFY_SMALL)
    args = sglang_triton.to_sglang(upload(inputs, "cpu"), params)
    parameters = tuple(inspect.signature(peer_models.extend_attention).parameters)
    bound = sglang_triton.bind(parameters, args)
    peer_models.extend_attention(**bound)
    got = {k: to_numpy(v) for k, v in sglang_triton.from_sglang(bound).items()}
    assert sorted(got) == ["lse", "out"]
    assert_within(op, "bf16_paged", got, op.reference("bf16_paged", inputs, params), ("out", "lse"))


def test_sglang_without_lse_extend_returns_out_only():
    """An older extend_attention_fwd (no lse_extend, no k_scale/v_scale) gets neither argument."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", 3, **VERIFY_SMALL)
    args = sglang_triton.to_sglang(upload(inputs, "cpu"), params)
    old = tuple(n for n in args if n not in sglang_triton.OPTIONAL)
    bound = sglang_triton.bind(old, args)
    assert not set(sglang_triton.OPTIONAL) & set(bound)
    peer_models.extend_attention(**bound)
    got = {k: to_numpy(v) for k, v in sglang_triton.from_sglang(bound).items()}
    assert sorted(got) == ["out"]
    assert_within(op, "bf16_paged", got, op.reference("bf16_paged", inputs, params), ("out",))


def test_sglang_conversion_fault_is_caught():
    """The check bites: with the tree slots of two requests swapped, the model's outputs leave the
    reference's tolerance."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", 4, **VERIFY_SMALL)
    broken = dict(inputs)
    slots = inputs["tree_slots"].reshape(VERIFY_SMALL["batch"], -1)
    broken["tree_slots"] = np.ascontiguousarray(slots[::-1]).reshape(-1)
    args = sglang_triton.to_sglang(upload(broken, "cpu"), params)
    peer_models.extend_attention(**args)
    got = to_numpy(args["o_extend"]).astype(np.float64)
    expected = op.reference("bf16_paged", inputs, params)["out"].astype(np.float64)
    tol = op.tolerances("bf16_paged")["out"]
    assert np.any(np.abs(got - expected) > tol.atol + tol.rtol * np.abs(expected))


def test_sglang_refuses_a_zero_scale():
    _, inputs, params = small_case("verify_attn", "bf16_paged", 5, **VERIFY_SMALL)
    with pytest.raises(ImplUnavailable, match="sm_scale 0"):
        sglang_triton.to_sglang(upload(inputs, "cpu"), {**params, "sm_scale": 0.0})


def test_sglang_bind_names_an_argument_the_kernel_lacks():
    _, inputs, params = small_case("verify_attn", "bf16_paged", 5, **VERIFY_SMALL)
    args = sglang_triton.to_sglang(upload(inputs, "cpu"), params)
    with pytest.raises(ImplUnavailable, match="skip_prefix_custom_mask"):
        sglang_triton.bind(tuple(n for n in args if n != "skip_prefix_custom_mask"), args)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sgl_kernel_arguments_reproduce_the_reference(seed):
    op, inputs, params = small_case("tree_accept", "default", seed, **ACCEPT_SMALL)
    tensors = upload(inputs, "cpu")
    args = sgl_kernel.to_sgl(tensors)
    peer_models.verify_tree_greedy(**args)
    got = sgl_kernel.from_sgl(args, tensors["tokens"])
    expected = op.reference("default", inputs, params)
    assert check_outputs(op, "default", got, op.output_specs("default", inputs, params)) is None
    for name in op.outputs:
        np.testing.assert_array_equal(to_numpy(got[name]), expected[name], err_msg=name)
    assert (expected["accept_len"] > 1).any() and (expected["accept_len"] == 1).any()   # both paths taken


def test_sgl_kernel_links_children_in_node_order():
    """Example B of docs/ops/tree_build.md: parents [-1,0,1,0,2,1,5]."""
    parents = torch.tensor([[-1, 0, 1, 0, 2, 1, 5]], dtype=torch.int32)
    next_token, next_sibling = sgl_kernel.first_child_next_sibling(parents)
    assert next_token.tolist() == [[1, 2, 4, -1, -1, 6, -1]]
    assert next_sibling.tolist() == [[-1, 3, 5, -1, -1, -1, -1]]


def test_sgl_kernel_root_alone():
    """Q = 1: τ = 1, bonus = target_ids[:, 0] (docs/ops/tree_accept.md)."""
    tokens = torch.tensor([[42], [7]], dtype=torch.int32)
    inputs = {"tokens": tokens, "parents": torch.full((2, 1), -1, dtype=torch.int32),
              "target_ids": torch.tensor([[5], [9]], dtype=torch.int32)}
    args = sgl_kernel.to_sgl(inputs)
    peer_models.verify_tree_greedy(**args)
    got = sgl_kernel.from_sgl(args, tokens)
    assert got["accept_len"].tolist() == [1, 1] and got["bonus"].tolist() == [5, 9]
    assert got["accept_tokens"].tolist() == [[42], [7]] and got["accept_nodes"].tolist() == [[0], [0]]


@pytest.mark.parametrize("seed", [1, 2])
def test_flashinfer_arguments_reproduce_the_reference(seed):
    op, inputs, params = small_case("verify_attn", "bf16_paged", seed, **VERIFY_SMALL)
    plan, run = flashinfer_fa2.to_flashinfer(upload(inputs, "cpu"), params)
    out, lse2 = peer_models.paged_prefill(plan, run["q"], run["paged_kv_cache"])
    got = {k: to_numpy(v) for k, v in flashinfer_fa2.from_flashinfer(out, lse2).items()}
    assert_within(op, "bf16_paged", got, op.reference("bf16_paged", inputs, params), ("out", "lse"))


@pytest.mark.parametrize("name, module", [("sglang_triton", "sglang"), ("sgl_kernel", "sgl_kernel"),
                                          ("flashinfer_fa2", "flashinfer")])
def test_a_missing_peer_says_which_import_failed(name, module):
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    reason = resolve(name).unavailable()
    assert reason is not None and f"{module} is not importable" in reason


def test_peers_declare_what_they_serve():
    assert resolve("sglang_triton").serves("verify_attn", "bf16_paged")
    assert not resolve("sglang_triton").serves("verify_attn", "fp32")
    assert resolve("flashinfer_fa2").serves("verify_attn", "bf16_paged")
    assert resolve("sgl_kernel").serves("tree_accept", "default")
    assert not resolve("sgl_kernel").serves("tree_build", "default")
