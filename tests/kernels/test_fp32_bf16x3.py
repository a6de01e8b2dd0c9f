"""fp32_bf16x3 (kernels/verify_attn_fp32_bf16x3.cu) on the CPU: a model of its exact three-piece bf16
split (its launch figures, builds and the launch choice: tests/kernels/test_fp32_kernels.py; its results are
checked on the GPU by tests/kernels/test_cuda_kernels.py, every registered kernel)."""
from __future__ import annotations

import ml_dtypes
import numpy as np



def split3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's split3: x0 = bf16_rn(x), x1 = bf16_rn(x - x0), x2 = bf16_rn(x - x0 - x1), the
    differences taken in fp32 (cvt.rn.bf16x2.f32 rounds to nearest even, as ml_dtypes does)."""
    bf16 = ml_dtypes.bfloat16
    x0 = x.astype(bf16).astype(np.float32)
    r1 = x - x0
    x1 = r1.astype(bf16).astype(np.float32)
    r2 = r1 - x1
    x2 = r2.astype(bf16).astype(np.float32)
    return x0, x1, x2


def wide_fp32(rng, n):
    """fp32 values of both signs over 2^-60 .. 2^60 with random 24-bit significands, and zeros."""
    x = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-60, 61, n) * rng.choice([-1, 1], n)).astype(np.float32)
    x[::97] = 0
    return x


def test_split3_is_exact_and_each_piece_is_bf16():
    rng = np.random.default_rng(5)
    x = wide_fp32(rng, 200_000)
    x0, x1, x2 = split3(x)
    np.testing.assert_array_equal(x0.astype(np.float64) + x1 + x2, x.astype(np.float64))
    for piece in (x0, x1, x2):        # each exactly a bf16 value: the low 16 bits of its fp32 are 0
        assert not np.any(piece.view(np.uint32) & 0xFFFF)
    ax = np.abs(x.astype(np.float64))
    assert np.all(np.abs(x1) <= 2.0 ** -8 * ax) and np.all(np.abs(x2) <= 2.0 ** -16 * ax)


def test_six_piece_products_are_within_two_to_the_minus_23():
    """The products the kernel keeps (i + j <= 2) against the exact product a b: each piece is at
    most 2^-8 of the one before (rounding to nearest), so the three left out (a1b2, a2b1, a2b2) are
    at most 2^-24 + 2^-24 + 2^-32 of |a b|: about 2^-23, the size of fp32's own rounding of a
    product (2^-24). A sloppier split fails it: leaving out a1 b1 as well costs up to 2^-16."""
    rng = np.random.default_rng(6)
    a, b = wide_fp32(rng, 100_000), wide_fp32(rng, 100_000)
    ap, bp = split3(a), split3(b)
    kept = sum(ap[i].astype(np.float64) * bp[j] for i in range(3) for j in range(3) if i + j <= 2)
    exact = a.astype(np.float64) * b
    assert np.all(np.abs(kept - exact) <= 2.0 ** -23 * np.abs(exact))
    five = kept - ap[1].astype(np.float64) * bp[1]           # the bound is sharp enough to see a1 b1
    assert np.max(np.abs(five - exact) / np.maximum(np.abs(exact), 1e-300)) > 2.0 ** -20
