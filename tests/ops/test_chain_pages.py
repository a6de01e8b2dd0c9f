"""verify_attn's chain drafts (`tree: chain`) and 64-token paged pools (`slots: pages64`)."""

from __future__ import annotations

import numpy as np
import pytest

from kdtr.ops.verify_attn import OP
from kdtr.ops.verify_attn.paging import PAGE, is_chain, pages_of
from tests.impl_cases import small_case


def request_slots(inputs) -> list[np.ndarray]:
    """Each request's slots in key order (prefix, then tree nodes), read from the stored inputs."""
    indptr = inputs["kv_indptr"]
    batch = indptr.size - 1
    q_len = inputs["tree_slots"].size // batch
    return [np.concatenate([inputs["kv_indices"][indptr[b]:indptr[b + 1]],
                            inputs["tree_slots"][b * q_len:(b + 1) * q_len]]) for b in range(batch)]


def relayout(inputs, rng) -> dict[str, np.ndarray]:
    """The same requests (same q, keys and masks) in a fresh page-size-1 pool of another size, the
    keys at a random permutation of its slots, every other slot NaN."""
    requests = request_slots(inputs)
    total = sum(s.size for s in requests)
    pool = total + 7
    order = rng.permutation(pool).astype(np.int32)
    buffer = np.full((pool, inputs["kv_buffer"].shape[1]), np.nan, inputs["kv_buffer"].dtype)
    q_len = inputs["tree_slots"].size // len(requests)
    prefixes, trees, at = [], [], 0
    for slots in requests:
        new = order[at:at + slots.size]
        at += slots.size
        buffer[new] = inputs["kv_buffer"][slots]
        prefixes.append(new[:slots.size - q_len])
        trees.append(new[slots.size - q_len:])
    return {**inputs, "kv_buffer": buffer, "kv_indices": np.concatenate(prefixes),
            "tree_slots": np.concatenate(trees)}


@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
def test_chain_mask_is_the_causal_mask(variant):
    _, inputs, _ = small_case("verify_attn", variant, 5, batch=3, heads=2, prefix=9, budget=6, tree="chain",
                              prefix_mode="mixed")
    masks = [m for *_, m in OP.requests(variant, inputs)]
    for mask in masks:
        np.testing.assert_array_equal(mask, np.tril(np.ones((7, 7), np.uint8)))
    assert is_chain(np.stack(masks))


def test_best_first_trees_are_not_chains():
    """The default trees branch (the check above could not pass on them by accident)."""
    _, inputs, _ = small_case("verify_attn", "bf16_paged", 5, batch=3, heads=2, prefix=9, budget=6)
    assert not is_chain(np.stack([m for *_, m in OP.requests("bf16_paged", inputs)]))


def test_pages64_are_whole_pages_in_permuted_order():
    """Every request's keys (prefix, then tree nodes) fill pages of 64 consecutive slots in key
    order, pages aligned to 64; each slot holds exactly one key of one request; the pages are not
    handed out in order; every slot no request holds is NaN."""
    _, inputs, params = small_case("verify_attn", "bf16_paged", 11, batch=4, heads=2, prefix=150, budget=3,
                                   prefix_mode="mixed", tree="chain", slots="pages64")
    requests = request_slots(inputs)
    prefix_len = np.diff(inputs["kv_indptr"])
    seen = np.concatenate(requests)
    assert np.unique(seen).size == seen.size                       # each key in its own slot
    all_pages = []
    for slots, prefix in zip(requests, prefix_len):
        assert slots.size == prefix + 4                            # exactly the request's keys
        pages = pages_of(slots)
        assert pages is not None and pages.size == -(-slots.size // PAGE)
        np.testing.assert_array_equal(slots, (pages[:, None] * PAGE + np.arange(PAGE)).reshape(-1)[:slots.size])
        all_pages.extend(pages.tolist())
    assert len(set(all_pages)) == len(all_pages)                   # no page shared by two requests
    assert all_pages != sorted(all_pages)                          # random page order
    unused = np.setdiff1d(np.arange(inputs["kv_buffer"].shape[0]), seen)
    assert unused.size and np.isnan(inputs["kv_buffer"][unused].astype(np.float32)).all()
    assert not np.isnan(inputs["kv_buffer"][seen].astype(np.float32)).any()
    OP.check_inputs("bf16_paged", inputs, params)


def test_token_pools_are_not_pages():
    _, inputs, _ = small_case("verify_attn", "bf16_paged", 11, batch=2, heads=2, prefix=150, budget=3)
    assert all(pages_of(s) is None for s in request_slots(inputs))


def test_pages_of_rejects_misaligned_and_broken_runs():
    assert pages_of(np.arange(64, 64 + 70)).tolist() == [1, 2]
    assert pages_of(np.arange(1, 65)) is None                      # not aligned to a page
    broken = np.arange(128, 192)
    broken[[3, 4]] = broken[[4, 3]]
    assert pages_of(broken) is None                                # a page out of order inside


@pytest.mark.parametrize("slots", ["tokens", "pages64"])
def test_the_reference_does_not_depend_on_the_slot_layout(slots):
    """The same requests moved to another pool layout give the same outputs, bit for bit."""
    op, inputs, params = small_case("verify_attn", "bf16_paged", 13, batch=3, heads=2, prefix=100, budget=4,
                                    prefix_mode="mixed", slots=slots)
    moved = relayout(inputs, np.random.default_rng(0))
    assert not np.array_equal(moved["kv_indices"], inputs["kv_indices"])
    op.check_inputs("bf16_paged", moved, params)
    before, after = op.reference("bf16_paged", inputs, params), op.reference("bf16_paged", moved, params)
    for name in op.outputs:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)


def test_pages64_is_refused_for_the_contiguous_variant():
    with pytest.raises(ValueError, match="only bf16_paged has a pool"):
        OP.check_params("fp32", {"slots": "pages64"})


def test_a_suite_names_the_fault_of_a_bad_tree(tmp_path):
    from kdtr.errors import KdtreeError
    from kdtr.bundle.spec import load_suite

    path = tmp_path / "s.yaml"
    path.write_text("op: verify_attn\ncases:\n  - {variant: bf16_paged, tree: star}\n")
    with pytest.raises(KdtreeError, match="tree"):
        load_suite(path)


def test_estimate_covers_a_paged_case():
    """The size estimate (what gen-refs plans memory with) counts the pages' padding."""
    params = {p.name: p.default for p in OP.params} | dict(batch=4, heads=2, prefix=3, budget=1, slots="pages64")
    _, inputs, _ = small_case("verify_attn", "bf16_paged", 3, **{k: params[k] for k in
                                                                  ("batch", "heads", "prefix", "budget", "slots")})
    assert OP.estimate_bytes("bf16_paged", params) >= sum(a.nbytes for a in inputs.values())
