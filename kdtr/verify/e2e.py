"""End to end: DDTree speculative decoding through our ops equals autoregressive greedy decoding.

A tiny deterministic MLA target (absorbed attention with the real 512 + 64 latent width, RMSNorm,
YaRN rope) runs on the host in float64; only its attention in the verify step goes through
verify_attn (`fp32`, or `bf16_paged` over a real paged KV pool), and the tree comes from tree_build
and tree_accept, each on the chosen backend. The attention precision is a property of the model:
queries, KV rows and attention outputs are rounded to it in both decoders, so the only difference
between them is the kernels' own arithmetic.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..dtypes import NUMPY_DTYPES
from ..ops import get_op
from ..ops.tree_build.reference import log_softmax_f32, top_k
from ..ops.verify_attn import LATENT, ROPE, ROW


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 512
    d_model: int = 256
    layers: int = 2
    heads: int = 4
    nope: int = 128                 # q_nope / k_nope width per head (absorbed into the latent)
    v_head: int = 128
    ffn: int = 512
    rope_theta: float = 10000.0
    yarn_factor: float = 40.0       # DeepSeek-V3's YaRN
    original_max_pos: int = 4096
    logit_scale: float = 4.0        # sharper logits: fewer near-ties to flip
    seed: int = 0

    @property
    def mscale(self) -> float:
        return 0.1 * math.log(self.yarn_factor) + 1.0 if self.yarn_factor > 1 else 1.0

    @property
    def sm_scale(self) -> float:
        return (self.nope + ROPE) ** -0.5 * self.mscale ** 2


def yarn_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """YaRN: interpolate the low rope frequencies by the factor, keep the high ones, ramp between."""
    dims = np.arange(0, ROPE, 2, dtype=np.float64)
    inv_freq = 1.0 / cfg.rope_theta ** (dims / ROPE)
    if cfg.yarn_factor <= 1:
        return inv_freq

    def correction_dim(rotations):
        return ROPE * math.log(cfg.original_max_pos / (rotations * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))
    low = max(math.floor(correction_dim(32)), 0)
    high = min(math.ceil(correction_dim(1)), ROPE - 1)
    ramp = np.clip((np.arange(ROPE // 2) - low) / max(high - low, 1e-3), 0, 1)
    extrapolate = 1 - ramp
    return inv_freq / cfg.yarn_factor * (1 - extrapolate) + inv_freq * extrapolate


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate-half rope over the last axis (64 wide); positions broadcast over leading axes."""
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    shape = (len(positions),) + (1,) * (x.ndim - 2) + (ROPE // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    first, second = x[..., :ROPE // 2], x[..., ROPE // 2:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * weight


class TinyMLA:
    """Seeded random weights; forward(tokens, positions, attend) -> logits, new KV rows per layer."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        rng = np.random.default_rng([cfg.seed, 77])
        d, h = cfg.d_model, cfg.heads

        def w(*shape, fan_in):
            return rng.standard_normal(shape) / math.sqrt(fan_in)
        self.embed = rng.standard_normal((cfg.vocab, d))
        self.layers = [dict(
            norm1=1 + 0.1 * rng.standard_normal(d), norm2=1 + 0.1 * rng.standard_normal(d),
            norm_kv=1 + 0.1 * rng.standard_normal(LATENT),
            w_dkv=w(d, LATENT, fan_in=d), w_kr=w(d, ROPE, fan_in=d),
            w_q=w(d, h * (cfg.nope + ROPE), fan_in=d),
            w_uk=w(h, cfg.nope, LATENT, fan_in=cfg.nope), w_uv=w(h, LATENT, cfg.v_head, fan_in=LATENT),
            w_o=w(h * cfg.v_head, d, fan_in=h * cfg.v_head),
            w_up=w(d, cfg.ffn, fan_in=d), w_gate=w(d, cfg.ffn, fan_in=d), w_down=w(cfg.ffn, d, fan_in=cfg.ffn),
        ) for _ in range(cfg.layers)]
        self.norm_out = 1 + 0.1 * rng.standard_normal(d)
        self.lm_head = w(d, cfg.vocab, fan_in=d) * cfg.logit_scale
        self.inv_freq = yarn_inv_freq(cfg)

    def forward(self, tokens: np.ndarray, positions: np.ndarray,
                attend: Callable[[int, np.ndarray, np.ndarray], np.ndarray]):
        """`attend(layer, q [n, H, 576], kv [n, 576]) -> [n, H, 512]` attends over cache + new rows."""
        cfg, n = self.cfg, len(tokens)
        x = self.embed[tokens]
        new_rows = []
        for index, layer in enumerate(self.layers):
            hn = rms_norm(x, layer["norm1"])
            c_kv = rms_norm(hn @ layer["w_dkv"], layer["norm_kv"])
            k_pe = rope(hn @ layer["w_kr"], positions, self.inv_freq)
            kv = np.concatenate([c_kv, k_pe], axis=-1)
            q = (hn @ layer["w_q"]).reshape(n, cfg.heads, cfg.nope + ROPE)
            q_latent = np.einsum("nhd,hdl->nhl", q[..., :cfg.nope], layer["w_uk"])
            q_rows = np.concatenate([q_latent, rope(q[..., cfg.nope:], positions, self.inv_freq)], axis=-1)
            out_latent = attend(index, q_rows, kv)
            heads_out = np.einsum("nhl,hlv->nhv", out_latent, layer["w_uv"]).reshape(n, -1)
            x = x + heads_out @ layer["w_o"]
            hn = rms_norm(x, layer["norm2"])
            gate = hn @ layer["w_gate"]
            x = x + (gate / (1 + np.exp(-gate)) * (hn @ layer["w_up"])) @ layer["w_down"]
            new_rows.append(kv)
        return rms_norm(x, self.norm_out) @ self.lm_head, new_rows


def round_to(array: np.ndarray, precision: str) -> np.ndarray:
    """The model's attention precision: f32 or bf16 values, held in float64."""
    kind = NUMPY_DTYPES["bf16"] if precision == "bf16" else np.float32
    return array.astype(kind).astype(np.float64)


def exact_attention(q: np.ndarray, keys: np.ndarray, allowed: np.ndarray, sm_scale: float) -> np.ndarray:
    """float64 attention; q [n, H, 576], keys [k, 576], allowed [n, k] -> [n, H, 512]."""
    scores = sm_scale * np.einsum("nhd,kd->nhk", q, keys)
    scores = np.where(allowed[:, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.einsum("nhk,kd->nhd", weights, keys[:, :LATENT]) / weights.sum(axis=-1, keepdims=True)


# -- autoregressive greedy: the reference decoder ------------------------------------------------
@dataclass
class ARResult:
    tokens: list[int]
    margins: list[float]            # top-1 minus top-2 logit at each generated token
    logits: list[np.ndarray]        # the logits each generated token was taken from


def autoregressive(model: TinyMLA, prompt: list[int], count: int, precision: str) -> ARResult:
    cache = [np.zeros((0, ROW)) for _ in model.layers]
    result = ARResult([], [], [])

    def attend(layer, q, kv):
        cache[layer] = np.concatenate([cache[layer], round_to(kv, precision)])
        allowed = np.ones((1, len(cache[layer])), bool)
        return round_to(exact_attention(round_to(q, precision), cache[layer], allowed, model.cfg.sm_scale), precision)

    sequence = list(prompt)
    for position in range(len(prompt) + count - 1):
        logits, _ = model.forward(np.array([sequence[position]]), np.array([position]), attend)
        if position >= len(prompt) - 1:
            order = np.argsort(-logits[0], kind="stable")
            sequence.append(int(order[0]))
            result.tokens.append(int(order[0]))
            result.margins.append(float(logits[0, order[0]] - logits[0, order[1]]))
            result.logits.append(logits[0])
    return result


# -- DDTree through the ops ------------------------------------------------------------------------
class PagedPool:
    """A page-size-1 token pool as in SGLang: one slot index per token, one bf16 buffer per layer;
    free slots hold NaN in every layer so a stray read shows."""

    def __init__(self, layers: int, slots: int, rng: np.random.Generator):
        self.buffers = [np.full((slots, ROW), np.nan, dtype=NUMPY_DTYPES["bf16"]) for _ in range(layers)]
        self.free = [int(s) for s in rng.permutation(slots)]     # fragmented from the start
        self.owned: list[int] = []                                # the request's cached tokens, in order

    def take(self, count: int) -> np.ndarray:
        if count > len(self.free):
            raise RuntimeError("KV pool exhausted")
        taken, self.free = self.free[:count], self.free[count:]
        return np.array(taken, dtype=np.int32)

    def release(self, slots) -> None:
        for buffer in self.buffers:
            buffer[slots] = np.nan
        self.free.extend(int(s) for s in slots)


@dataclass
class DDTreeResult:
    tokens: list[int]
    accept_lengths: list[int]
    forwards: int
    seconds: float


@dataclass(frozen=True)
class DecodeOptions:
    backend: str = "torch"
    variant: str = "fp32"           # verify_attn variant: fp32 (contiguous) or bf16_paged
    budget: int = 32
    depth: int = 8
    quality: float = 6.0            # drafter: logit bonus of the true next token (noise std 1)
    seed: int = 0


def drafter_logits(future: list[int], depth: int, vocab: int, quality: float, rng) -> np.ndarray:
    """Per-depth logits: the target's own future greedy tokens, corrupted by seeded noise."""
    logits = rng.standard_normal((depth, vocab)).astype(np.float32)
    for d, token in enumerate(future[:depth]):
        logits[d, token] += quality
    return logits


def _run(backend: str, op, variant: str, inputs, params) -> dict[str, np.ndarray]:
    """One step's outputs from the built-in implementation `backend` names, through the one
    evaluator (the output contract checked, nothing compared: the decode itself is the check); a
    step without clean outputs stops the decode with the reason."""
    from ..errors import KdtreeError
    from ..impl import CaseData, evaluate
    from ..impl.builtin import builtin

    outcome = evaluate(builtin(backend), CaseData(op, variant, inputs, params))
    if not outcome.passed:
        raise KdtreeError(f"{backend} on {op.name}/{variant}: {outcome.reason}")
    return outcome.outputs


def ddtree(model: TinyMLA, prompt: list[int], count: int, future: list[int], opt: DecodeOptions) -> DDTreeResult:
    """Decode `count` tokens; `future` (the AR continuation) feeds the drafter only."""
    cfg, precision = model.cfg, ("bf16" if opt.variant == "bf16_paged" else "f32")
    rng = np.random.default_rng([opt.seed, 99])
    tree_build, verify_attn, tree_accept = get_op("tree_build"), get_op("verify_attn"), get_op("tree_accept")
    q_len = opt.budget + 1
    started = time.perf_counter()

    # prefill prompt[:-1] exactly as the AR decoder does; the last prompt token is the first root
    cache = [np.zeros((0, ROW)) for _ in model.layers]

    def attend_prefill(layer, q, kv):
        cache[layer] = np.concatenate([cache[layer], round_to(kv, precision)])
        allowed = np.ones((1, len(cache[layer])), bool)
        return round_to(exact_attention(round_to(q, precision), cache[layer], allowed, cfg.sm_scale), precision)
    for position, token in enumerate(prompt[:-1]):
        model.forward(np.array([token]), np.array([position]), attend_prefill)

    pool = None
    if opt.variant == "bf16_paged":
        pool = PagedPool(cfg.layers, len(prompt) + count + 4 * q_len, rng)
        slots = pool.take(len(prompt) - 1)
        for layer in range(cfg.layers):
            pool.buffers[layer][slots] = cache[layer].astype(NUMPY_DTYPES["bf16"])
        pool.owned = slots.tolist()

    generated: list[int] = []
    accept_lengths: list[int] = []
    root, start, forwards = prompt[-1], len(prompt) - 1, 0
    while len(generated) < count:
        # 1. draft and build the tree
        logp, ids = top_k(log_softmax_f32(drafter_logits(future[len(generated):], opt.depth, cfg.vocab,
                                                         opt.quality, rng)), min(opt.budget, cfg.vocab) or 1)
        tree = _run(opt.backend, tree_build, "default",
                            {"topk_logp": logp[None], "topk_ids": ids[None],
                             "root_token": np.array([root], np.int32), "start": np.array([start], np.int32)},
                            {"budget": opt.budget})
        tokens, visibility = tree["tokens"][0], tree["visibility"]
        # 2. one target forward over the tree
        tree_slots = pool.take(q_len) if pool is not None else None

        def attend_tree(layer, q, kv):
            q_rows, kv_rows = round_to(q, precision), round_to(kv, precision)
            if pool is None:
                inputs = {"q": q_rows[None].astype(np.float32),
                          "kv": np.concatenate([cache[layer], kv_rows])[None].astype(np.float32),
                          "prefix_len": np.array([len(cache[layer])], np.int32), "visibility": visibility}
                out = _run(opt.backend, verify_attn, "fp32", inputs, {"sm_scale": cfg.sm_scale})["out"][0]
            else:
                pool.buffers[layer][tree_slots] = kv_rows.astype(NUMPY_DTYPES["bf16"])
                prefix = len(pool.owned)
                mask = np.ones((q_len, prefix + q_len), np.uint8)
                mask[:, prefix:] = visibility[0]
                inputs = {"q": q_rows.astype(NUMPY_DTYPES["bf16"]), "kv_buffer": pool.buffers[layer],
                          "kv_indptr": np.array([0, prefix], np.int32),
                          "kv_indices": np.array(pool.owned, np.int32), "tree_slots": tree_slots,
                          "custom_mask": mask.ravel(), "mask_indptr": np.array([0, mask.size], np.int32)}
                out = _run(opt.backend, verify_attn, "bf16_paged", inputs, {"sm_scale": cfg.sm_scale})["out"]
            tree_kv.append(kv_rows)
            return out.astype(np.float64)

        tree_kv: list[np.ndarray] = []
        logits, _ = model.forward(tokens, tree["positions"][0], attend_tree)
        forwards += 1
        # 3. accept greedily
        accepted = _run(opt.backend, tree_accept, "default",
                                {"tokens": tree["tokens"], "parents": tree["parents"],
                                 "target_ids": np.argmax(logits, axis=-1).astype(np.int32)[None]}, {})
        tau = int(accepted["accept_len"][0])
        path = accepted["accept_nodes"][0, :tau]
        # 4. keep the accepted rows' KV in place of the tree, append the bonus
        if pool is None:
            for layer in range(cfg.layers):
                cache[layer] = np.concatenate([cache[layer], tree_kv[layer][path]])
        else:
            pool.owned.extend(int(tree_slots[i]) for i in path)
            pool.release(np.delete(tree_slots, path))
        generated.extend(int(t) for t in accepted["accept_tokens"][0, 1:tau])
        generated.append(int(accepted["bonus"][0]))
        accept_lengths.append(tau)
        root, start = int(accepted["bonus"][0]), start + tau
    return DDTreeResult(generated[:count], accept_lengths, forwards, time.perf_counter() - started)


# When may a bf16 run pick another token than AR greedy and still be correct? Both decoders round
# the attention's queries, KV rows and outputs to bf16 (the model's precision), so they differ only
# in the kernels' own arithmetic: a result one bf16 rounding away from AR's, a relative change of up
# to bf16's unit roundoff u = 2^-8 (8 significant bits). Carried through the output projection and
# the residual stream, where the attention is one of the summands, it moves each logit l by at most
# about u·|l|; the margin between the two competing logits a and b can then move by
# u·(|l_a| + |l_b|). A divergence whose AR margin is within that bound is a near-tie that rounding
# may flip; a larger one is a bug sign. fp32 gets no such allowance: it must be identical.
BF16_UNIT_ROUNDOFF = 2.0 ** -8


def near_tie_bound(precision: str, logit_a: float, logit_b: float) -> float:
    """The largest AR margin between tokens a and b that the attention precision can flip."""
    return BF16_UNIT_ROUNDOFF * (abs(logit_a) + abs(logit_b)) if precision == "bf16" else 0.0


@dataclass(frozen=True)
class Divergence:
    index: int                      # generated-token index of the first difference
    position: int                   # sequence position
    ar_token: int
    ddtree_token: int
    margin: float                   # AR logits: chosen minus the DDTree token's logit (a near-tie is small)
    near_tie: bool                  # bf16 attention and |margin| <= bound: a rounding flip, not a bug sign
    bound: float = 0.0              # near_tie_bound of the two tokens (0 for fp32)


@dataclass(frozen=True)
class E2EResult:
    prompt: int
    variant: str
    backend: str
    budget: int
    depth: int
    tokens: int
    identical: bool
    divergence: Divergence | None
    mean_accept: float              # tau: accepted nodes per step, root included
    tokens_per_forward: float
    forwards: int
    seconds: float
    min_ar_margin: float = field(default=0.0)

    def passed(self, strict: bool = False) -> bool:
        """Identical, or (unless strict) diverged only at a bf16 near-tie within its bound."""
        return self.identical or (not strict and self.divergence is not None and self.divergence.near_tie)


def compare_runs(prompt_len: int, ar: ARResult, dd: DDTreeResult, precision: str = "f32") -> Divergence | None:
    for index, (a, b) in enumerate(zip(ar.tokens, dd.tokens)):
        if a != b:
            logit_a, logit_b = float(ar.logits[index][a]), float(ar.logits[index][b])
            margin, bound = logit_a - logit_b, near_tie_bound(precision, logit_a, logit_b)
            return Divergence(index, prompt_len + index, a, b, margin, abs(margin) <= bound, bound)
    return None


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng([seed, 5])
    return [rng.integers(0, vocab, size=length).tolist() for _ in range(count)]


def run_e2e(prompts: list[list[int]], tokens: int, options: list[DecodeOptions],
            cfg: ModelConfig = ModelConfig()):
    """Yield one E2EResult per (prompt, options); AR runs once per prompt and precision."""
    model = TinyMLA(cfg)
    for p_index, prompt in enumerate(prompts):
        references: dict[str, ARResult] = {}
        for opt in options:
            precision = "bf16" if opt.variant == "bf16_paged" else "f32"
            if precision not in references:
                references[precision] = autoregressive(model, prompt, tokens, precision)
            ar = references[precision]
            dd = ddtree(model, prompt, tokens, ar.tokens, opt)
            divergence = compare_runs(len(prompt), ar, dd, precision)
            yield E2EResult(p_index, opt.variant, opt.backend, opt.budget, opt.depth, tokens,
                            divergence is None, divergence, float(np.mean(dd.accept_lengths)),
                            tokens / dd.forwards, dd.forwards, dd.seconds, float(min(ar.margins)))
