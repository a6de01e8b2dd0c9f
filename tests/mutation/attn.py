"""verify_attn's honest variants and mutants for the mutation suite (tests/mutation/suite.py).

Honest: the torch backend at 1, 2 and all threads, and the kernel model (attn_model) in other
orders: as stored, keys shuffled, keys and dims shuffled, split over blocks of keys merged with the
rescale, an online softmax over blocks of 64. Mutants: plausible kernel bugs, each an Implementation
that takes and returns numpy arrays (HOST)."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable

import numpy as np

from kdtr.impl.base import HOST, Implementation, Serves
from kdtr.ops import get_op
from tests.mutation import torch_at_thread_counts
from tests.mutation.attn_model import Knobs, bf16, run

OP = get_op("verify_attn")
LSE_ATOL = 1e-5                      # the lse tolerance's atol (both variants)


def _host(name: str, variant: str, compute: Callable, doc: str) -> Implementation:
    """An Implementation of one verify_attn variant computing `compute(variant, inputs, params)` in numpy."""
    return Implementation(name, (Serves(OP.name, variant),),
                          lambda op, var, inputs, params: functools.partial(compute, var, inputs, params),
                          device=HOST, doc=doc)


def _model(knobs: Knobs):
    return lambda variant, inputs, params: run(variant, inputs, params, knobs)


HONEST_KNOBS = {
    "model_as_stored": Knobs(),
    "model_keys_shuffled": Knobs(key_seed=11),
    "model_keys_dims_shuffled": Knobs(key_seed=12, dim_seed=13),
    "model_blocked_splits": Knobs(splits=4, dim_seed=14),
    "model_online_softmax": Knobs(block=64, key_seed=15),
}


def honest(variant: str) -> list[Implementation]:
    found = torch_at_thread_counts(Serves(OP.name, variant))
    found += [_host(name, variant, _model(knobs), f"the kernel model, {name}") for name, knobs in HONEST_KNOBS.items()]
    return found


def _reference(variant, inputs, params):
    return {name: np.asarray(value, np.float32) for name, value in OP.reference(variant, inputs, params).items()}


def _torch_outputs(variant, inputs, params):
    import torch

    from kdtr.impl.backends import upload
    from kdtr.dtypes import to_numpy

    with torch.no_grad():
        got = OP.run_torch(variant, upload(inputs, "cpu"), params)
    return {name: to_numpy(value) for name, value in got.items()}


def _edited(base: Callable, edit: Callable) -> Callable:
    def compute(variant, inputs, params):
        outputs = {name: np.array(value) for name, value in base(variant, inputs, params).items()}
        edit(outputs)
        return outputs
    return compute


def _lse_plus(amount: float):
    def edit(outputs):
        outputs["lse"] = (outputs["lse"] + np.float32(amount)).astype(np.float32)
    return edit


def _one_lse_moved(outputs):
    flat = outputs["lse"].reshape(-1)
    flat[flat.size // 2] += np.float32(3e-4)


def _lse_log2(outputs):
    outputs["lse"] = (outputs["lse"] / np.float32(np.log(2))).astype(np.float32)


def _one_out_element(outputs):
    out = outputs["out"]
    flat = out.reshape(-1).astype(np.float32)
    at = int(np.argmax(np.abs(flat)))
    flat[at] *= np.float32(1 + 1e-3)
    outputs["out"] = flat.reshape(out.shape).astype(out.dtype)


def _out_bf16(outputs):
    outputs["out"] = bf16(outputs["out"])


def mutants(variant: str) -> list[Implementation]:
    """The plausible bugs (see the module docstring); the fp32-only ones are honest arithmetic for
    bf16_paged (its kernels round P to bf16 and return a bf16 output)."""
    plain = Knobs(block=64)
    bugs = {
        "lse_plus_2tol": (_edited(_reference, _lse_plus(2 * LSE_ATOL)), "lse 2x its atol (2e-5) off"),
        "lse_plus_20tol": (_edited(_reference if variant == "fp32" else _torch_outputs, _lse_plus(20 * LSE_ATOL)),
                           "lse 20x its atol (2e-4) off: issue 35's first and third rows"),
        "one_lse_moved_3e-4": (_edited(_torch_outputs, _one_lse_moved), "one lse element 3e-4 off (issue 35's fourth row)"),
        "lse_log2_units": (_edited(_model(plain), _lse_log2), "lse in log2 units"),
        "one_out_element_1e-3": (_edited(_model(plain), _one_out_element), "the largest |out| 1e-3 too large, relatively"),
        "pv_bf16_accumulate": (_model(replace(plain, pv_bf16=True)), "P·V accumulated in bf16"),
        "sm_scale_bf16": (_model(replace(plain, scale_bf16=True)), "sm_scale rounded to bf16"),
        "scores_bf16": (_model(replace(plain, scores_bf16=True)), "scores rounded to bf16"),
        "prefix_key_dropped": (_model(replace(plain, drop_key=0)), "the first prefix key left out"),
        "sees_a_sibling": (_model(replace(plain, see_sibling=True)), "each tree node also sees the next (mask off by one)"),
        "split_merged_unscaled": (_model(replace(plain, splits=4, block=None, no_merge_rescale=True)),
                                  "four splits merged without their rescale"),
        "block_not_rescaled": (_model(replace(plain, no_block_rescale=True)),
                               "online softmax: the accumulator not rescaled as the max grows"),
        "rope_dims_left_out": (_model(replace(plain, score_dims=512)), "q·k over the 512 latent dims only"),
        "stale_page": (_model(replace(plain, stale_page=True)), "the prefix's second page read from the first's slots"),
    }
    if variant == "fp32":
        bugs |= {
            "p_bf16": (_model(replace(plain, round_p="bf16")), "softmax weights rounded to bf16 before P·V"),
            "p_fp16": (_model(replace(plain, round_p="fp16")), "softmax weights rounded to fp16 before P·V"),
            "out_bf16": (_edited(_model(plain), _out_bf16), "the output rounded to bf16"),
        }
    return [_host(name, variant, compute, doc) for name, (compute, doc) in bugs.items()]
