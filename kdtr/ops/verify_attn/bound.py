"""verify_attn's derived error bound: per output element, how far any fp32 implementation may be
from the exact result, whatever order it sums in (docs/numerics.md derives every term).

The bound is computed in float64 from the stored inputs, one request and one block of rows at a
time (as the reference is): scores s = c·q·k and A = Σ|q_i k_i| (two matrix products), the exact
softmax weights p, the weights' log-perturbation e_j, and one product of the weights' error with |V|.
"""

from __future__ import annotations

import numpy as np

from .layouts import LATENT, LAYOUTS, ROW
from .reference import REFERENCE_CHUNK

# float64 score elements per block: a quarter of the reference's, as the bound holds about ten
# block-sized temporaries to the reference's three (peak ~ 2.5 reference blocks, 160 MB)
BOUND_CHUNK = REFERENCE_CHUNK // 4

U32 = 2.0 ** -24                 # unit roundoff of float32
UNIT = {"f32": U32, "bf16": 2.0 ** -8}   # the output dtype's unit roundoff (its own last rounding)
FUNCTION_ULPS = 2                # exp and log within 2 ulps (CUDA's expf/logf; MKL/Sleef: 1)
ULP = 2 * U32                    # an ulp is at most 2u relative
MAX_RESCALES = 64                # online-softmax rescalings of one weight the model allows
# Relative error of each unnormalised weight exp(s_j - m) besides its argument's: one exp, and up to
# MAX_RESCALES rescalings by exp(m_old - m_new), each an exp and a product.
WEIGHT_ETA = FUNCTION_ULPS * ULP + MAX_RESCALES * (FUNCTION_ULPS * ULP + U32)


def gamma(n):
    """Higham's γ_n = n·u / (1 - n·u) for float32 (n terms of a sum or a dot product)."""
    n = np.asarray(n, np.float64)
    return n * U32 / (1.0 - n * U32)


def request_bound(q: np.ndarray, keys: np.ndarray, prefix_len: int, visibility: np.ndarray,
                  sm_scale: float, out_unit: float) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on |out - out_exact| [Q, H, 512] and |lse - lse_exact| [Q, H] for one request (the
    shapes attend_reference takes), including the rounding of the stored float32 golden."""
    nq, heads, width = q.shape
    keys = keys.astype(np.float64)
    abs_keys = np.abs(keys)
    abs_values = abs_keys[:, :LATENT]
    hidden = np.zeros((nq, keys.shape[0]), bool)                          # keys a row may not see
    hidden[:, prefix_len:] = ~visibility.astype(bool)
    visible = prefix_len + visibility.astype(bool).sum(axis=1)            # [Q]: n, keys per row
    # two roundings of the scale (sm_scale, and an exp2 kernel's sm_scale·log2 e) beside the dot's d
    score_gamma = abs(sm_scale) * float(gamma(width + 2))
    out_b = np.empty((nq, heads, LATENT))
    lse_b = np.empty((nq, heads))
    rows_per_chunk = max(1, BOUND_CHUNK // max(1, keys.shape[0] * heads))
    for lo in range(0, nq, rows_per_chunk):
        hi = min(nq, lo + rows_per_chunk)
        block = (hi - lo, heads, keys.shape[0])
        rows = q[lo:hi].astype(np.float64).reshape((hi - lo) * heads, ROW)
        scores = (rows @ keys.T).reshape(block) * sm_scale
        magnitude = (np.abs(rows) @ abs_keys.T).reshape(block)            # A_j = Σ_i |q_i k_ji|
        masked = np.broadcast_to(hidden[lo:hi, None, :], block)
        scores[masked] = -np.inf
        peak = scores.max(axis=-1, keepdims=True)
        gap = peak - scores                                                # >= 0; inf where hidden
        weights = np.exp(-gap)
        total = weights.sum(axis=-1, keepdims=True)                       # S >= 1
        p = weights / total
        # e_j: |log ŵ_j - log w_j| for each unnormalised weight: the score's error, the rounding of
        # s_j - m, and the weight's own roundings (exp, rescalings)
        e = score_gamma * magnitude + U32 * np.where(np.isfinite(gap), gap, 0.0) + WEIGHT_ETA
        e[masked] = 0.0
        spread = e.max(axis=-1, keepdims=True)                            # Δ
        mean_e = (p * e).sum(axis=-1, keepdims=True)                      # E = Σ p_j e_j
        grow = np.exp(2 * spread)
        # |log p̂_j - log p_j| <= e_j (1 - p_j e^-2Δ) + e^2Δ (E - p_j e_j)   (mean value theorem)
        shift = e * (1 - p / grow) + grow * (mean_e - p * e)
        dp = p * np.expm1(shift)                                          # |p̂_j - p_j|
        n = visible[lo:hi, None, None].astype(np.float64)
        sum_gamma = gamma(n + 2)                       # P·V's n terms, the normalisation, the division
        spread_weights = (sum_gamma * p + (1 + sum_gamma) * dp).reshape((hi - lo) * heads, -1)
        out = (p.reshape((hi - lo) * heads, -1) @ keys[:, :LATENT]).reshape(hi - lo, heads, LATENT)
        inherited = (spread_weights @ abs_values).reshape(hi - lo, heads, LATENT)
        # the output's own rounding is relative to the value computed, exact + its error
        computed_err = inherited + (gamma(n) + U32) * np.abs(out)
        out_b[lo:hi] = computed_err * (1 + out_unit) + out_unit * np.abs(out)
        log_sum = np.log(total)
        lse = peak + log_sum
        # log Σŵ - log Σw (scores, weights), the sum's rounding, log's ulps, the final add and the
        # golden's float32 rounding
        lse_err = (grow * mean_e - np.log1p(-gamma(n - 1)) + FUNCTION_ULPS * ULP * log_sum
                   + 2 * U32 * np.abs(lse))
        lse_b[lo:hi] = lse_err[..., 0]
    return out_b, lse_b


def error_bound(variant, inputs, params) -> dict[str, np.ndarray]:
    """The bound of every output element of a case, in the outputs' stored shapes (float64)."""
    layout = LAYOUTS[variant]
    outs, lses = [], []
    for q, keys, prefix_len, visibility in layout.requests(inputs):
        out, lse = request_bound(q, keys, prefix_len, visibility, float(params["sm_scale"]),
                                 UNIT[layout.out_dtype])
        outs.append(out)
        lses.append(lse)
    return {"out": layout.flat(np.stack(outs)), "lse": layout.flat(np.stack(lses))}
