"""References against docs/ops/'s worked examples, properties, independent oracles and the torch twins."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtr.dtypes import to_numpy, to_torch
from kdtr.ops import get_op
from kdtr.ops.base import Case
from kdtr.ops.verify_attn import attend_reference

TREE_BUILD, TREE_ACCEPT, VERIFY_ATTN = get_op("tree_build"), get_op("tree_accept"), get_op("verify_attn")


def case(op, variant="default", seed=0, inline=None, **params):
    merged = {p.name: p.default for p in op.params} | params
    return Case("t", op.name, variant, seed, merged, inline=inline or {})


def build(**kwargs):
    generated = TREE_BUILD.generate(case(TREE_BUILD, **kwargs))
    return generated, TREE_BUILD.reference("default", generated.inputs, generated.params)


# -- tree_build: docs/ops/tree_build.md worked examples (expected values copied from the page, not from our code)
def test_worked_example_a():
    _, out = build(budget=4, depth=3, vocab=5, inline={"logits": [[10, 9, 8, 7, 6]] * 3,
                                                        "root_token": [7], "start": [0]})
    assert out["tokens"][0].tolist() == [7, 0, 0, 0, 1]
    assert out["depths"][0, 1:].tolist() == [1, 2, 3, 1]
    assert out["parents"][0].tolist() == [-1, 0, 1, 2, 0]
    # docs/ops/tree_build.md prints these to 6 decimals (and -0.903830 is twice the rounded -0.451915): 2e-6
    np.testing.assert_allclose(out["scores"][0, 1:], [-0.451915, -0.903830, -1.355744, -1.451915], atol=2e-6)


def test_worked_example_b_with_exact_tie():
    _, out = build(budget=6, inline={"probs": [[.6, .3, .1], [.5, .4, .1], [.9, .05, .05]],
                                     "topk_ids": [[100, 101, 102], [200, 201, 202], [300, 301, 302]],
                                     "root_token": [42], "start": [10]})
    assert out["tokens"][0, 1:].tolist() == [100, 200, 101, 300, 201, 300]
    assert out["depths"][0, 1:].tolist() == [1, 2, 1, 3, 2, 3]
    assert out["ranks"][0, 1:].tolist() == [0, 0, 1, 0, 1, 0]
    assert out["parents"][0].tolist() == [-1, 0, 1, 0, 2, 1, 5]
    np.testing.assert_allclose(np.exp(out["scores"][0, 1:]), [.6, .3, .3, .27, .24, .216], rtol=1e-6)
    assert out["scores"][0, 2] == out["scores"][0, 3]          # the tie is exact in fp64
    rows = ["".join(map(str, r)) for r in out["visibility"][0]]
    assert rows == ["1000000", "1100000", "1110000", "1001000", "1110100", "1100010", "1100011"]


def test_tree_accept_worked_example():
    inline = {"tokens": [[42, 100, 200, 101, 300, 201, 300]], "parents": [[-1, 0, 1, 0, 2, 1, 5]],
              "target_ids": [[101, 200, 300, 777, 555, 666, 888]]}
    g = TREE_ACCEPT.generate(case(TREE_ACCEPT, inline=inline))
    out = TREE_ACCEPT.reference("default", g.inputs, g.params)
    assert out["accept_len"].tolist() == [2] and out["bonus"].tolist() == [777]
    assert out["accept_nodes"][0].tolist() == [0, 3, -1, -1, -1, -1, -1]
    assert out["accept_tokens"][0].tolist() == [42, 101, -1, -1, -1, -1, -1]


def rank_tuple(out, b, node):
    path = []
    while node > 0:
        path.append(int(out["ranks"][b, node]))
        node = int(out["parents"][b, node])
    return tuple(reversed(path))


tree_params = st.fixed_dictionaries({
    "batch": st.integers(1, 4), "depth": st.integers(1, 6), "vocab": st.integers(1, 12),
    "budget": st.integers(0, 40), "sharpness": st.sampled_from([0.0, 0.1, 1.0, 6.0]),
    "quantize": st.sampled_from([0.0, 0.5, 2.0]), "seed": st.integers(0, 2**31 - 1)})


@settings(max_examples=150, deadline=None)
@given(tree_params)
def test_tree_build_properties(p):
    seed = p.pop("seed")
    generated, out = build(seed=seed, **p)
    inputs = generated.inputs
    k = inputs["topk_logp"].shape[2]
    available = sum(k ** d for d in range(1, p["depth"] + 1))
    for b in range(p["batch"]):
        n = int(out["num_nodes"][b])
        assert n == min(p["budget"], available)
        nodes = range(1, n + 1)
        assert all(0 <= out["parents"][b, i] < i for i in nodes)
        assert all(out["depths"][b, i] == out["depths"][b, out["parents"][b, i]] + 1 for i in nodes)
        assert np.array_equal(out["positions"][b, :n + 1], inputs["start"][b] + out["depths"][b, :n + 1])
        # visibility is the ancestor-or-self closure, built here by walking parents
        closure = np.zeros_like(out["visibility"][b])
        for i in range(n + 1):
            j = i
            while j >= 0:
                closure[i, j] = 1
                j = int(out["parents"][b, j])
        assert np.array_equal(out["visibility"][b], closure)
        # best-first: scores non-increasing; an exact tie goes to the smaller rank tuple
        for i in range(1, n):
            s0, s1 = out["scores"][b, i], out["scores"][b, i + 1]
            assert s0 >= s1
            if s0 == s1:
                assert rank_tuple(out, b, i) < rank_tuple(out, b, i + 1)
        # scores are the fp64 path sums of the f32 log-probs (up to the sibling update's rounding)
        for i in nodes:
            ranks = rank_tuple(out, b, i)
            path_sum = sum(float(inputs["topk_logp"][b, d, r]) for d, r in enumerate(ranks))
            assert out["scores"][b, i] == pytest.approx(path_sum, rel=1e-12, abs=1e-12)
            assert out["tokens"][b, i] == inputs["topk_ids"][b, len(ranks) - 1, ranks[-1]]
        # siblings carry distinct tokens; padding is -1 / -inf / 0
        for parent in range(n + 1):
            kids = [int(out["tokens"][b, c]) for c in nodes if out["parents"][b, c] == parent]
            assert len(kids) == len(set(kids))
        assert np.all(out["tokens"][b, n + 1:] == -1) and np.all(out["scores"][b, n + 1:] == -np.inf)
        assert not out["visibility"][b, n + 1:].any() and not out["visibility"][b, :, n + 1:].any()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(0, 30), st.sampled_from(["mixed", "none", "full", "partial", "random"]),
       st.integers(0, 2**31 - 1))
def test_tree_accept_properties(batch, budget, mode, seed):
    g = TREE_ACCEPT.generate(case(TREE_ACCEPT, seed=seed, batch=batch, budget=budget, mode=mode, depth=5,
                                  sharpness=3.0))
    tokens, parents, target = g.inputs["tokens"], g.inputs["parents"], g.inputs["target_ids"]
    out = TREE_ACCEPT.reference("default", g.inputs, g.params)
    for b in range(batch):
        tau = int(out["accept_len"][b])
        path = out["accept_nodes"][b, :tau]
        assert tau >= 1 and path[0] == 0 and np.all(out["accept_nodes"][b, tau:] == -1)
        for prev, node in zip(path[:-1], path[1:]):
            assert parents[b, node] == prev and tokens[b, node] == target[b, prev]
        assert out["bonus"][b] == target[b, path[-1]]
        assert not any(parents[b, c] == path[-1] and tokens[b, c] == out["bonus"][b] for c in range(1, tokens.shape[1]))
        assert np.array_equal(out["accept_tokens"][b, :tau], tokens[b, path])
        if mode == "none":
            assert tau == 1
        if mode == "full":
            assert not np.any(parents[b] == path[-1])                  # ends at a leaf


# -- verify_attn: the reference against an independently written per-path causal attention ---------
def per_path_attention(q, keys, prefix_len, parents_of, sm_scale):
    """Each node attends to prefix + root + its ancestors + itself, as plain causal attention."""
    q_len, heads, _ = q.shape
    out, lse = np.zeros((q_len, heads, 512)), np.zeros((q_len, heads))
    for i in range(q_len):
        chain, node = [], i
        while node >= 0:
            chain.append(node)
            node = parents_of[node]
        rows = list(range(prefix_len)) + [prefix_len + n for n in sorted(chain)]
        k = keys[rows].astype(np.float64)
        for h in range(heads):
            s = sm_scale * (k @ q[i, h].astype(np.float64))
            m = s.max()
            w = np.exp(s - m)
            out[i, h] = (w @ k[:, :512]) / w.sum()
            lse[i, h] = m + np.log(w.sum())
    return out, lse


@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
@pytest.mark.parametrize("params", [dict(batch=2, heads=3, prefix=0, budget=6),
                                    dict(batch=3, heads=2, prefix=40, budget=9, prefix_mode="mixed"),
                                    dict(batch=1, heads=4, prefix=17, budget=0)])
def test_verify_attn_matches_per_path_oracle(variant, params):
    c = case(VERIFY_ATTN, variant, seed=11, **params)
    g = VERIFY_ATTN.generate(c)
    ref = VERIFY_ATTN.reference(variant, g.inputs, g.params)
    tree = VERIFY_ATTN.trees(c)
    q_len = params["budget"] + 1
    for b, (q, keys, prefix_len, _) in enumerate(VERIFY_ATTN.requests(variant, g.inputs)):
        out, lse = per_path_attention(q, keys, prefix_len, tree["parents"][b].tolist(), g.params["sm_scale"])
        sl = slice(b * q_len, (b + 1) * q_len)
        got_out = ref["out"][b] if variant == "fp32" else ref["out"][sl]
        got_lse = ref["lse"][b] if variant == "fp32" else ref["lse"][sl]
        # the golden stores f32: compare the float64 math itself to 1e-12 first, then the rounding
        full_out, full_lse = attend_reference(q, keys, prefix_len, tree["visibility"][b], g.params["sm_scale"])
        np.testing.assert_allclose(full_out, out, rtol=0, atol=1e-12)
        np.testing.assert_allclose(full_lse, lse, rtol=0, atol=1e-12)
        # and the stored golden is that result rounded once to f32 (half an ulp: 2^-24 relative)
        np.testing.assert_allclose(got_out, out, rtol=2.0 ** -24, atol=0)
        np.testing.assert_allclose(got_lse, lse, rtol=2.0 ** -24, atol=0)


def test_verify_attn_inputs_are_realistic():
    g = VERIFY_ATTN.generate(case(VERIFY_ATTN, "bf16_paged", seed=3, batch=3, prefix=50, budget=8,
                                  prefix_mode="mixed"))
    pool = g.inputs["kv_buffer"].astype(np.float32)
    used = np.zeros(len(pool), bool)
    used[g.inputs["kv_indices"]] = used[g.inputs["tree_slots"]] = True
    assert np.isnan(pool[~used]).all() and np.isfinite(pool[used]).all() and (~used).any()
    assert not np.array_equal(np.sort(g.inputs["kv_indices"]), g.inputs["kv_indices"])   # fragmented
    assert len(set(np.diff(g.inputs["kv_indptr"]).tolist())) > 1                          # mixed prefixes
    g32 = VERIFY_ATTN.generate(case(VERIFY_ATTN, "fp32", seed=3, batch=3, prefix=50, budget=8, prefix_mode="mixed"))
    for b, p in enumerate(g32.inputs["prefix_len"]):
        assert np.isnan(g32.inputs["kv"][b, p + 9:]).all() and np.isfinite(g32.inputs["kv"][b, :p + 9]).all()
    ref = VERIFY_ATTN.reference("fp32", g32.inputs, g32.params)
    assert (np.abs(ref["out"]) > VERIFY_ATTN.tolerances("fp32")["out"].atol * 10).mean() > 0.9  # zeros fail


# -- the torch twins agree with the references -------------------------------------------------------
def run_torch(op, variant, g):
    return {k: to_numpy(v) for k, v in op.run_torch(variant, {n: to_torch(a) for n, a in g.inputs.items()},
                                                     g.params).items()}


@settings(max_examples=60, deadline=None)
@given(tree_params)
def test_tree_build_torch_is_bit_exact(p):
    seed = p.pop("seed")
    g, ref = build(seed=seed, **p)
    got = run_torch(TREE_BUILD, "default", g)
    for name in ref:
        assert got[name].dtype == ref[name].dtype and np.array_equal(got[name], ref[name]), name


@pytest.mark.parametrize("mode", ["mixed", "none", "full", "partial", "random"])
def test_tree_accept_torch_is_exact(mode):
    for seed in range(5):
        g = TREE_ACCEPT.generate(case(TREE_ACCEPT, seed=seed, batch=7, budget=seed * 7, mode=mode))
        ref = TREE_ACCEPT.reference("default", g.inputs, g.params)
        got = run_torch(TREE_ACCEPT, "default", g)
        for name in ref:
            assert np.array_equal(got[name], ref[name]), name


def test_shared_sibling_token_check_matches_a_brute_force_scan_chunk_by_chunk():
    """The chunked uint64 check finds the first request with two same-token siblings, whatever the
    chunk size, with root/padding slots (-1 parents) never mistaken for siblings."""
    from kdtr.ops.tree_accept import _first_shared_sibling_token

    rng = np.random.default_rng(5)
    for _ in range(200):
        batch, q = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        parents = (rng.random((batch, q)) * np.arange(q)).astype(np.int32)
        parents[rng.random((batch, q)) < 0.2] = -1
        parents[:, 0] = -1
        tokens = rng.integers(-3, 4, (batch, q)).astype(np.int32)
        want = next((r for r in range(batch)
                     if len({(p, t) for p, t in zip(parents[r], tokens[r]) if p >= 0})
                     != int((parents[r] >= 0).sum())), None)
        assert _first_shared_sibling_token(tokens, parents, chunk_elements=int(rng.integers(1, 100))) == want
