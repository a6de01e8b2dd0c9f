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

from ..test_cuda_kernels import VERIFY_ATTN, generated
from ..test_emulated_kernels import H200, run


def drift(kernel: str, prefix: int) -> tuple[float, float]:
    gen = generated(VERIFY_ATTN, "fp32", 5, batch=1, heads=2, prefix=prefix, budget=4)
    want = VERIFY_ATTN.reference("fp32", gen.inputs, gen.params)
    got = run(kernel, "fp32", gen, H200, splits=1)
    out, ref = got["out"].astype(np.float64), want["out"].astype(np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref)), float(np.abs(got["lse"] - want["lse"]).max())


if __name__ == "__main__":
    name, *prefixes = sys.argv[1:]
    for prefix in map(int, prefixes):
        rel, lse = drift(name, prefix)
        print(f"{name} P={prefix} one split: out rel L2 {rel:.3g}, lse max error {lse:.3g}", flush=True)
