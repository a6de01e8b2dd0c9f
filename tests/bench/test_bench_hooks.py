"""The default bench suites and the ops' bench hooks: dense references, baselines, their tolerances, checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtr import bench
from kdtr.impl.backends import upload
from kdtr.ops.compare import compare_output
from kdtr.dtypes import to_numpy
from kdtr.impl import baselines as make_baselines
from kdtr.ops import get_op
from kdtr.ops.base import Case


# -- the default suites and the ops' bench hooks ----------------------------------------------------

def test_default_bench_suites():
    from kdtr.bundle import spec
    from kdtr.config import REPO_ROOT

    suites = spec.load_suites(REPO_ROOT / "specs" / "bench")
    assert {s.op for s in suites} == {"tree_build", "verify_attn", "tree_accept"}
    attn = {(c.variant, c.params["batch"], c.params["heads"], c.params["budget"] + 1, c.params["prefix"])
            for s in suites if s.op == "verify_attn" for c in s.cases}
    for perf_case in [("fp32", 1, 16, 17, 2048), ("bf16_paged", 8, 64, 33, 8192),
                      ("bf16_paged", 64, 16, 65, 32768), ("bf16_paged", 1, 128, 65, 131072),
                      ("fp32", 4, 16, 17, 8192)]:
        assert perf_case in attn
    # where it serves (TP8: 8 heads a GPU): the shapes of the serving issue's table
    for serving_case in [("bf16_paged", 1, 8, 9, 21), ("bf16_paged", 1, 16, 17, 2048),
                         ("bf16_paged", 8, 8, 33, 8192), ("bf16_paged", 32, 8, 65, 4096),
                         ("bf16_paged", 16, 16, 33, 4096)]:
        assert serving_case in attn
    # the latency sweeps: prefix 21 .. 32768 at B in {1, 8}, H in {8, 16}; Q in {9, 17, 33, 65}
    for b in (1, 8):
        for h in (8, 16):
            assert {p for _, bb, hh, q, p in attn if (bb, hh, q) == (b, h, 17)} >= {21, 2048}
        assert {p for _, bb, hh, q, p in attn if (bb, hh, q) == (b, 8, 17)} >= {21, 2048, 32768}
        assert {q for _, bb, hh, q, p in attn if (bb, hh, p) == (b, 8, 2048)} >= {9, 17, 65}
    assert {h for _, _, h, _, _ in attn} >= {8, 16, 64, 128}
    assert {q for _, _, _, q, _ in attn} >= {5, 9, 17, 33, 65}
    assert min(p for *_, p in attn) <= 21 and max(p for *_, p in attn) == 131072
    assert {b for _, b, *_ in attn} >= {1, 64}
    for s in suites:
        if s.op in ("tree_build", "tree_accept"):
            assert all(c.params["depth"] == 15 for c in s.cases)
            assert {c.params["batch"] for c in s.cases} >= {1, 256}
            assert {c.params["budget"] for c in s.cases} >= {8, 64}
    quick = bench.cases.items_from_suites(suites, quick=True)
    assert len(quick) == len(suites) * bench.settings.QUICK_CASES_PER_SUITE
    assert any(i.op == "verify_attn" and i.params["heads"] == 8 for i in quick)     # --quick keeps TP8


@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
def test_verify_attn_dense_reference_and_sdpa_baseline(variant):
    op = get_op("verify_attn")
    case = Case("t", "verify_attn", variant, 5, dict(op._defaults, batch=3, heads=8, prefix=40, budget=6,
                                                     prefix_mode="mixed"))
    generated = op.generate(case)
    expected = op.reference(variant, generated.inputs, generated.params)
    inputs = upload(generated.inputs, "cpu")
    for chunk in (None, 4000, 1):                    # whole, request chunks, head chunks
        got = op.dense_reference(variant, inputs, generated.params, chunk_bytes=chunk)
        for name in ("out", "lse"):
            np.testing.assert_allclose(to_numpy(got[name]), expected[name], rtol=1e-6, atol=1e-6)
    assert op.bench_reference(variant, inputs, generated.params) is None      # CPU: the numpy reference
    baselines = {b.name: b for b in make_baselines(op, variant, generated.inputs, generated.params)}
    if variant == "fp32":
        assert set(baselines) == {"torch", "torch_compile", "sdpa"}
        assert baselines["torch_compile"].bench.slow_setup and baselines["torch"].bench.backend == "torch"
    else:
        assert set(baselines) == {"torch_bf16", "torch_compile_bf16", "torch_fp32", "torch_compile_fp32", "sdpa"}
        assert baselines["torch_compile_bf16"].bench.slow_setup and baselines["torch_fp32"].bench.backend == "torch"
        assert not baselines["torch_compile_fp32"].bench.default                # only when --baseline names it
        assert all(b.bench.default for name, b in baselines.items() if name != "torch_compile_fp32")
    # each serves exactly this op and variant; SDPA declares the one output it gives
    assert all(b.serves("verify_attn", variant) and not b.serves("verify_attn", other)
               for b in baselines.values() for other in op.variants if other != variant)
    eager = baselines["torch" if variant == "fp32" else "torch_fp32"]
    assert baselines["sdpa"].provides(op, variant) == ("out",) and eager.provides(op, variant) == ("out", "lse")
    assert baselines["sdpa"].unavailable() is None              # a case this small fits anywhere
    got = baselines["sdpa"].prepare(op, variant, inputs, generated.params)()
    assert set(got) == {"out"}
    tol = op.tolerances(variant)["out"]
    assert compare_output("out", to_numpy(got["out"]), expected["out"], tol).passed
    assert op.compute_unit(variant) == ("fp32_fma" if variant == "fp32" else "bf16_mma")
    # a kernel rates against the unit it runs on where that is not the variant's
    units = {k: op.compute_unit(variant, k) for k in op.cuda_kernels(variant)}
    fp32_units = {"fp32_bf16x3": "bf16_mma_x6", "fp32_dmma": "fp32_fma", "fp32_ffma99": "fp32_fma"}
    assert units == (fp32_units if variant == "fp32" else
                     {"bf16_wgmma2": "bf16_mma", "bf16_mma": "bf16_mma", "bf16_mma99": "bf16_mma"})
    assert op.bench_extra(variant, generated.inputs, generated.params)["kv_tokens"] > 0


def test_tree_build_cpu_heap_baseline_is_the_reference():
    op = get_op("tree_build")
    case = Case("t", "tree_build", "default", 3, dict(op._defaults, batch=4, depth=15, vocab=128, budget=32))
    generated = op.generate(case)
    baselines = {b.name: b for b in make_baselines(op, "default", generated.inputs, generated.params)}
    assert set(baselines) == {"torch", "cpu_heap"} and baselines["cpu_heap"].bench.clock == "host"
    got = baselines["cpu_heap"].prepare(op, "default", upload(generated.inputs, "cpu"), generated.params)()
    expected = op.reference("default", generated.inputs, generated.params)
    for name, value in expected.items():
        np.testing.assert_array_equal(to_numpy(got[name]), value)


def test_default_baseline_is_the_torch_backend():
    op = get_op("tree_accept")
    (torch_baseline,) = make_baselines(op, "default", {}, {})
    assert torch_baseline.name == "torch" and torch_baseline.bench.clock == "device"
    assert torch_baseline.serves("tree_accept", "default") and not torch_baseline.serves("tree_build", "default")
    assert op.compute_unit("default") == "bf16_mma" and op.bench_reference("default", {}, {}) is None


def test_baseline_tolerances():
    attn, accept = get_op("verify_attn"), get_op("tree_accept")
    assert accept.baseline_tolerances("default") == accept.tolerances("default")
    bf16, kernel = attn.baseline_tolerances("bf16_paged"), attn.tolerances("bf16_paged")
    assert bf16["out"] == kernel["out"] and bf16["lse"].atol == 1e-4 > kernel["lse"].atol
    strict, loose = attn.tolerances("fp32")["out"], attn.baseline_tolerances("fp32")["out"]
    assert (loose.atol, loose.rtol) == (strict.atol, strict.rtol) and loose.l2 == 1e-5 > strict.l2


def test_check_outputs_names_what_it_compared():
    from kdtr.impl import CaseData, Implementation, Serves, evaluate

    op = get_op("verify_attn")
    case = Case("t", "verify_attn", "fp32", 5, dict(op._defaults, batch=2, heads=4, prefix=20, budget=4))
    generated = op.generate(case)
    expected = op.reference("fp32", generated.inputs, generated.params)

    def only_out(declared):
        return Implementation("sdpa_like", (Serves("verify_attn", "fp32", declared),),
                              lambda op, variant, inputs, params: lambda: {"out": torch.from_numpy(expected["out"])},
                              device="cpu")
    data = CaseData(op, "fp32", generated.inputs, generated.params)
    outcome = evaluate(only_out(("out",)), data, expected, op.tolerances("fp32"))
    assert outcome.passed and bench.runner.check_note(outcome) == "checked out (rel. L2 0); it gives no lse"
    outcome = evaluate(only_out(None), data, expected, op.tolerances("fp32"))
    assert not outcome.passed and bench.runner.check_note(outcome) == "returned no 'lse' (it declares ['out', 'lse'])"