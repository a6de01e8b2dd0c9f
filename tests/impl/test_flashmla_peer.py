"""The `flashmla` peer: its conversions and its prepare/call path on the CPU, with a reference model of
FlashMLA's documented semantics (tests/impl/peer_models.py) in place of the `flash_mla` module; its
parity with the reference and our kernel on an sm_90 GPU."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from kdtr.impl.backends import upload
from kdtr.dtypes import to_numpy
from kdtr.impl import CaseData, ImplUnavailable, Status, check_outputs, evaluate, parity, resolve
from kdtr.impl.peers import flashmla
from tests.impl import peer_models
from tests.impl_cases import small_case
from tests.impl.peer_models import assert_within

CHAIN = dict(batch=3, heads=4, prefix=90, prefix_mode="mixed", budget=3, tree="chain")


@pytest.fixture
def model_module(monkeypatch):
    """`import flash_mla` gives the reference model (the old interface, with use_legacy)."""
    module = types.ModuleType(flashmla.MODULE)
    module.get_mla_metadata = peer_models.get_mla_metadata
    module.flash_mla_with_kvcache = peer_models.flash_mla_with_kvcache
    monkeypatch.setitem(__import__("sys").modules, flashmla.MODULE, module)
    return module


@pytest.mark.parametrize("slots, copied", [("pages64", False), ("tokens", True)])
def test_a_chain_case_through_the_model_gives_the_reference(model_module, slots, copied):
    op, inputs, params = small_case("verify_attn", "bf16_paged", 1, slots=slots, **CHAIN)
    tensors = upload(inputs, "cpu")
    assert flashmla.to_flashmla(tensors, params)["copied"] is copied
    got = flashmla.IMPL.prepare(op, "bf16_paged", tensors, params)()
    assert check_outputs(op, "bf16_paged", got, op.output_specs("bf16_paged", inputs, params)) is None
    assert_within(op, "bf16_paged", {k: to_numpy(v) for k, v in got.items()},
                  op.reference("bf16_paged", inputs, params), ("out", "lse"))


def test_pages64_is_viewed_not_copied():
    """The cache is the pool's own memory and the block table lists each request's pages."""
    _, inputs, params = small_case("verify_attn", "bf16_paged", 2, slots="pages64", **CHAIN)
    tensors = upload(inputs, "cpu")
    args = flashmla.to_flashmla(tensors, params)
    assert args["k_cache"].data_ptr() == tensors["kv_buffer"].data_ptr()
    assert args["k_cache"].shape[1:] == (64, 1, 576) and args["block_table"].dtype == torch.int32
    first = int(tensors["kv_indices"][0]) if int(tensors["kv_indptr"][1]) else int(tensors["tree_slots"][0])
    assert int(args["block_table"][0, 0]) == first // 64


def test_the_conversion_fault_is_caught(model_module):
    """The check bites: with two requests' block tables swapped the outputs leave the tolerance."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", 3, slots="pages64",
                                    **{**CHAIN, "prefix_mode": "same"})
    args = flashmla.to_flashmla(upload(inputs, "cpu"), params)
    args["block_table"] = args["block_table"].flip(0).contiguous()
    meta = peer_models.get_mla_metadata(args["cache_seqlens"], args["q"].shape[1] * args["q"].shape[2], 1)
    out, lse = peer_models.flash_mla_with_kvcache(**flashmla.bind(("use_legacy",), args, meta))
    got = to_numpy(flashmla.from_flashmla(out, lse)["out"]).astype(np.float64)
    expected = op.reference("bf16_paged", inputs, params)["out"].astype(np.float64)
    tol = op.tolerances("bf16_paged")["out"]
    assert np.any(np.abs(got - expected) > tol.atol + tol.rtol * np.abs(expected))


