"""kdtr.testing, the public API for people who write kernels in Python: assert_op_close passes honest
implementations (the reference, the torch backend's other summation order) and catches wrong ones,
naming the element it changed; cases from keyword params or kdtree's suites; time_gpu on bench's
timing method (the host timer here, the device timer against a fake CUDA)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kdtr import testing
from kdtr.config import REPO_ROOT, config
from kdtr.errors import SpecError, UsageError
from kdtr.ops import get_op
from kdtr.bundle.spec import load_suite

SMALL = {"tree_build": ("default", dict(batch=2, depth=3, vocab=16, budget=6)),
         "tree_accept": ("default", dict(batch=2, budget=6, depth=3)),
         "verify_attn/fp32": ("fp32", dict(batch=2, heads=4, prefix=30, budget=6)),
         "verify_attn/bf16_paged": ("bf16_paged", dict(batch=2, heads=4, prefix=30, budget=6))}


def small(key: str, seed: int = 1) -> testing.OpCase:
    variant, params = SMALL[key]
    return testing.make_case(key.split("/")[0], variant, seed=seed, **params)


def reference(case: testing.OpCase) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in get_op(case.op).reference(case.variant, case.inputs, case.params).items()}


@pytest.mark.parametrize("key", SMALL)
def test_honest_outputs_pass(key):
    case = small(key)
    row = case.assert_close(reference(case))
    assert row.passed and {o.name for o in row.outputs} == set(get_op(case.op).outputs)


@pytest.mark.parametrize("key", SMALL)
def test_the_torch_backend_passes_under_the_derived_bound(key):
    import torch

    case = small(key, seed=7)
    op = get_op(case.op)
    from kdtr.dtypes import to_torch

    inputs = {k: to_torch(v, "cpu") for k, v in case.inputs.items()}
    assert case.assert_close(op.run_torch(case.variant, inputs, case.params)).passed     # torch tensors taken too


def _first_float(case, outputs):
    return next(n for n, v in outputs.items() if v.dtype.kind == "f" and v.size > 1)


@pytest.mark.parametrize("key", ["verify_attn/fp32", "verify_attn/bf16_paged"])
def test_one_element_off_is_caught_and_named(key):
    case = small(key)
    outputs = reference(case)
    name = _first_float(case, outputs)
    flat = outputs[name].reshape(-1)
    spot = flat.size // 3
    flat[spot] = flat[spot] * np.float32(1.05) + np.float32(0.05)
    with pytest.raises(testing.OpMismatch) as caught:
        case.assert_close(outputs)
    index = [int(i) for i in np.unravel_index(spot, outputs[name].shape)]
    nodes = case.spec["budget"] + 1
    batch, node, head = ((index[0], index[1], index[2]) if outputs[name].ndim == 4       # fp32: [B, Q, H, D]
                         else (*divmod(index[0], nodes), index[1]))                       # paged: [B·Q, H, D]
    text = str(caught.value)
    assert f"{name}: 1 of {flat.size} elements fail" in text
    assert f"worst at {index} (batch {batch}, node {node}, head {head}" in text
    assert caught.value.row.failed and text.startswith(f"FAIL {case.op}/{case.variant} {case.name}")


@pytest.mark.parametrize("key", ["tree_build", "tree_accept"])
def test_an_integer_output_off_by_one_is_caught(key):
    case = small(key)
    outputs = reference(case)
    name = next(n for n, v in outputs.items() if v.dtype.kind in "iu" and v.size > 1)
    outputs[name].reshape(-1)[1] += 1
    with pytest.raises(testing.OpMismatch, match=f"{name}: 1 of {outputs[name].size} elements fail bitwise"):
        case.assert_close(outputs)


@pytest.mark.parametrize("fault, why", [
    ("nan", r"output 'out' is NaN at \[0, 0, 0, 5\] \(1 element\(s\)\) where the reference is not"),
    ("dtype", "output 'accept_len' has dtype i64, expected i32"),
    ("shape", r"output 'out' has shape \[2, 6, 4, 512\], expected \[2, 7, 4, 512\]")])
def test_a_broken_contract_is_caught(fault, why):
    """A NaN, an exact output of another dtype (a float one may be any float: the contract's
    rule), a missing row."""
    case = small("tree_accept" if fault == "dtype" else "verify_attn/fp32")
    outputs = reference(case)
    if fault == "nan":
        outputs["out"].reshape(-1)[5] = np.nan
    elif fault == "dtype":
        outputs["accept_len"] = outputs["accept_len"].astype(np.int64)
    else:
        outputs["out"] = outputs["out"][:, :-1]
    with pytest.raises(testing.OpMismatch, match=why):
        case.assert_close(outputs)


def test_a_subset_of_outputs_is_compared_and_the_rest_said():
    case = small("verify_attn/fp32")
    row = case.assert_close({"out": reference(case)["out"]})
    assert row.passed and row.not_compared == ("lse",)
    with pytest.raises(UsageError, match="'output': not outputs of verify_attn"):
        case.assert_close({"output": reference(case)["out"]})


def test_make_case_fills_defaults_checks_params_and_draws_by_seed():
    a, b, c = small("tree_accept", 1), small("tree_accept", 1), small("tree_accept", 2)
    assert a.name == "b2_n6_l3" and a.spec["seed"] == 1
    assert all(np.array_equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
    assert any(not np.array_equal(a.inputs[k], c.inputs[k]) for k in a.inputs)
    with pytest.raises(SpecError, match=r"cases\[0\]\.heads: -1 is below the minimum 1"):
        testing.make_case("verify_attn", "fp32", heads=-1)
    with pytest.raises(SpecError, match="unknown parameter 'head'"):
        testing.make_case("verify_attn", "fp32", head=4)


def test_op_cases_are_kdtrees_own_suites():
    suite = load_suite(config().specs_dir / "tree_accept.yaml")
    drawn = list(testing.op_cases("tree_accept", pattern="accept_*"))
    assert [c.name for c in drawn] == [c.name for c in suite.cases if c.name.startswith("accept_")]
    assert all(c.assert_close(reference(c)).passed for c in drawn)
    first = next(testing.op_cases("verify_attn", suite="bench", variant="bf16_paged"))
    assert first.variant == "bf16_paged" and first.inputs
    with pytest.raises(UsageError, match="suite 'gen'"):
        next(testing.op_cases("tree_accept", suite="gen"))


def test_time_gpu_on_the_host_orders_work_and_interleaves():
    from kdtr.bench import TimingOptions

    options = TimingOptions(budget_s=0.05, target=0.2, min_samples=5, max_samples=60, warmup_s=0.0)
    light, heavy = testing.time_gpu(lambda: sum(range(2000)), lambda: sum(range(20000)), options=options)
    assert light.mode == heavy.mode == "host" and light.rounds == heavy.rounds >= options.min_rounds
    assert heavy.median > 3 * light.median
    with pytest.raises(ZeroDivisionError):
        testing.time_gpu(lambda: 1 / 0, options=options)
    with pytest.raises(UsageError, match="mode 'warm'"):
        testing.time_gpu(lambda: None, mode="warm")


@pytest.mark.parametrize("mode, label", [("hot", "hot"), ("cold", "cold-flush")])
def test_time_gpu_on_a_device_uses_bench_s_device_timer(monkeypatch, mode, label):
    import torch

    from kdtr.runtime import device
    from kdtr.bench import TimingOptions
    from tests.bench.fakes import FakeCuda

    fake = FakeCuda().install(monkeypatch)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("P", (), {"L2_cache_size": 4096}))
    options = TimingOptions(budget_s=5, target=0.01, min_samples=10, max_samples=100, warmup_s=0, sample_ms=0.5)
    fast, slow = testing.time_gpu(fake.kernel(0.01), fake.kernel(0.04), mode=mode, options=options)
    assert fast.median == pytest.approx(0.01) and slow.median == pytest.approx(0.04)
    assert fast.method == "graph" and fast.mode == label and (fake.flushes > 0) == (mode == "cold")


DECIMAL = r"-?\d+\.\d+(?:e-?\d+)?"


def _same_but_last_digits(printed: str, shown: str) -> bool:
    """The same text (integers included) and decimals to 3 significant digits (an fp32 sum's last
    digits follow the BLAS's order), except the gate's figure and the tolerance share, within 15%:
    the gate is the measured error of an fp32 computation, which follows the CPU too (5.51e-07 where
    the page was made, 5.07e-07 on an AMD EPYC, 5.36e-07 there after other tests in the process),
    and the share scales with it."""
    texts = re.split(DECIMAL, printed)
    if texts != re.split(DECIMAL, shown):
        return False
    pairs = zip(texts, map(float, re.findall(DECIMAL, printed)), map(float, re.findall(DECIMAL, shown)))
    return all(abs(a - b) <= 0.15 * max(abs(a), abs(b)) if before.endswith(("gate 2·", "tol share "))
               else f"{a:.3g}" == f"{b:.3g}" for before, a, b in pairs)


def test_the_worked_example_of_docs_testing_runs_and_prints_what_the_page_shows(capsys):
    from kdtr.runtime.device import gpu_available

    text = (REPO_ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    example = re.search(r"^## A worked example$.*?^```python\n(.*?)^```$", text, flags=re.M | re.S).group(1)
    shown = re.search(r"^On a machine without a GPU it prints.*?^```text\n(.*?)^```$", text,
                      flags=re.M | re.S).group(1).splitlines()
    exec(compile(example, "docs/testing.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "mine passes: True" and printed[1] == "FAIL verify_attn/fp32"
    assert re.fullmatch(r"mine \d+\.\d{3} ms ± \d+\.\d% \((graph|eager|host), (hot|host)\)", printed[-1]), printed[-1]
    if not gpu_available():         # on a GPU the reference is the float64 device one: other last digits
        assert len(printed) == len(shown), printed
        for got, want in zip(printed[:-1], shown[:-1]):
            assert _same_but_last_digits(got, want), (got, want)
