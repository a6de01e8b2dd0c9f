"""How far an fp32 kernel's running sums drift with one split over a long prefix, on the emulator:
rel L2 of `out` and the largest lse error against float64, per prefix length (B=1 H=2 Q=5, seed 5).
The evidence behind each fp32 kernel's max_split_keys (kdtr/ops/verify_attn/cuda.py):

    python -m tests.kernels.emulator.long_sums fp32_dmma 2048 8192
    python -m tests.kernels.emulator.long_sums fp32_bf16x3 8192 32768

Minutes a run at 16k keys and more (every thread a fiber); not a test.
"""

from __future__ import annotations

import sys

import numpy as np

from kdtr.dtypes import to_numpy, to_torch
from kdtr.ops import get_op
from kdtr.ops.base import Case

from . import emulated

H200 = (90, 132, 232448)


def drift(kernel: str, prefix: int) -> tuple[float, float]:
    op = get_op("verify_attn")
    params = {p.name: p.default for p in op.params} | dict(batch=1, heads=2, prefix=prefix, budget=4)
    gen = op.generate(Case(f"long-{prefix}", op.name, "fp32", 5, params))
    want = op.reference("fp32", gen.inputs, gen.params)
    inputs = {name: to_torch(a, "cpu") for name, a in gen.inputs.items()}
    import torch

    outputs = {name: torch.full(shape, float("nan")) for name, (_, shape) in
               op.output_specs("fp32", gen.inputs, gen.params).items()}
    with emulated(*H200):
        op.run_cuda("fp32", inputs, gen.params, outputs, kernel=kernel, splits=1)
    got = {name: to_numpy(t).astype(np.float64) for name, t in outputs.items()}
    rel = np.linalg.norm(got["out"] - want["out"]) / np.linalg.norm(want["out"].astype(np.float64))
    return float(rel), float(np.abs(got["lse"] - want["lse"]).max())


if __name__ == "__main__":
    name, *prefixes = sys.argv[1:]
    for prefix in map(int, prefixes):
        rel, lse = drift(name, prefix)
        print(f"{name} P={prefix} one split: out rel L2 {rel:.3g}, lse max error {lse:.3g}", flush=True)
