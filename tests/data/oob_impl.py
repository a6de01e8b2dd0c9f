"""A deliberately broken verify_attn/bf16_paged implementation for the GPU evidence of worker
isolation (scripts/device-round.sh oob): it computes the right answer with kdtree's torch backend,
then launches a Triton kernel that stores far past the end of its output, an illegal address that
makes the CUDA context unusable (CUDA errors are sticky). Run in its own worker it must fail its own
rows only: `kdtree verify --impl cuda --impl verify_attn/bf16_paged=tests/data/oob_impl.py:verify_attn`
exits 1 with every cuda row passed."""

from __future__ import annotations


def verify_attn(inputs, params):
    import torch
    import triton
    import triton.language as tl

    from kdtr.ops import get_op

    @triton.jit
    def scribble(ptr, far):
        tl.store(ptr + far + tl.program_id(0), 1.0)

    outputs = get_op("verify_attn").run_torch("bf16_paged", inputs, params)
    lse = outputs["lse"]
    scribble[(1,)](lse, 1 << 40)          # 4 TiB past the output: no allocation is there
    torch.cuda.synchronize()
    return outputs