def test_lse_layout_is_transposed_not_rescaled():
    """FlashMLA's lse [B, H, Q] is natural log like ours: moved, never scaled."""
    out = torch.zeros(2, 3, 4, 512)
    lse = torch.arange(24, dtype=torch.float32).view(2, 4, 3)        # [B, H, Q]
    got = flashmla.from_flashmla(out, lse)
    assert got["out"].shape == (6, 4, 512)
    assert got["lse"][1 * 3 + 2, 3] == lse[1, 3, 2]                   # row b·Q + i, head h


def test_a_tree_that_is_not_a_chain_is_not_run():
    _, inputs, params = small_case("verify_attn", "bf16_paged", 4, batch=2, heads=2, prefix=10, budget=5)
    with pytest.raises(ImplUnavailable, match="not a chain"):
        flashmla.to_flashmla(upload(inputs, "cpu"), params)


def test_bind_follows_the_installed_interface():
    args = {"q": 1, "use_legacy": True, "copied": False}
    old = flashmla.bind(("q", "use_legacy"), args, ("meta", "splits"))
    assert old == {"q": 1, "use_legacy": True, "tile_scheduler_metadata": "meta", "num_splits": "splits"}
    new = flashmla.bind(("q",), args, ("sched", None))                # FlashMLA's 2025 interface
    assert new == {"q": 1, "tile_scheduler_metadata": "sched", "num_splits": None}


def test_flashmla_is_registered_and_serves_bf16_paged_only():
    impl = resolve("flashmla")
    assert impl.serves("verify_attn", "bf16_paged") and not impl.serves("verify_attn", "fp32")
    assert "flash_mla" in impl.versions()


def test_a_missing_flash_mla_says_so():
    import importlib.util

    if importlib.util.find_spec("flash_mla") is not None:
        pytest.skip("flash_mla is installed here")
    assert "flash_mla is not importable" in resolve("flashmla").unavailable()


@pytest.mark.gpu
@pytest.mark.parametrize("slots", ["pages64", "tokens"])
def test_flashmla_meets_the_op_tolerance_and_parity_with_ours(slots):
    """On an sm_90 GPU with flash_mla installed (else skipped with the reason): FlashMLA's outputs
    within the op's bf16 tolerance (derived for a kernel with fp32 scores and P rounded to bf16,
    which FlashMLA is), and the parity report beside our kernel."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", 5, batch=4, heads=16, prefix=2048, budget=3,
                                    tree="chain", slots=slots)
    reference = op.reference("bf16_paged", inputs, params)
    case = CaseData(op, "bf16_paged", inputs, params)
    theirs, ours = (evaluate(resolve(name), case, reference) for name in ("flashmla", "cuda"))
    for outcome in (theirs, ours):
        if outcome.status is Status.SKIPPED:
            pytest.skip(outcome.reason)
        assert outcome.status is Status.PASSED, outcome.reason
    assert_within(op, "bf16_paged", theirs.outputs, reference, ("out", "lse"))
    report = parity(op, "bf16_paged", ours.outputs, theirs.outputs, ours_name="cuda", theirs_name="flashmla",
                    reference=reference, inputs=inputs, params=params)
    assert report.output("out").nonfinite == 0
    print(report.to_json(), resolve("flashmla").versions())


def test_the_timed_call_is_flashmla_alone(model_module, monkeypatch):
    """The layout change of lse (a copy) runs when the outputs are read, not inside the call."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", 6, slots="pages64", **CHAIN)
    call = flashmla.IMPL.prepare(op, "bf16_paged", upload(inputs, "cpu"), params)
    converted = []
    real = flashmla.from_flashmla
    monkeypatch.setattr(flashmla, "from_flashmla", lambda out, lse: converted.append(1) or real(out, lse))
    got = call()
    assert converted == [] and sorted(got) == ["lse", "out"]
    assert got["lse"].shape == (inputs["q"].shape[0], inputs["q"].shape[1]) and converted == [1]
    got["out"]
    assert converted == [1]                                            # converted once
