"""DDTree decoding through the ops equals autoregressive greedy (torch backend on the CPU; cuda on a GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from kdtr.verify.e2e import (ARResult, DDTreeResult, DecodeOptions, E2EResult, ModelConfig, TinyMLA, autoregressive,
                      compare_runs, ddtree, make_prompts, run_e2e)

CFG = ModelConfig()


@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
def test_ddtree_equals_autoregressive_on_torch(variant):
    prompts = make_prompts(2, 12, CFG.vocab, seed=1)
    options = [DecodeOptions("torch", variant, budget, depth=6) for budget in (0, 8, 32)]
    runs = list(run_e2e(prompts, 40, options, CFG))
    assert len(runs) == 6
    for run in runs:
        # fp32 must match exactly; bf16 may flip a near-tie argmax, which the tool labels as such
        assert run.identical or (variant == "bf16_paged" and run.divergence.near_tie), run.divergence
        assert run.tokens == 40
    # a real tree accepts more than the root on average; budget 0 is plain decoding
    assert all(r.mean_accept > 1.5 for r in runs if r.budget > 0 and r.identical)
    assert all(r.mean_accept == 1.0 for r in runs if r.budget == 0)


def test_a_different_target_is_reported_as_a_divergence():
    """The comparison can fail: DDTree with another model's weights diverges, and says where."""
    prompt = make_prompts(1, 12, CFG.vocab, seed=2)[0]
    ar = autoregressive(TinyMLA(CFG), prompt, 24, "f32")
    other = ddtree(TinyMLA(ModelConfig(seed=1)), prompt, 24, ar.tokens, DecodeOptions("torch", "fp32", 8, 6))
    divergence = compare_runs(len(prompt), ar, other)
    assert divergence is not None
    assert divergence.ar_token != divergence.ddtree_token
    assert divergence.position == len(prompt) + divergence.index
    assert divergence.margin > 0          # AR chose its token by a positive logit margin


def test_cli_e2e_exit_code_and_json(tmp_path):
    record = tmp_path / "e2e.json"
    result = CliRunner().invoke(app, ["e2e", "--backend", "torch", "--tokens", "16", "--prompts", "1",
                                      "--budget", "8", "--variant", "fp32", "--json", str(record), "-q"])
    assert result.exit_code == 0, result.output
    assert "1 identical, 0 diverged" in result.output
    assert [run["identical"] for run in json.loads(record.read_text())["runs"]] == [True]
    bad = CliRunner().invoke(app, ["e2e", "--backend", "torch", "--variant", "fp16"])
    assert bad.exit_code == 2


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fp32", "bf16_paged"])
def test_ddtree_equals_autoregressive_on_cuda(variant):
    prompts = make_prompts(2, 12, CFG.vocab, seed=3)
    runs = list(run_e2e(prompts, 64, [DecodeOptions("cuda", variant, b, depth=8) for b in (8, 64)], CFG))
    for run in runs:
        assert run.identical or (variant == "bf16_paged" and run.divergence.near_tie), run.divergence


def diverged_at(logit_ar: float, logit_dd: float, precision: str):
    """AR picks token 0 (logit_ar) where DDTree picked token 1 (logit_dd), at the third token."""
    logits = np.array([logit_ar, logit_dd, -9.0])
    ar = ARResult([2, 2, 0], [1.0, 1.0, logit_ar - logit_dd], [logits] * 3)
    return compare_runs(4, ar, DDTreeResult([2, 2, 1], [1], 1, 0.0), precision)


def result(divergence) -> E2EResult:
    return E2EResult(0, "bf16_paged", "torch", 8, 6, 3, divergence is None, divergence, 1.0, 1.0, 3, 0.0)


def test_a_bf16_near_tie_passes_within_the_rounding_bound_and_fails_beyond_it():
    # bound = 2^-8 · (|5.0| + |4.99|) = 0.039..., margin 0.01: a flip bf16 rounding can cause
    tie = diverged_at(5.0, 4.99, "bf16")
    assert tie.near_tie and tie.bound == pytest.approx(9.99 / 256) and tie.index == 2
    assert result(tie).passed() and not result(tie).passed(strict=True)
    wide = diverged_at(5.0, 4.9, "bf16")                     # margin 0.1 > 0.0386
    assert not wide.near_tie and not result(wide).passed()


def test_fp32_gets_no_near_tie_allowance():
    divergence = diverged_at(5.0, 4.9999, "f32")
    assert divergence.bound == 0.0 and not divergence.near_tie and not result(divergence).passed()
    assert result(None).passed(strict=True)


def test_cli_e2e_strict_is_an_option():
    args = ["e2e", "--backend", "torch", "--tokens", "8", "--prompts", "1", "--budget", "4", "-q"]
    assert CliRunner().invoke(app, args + ["--variant", "fp32", "--strict"]).exit_code == 0
