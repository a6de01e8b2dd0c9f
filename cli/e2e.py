"""`kdtree e2e`: DDTree decoding through our ops against autoregressive greedy, token for token."""

from __future__ import annotations

import math
from typing import List, Optional

import typer

from . import render
from .app import JsonOpt, JsonOut, QuietOpt, app, flag, guarded


@app.command("e2e")
@guarded
def e2e_cmd(
    backend: str = typer.Option("auto", "--backend", "-b",
                                help="cuda (our kernels), torch (CPU or GPU), numpy, auto (cuda where a GPU exists)."),
    variant: List[str] = typer.Option(["fp32", "bf16_paged"], "--variant",
                                      help="verify_attn variant(s): fp32 (contiguous KV) and/or bf16_paged (paged pool)."),
    tokens: int = typer.Option(256, "--tokens", min=1, help="Tokens to generate per prompt."),
    budget: List[int] = typer.Option([8, 32, 64], "--budget", help="Tree budget(s) (non-root nodes)."),
    depth: int = typer.Option(8, "--depth", min=1, max=64, help="Draft depth L."),
    prompts: int = typer.Option(3, "--prompts", min=1, help="Random prompts."),
    prompt_len: int = typer.Option(16, "--prompt-len", min=1, help="Tokens per prompt."),
    quality: float = typer.Option(6.0, "--quality", help="Drafter quality: logit bonus of the true next token."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the model weights, prompts and drafter noise."),
    strict: bool = flag("--strict", help="Fail on any divergence, bf16 near-ties included."),
    quiet: bool = QuietOpt,
    json_path: Optional[str] = JsonOpt,
):
    """Run AR greedy and DDTree (tree_build -> verify_attn -> tree_accept) on the same prompts;
    exit 1 if a generated token differs (fp32: any; bf16: beyond a near-tie the bf16 rounding can
    flip, or any with --strict), reporting the first divergence and its logit margin."""
    from kdtr.impl import backends
    from kdtr.records import report
    from kdtr.verify.e2e import DecodeOptions, ModelConfig, make_prompts, run_e2e
    from kdtr.errors import UsageError

    json_out = JsonOut(json_path)
    for name in variant:
        if name not in ("fp32", "bf16_paged"):
            raise UsageError(f"--variant {name!r}: choose fp32 or bf16_paged")
    if not math.isfinite(quality):
        raise UsageError(f"--quality {quality}: must be a finite number (a logit bonus)")
    for value in budget:
        if not 0 <= value <= 4096:
            raise UsageError(f"--budget {value}: must be in [0, 4096]")
    resolved = backends.resolve_backend(backend)
    if resolved == "cuda":
        from kdtr.runtime.device import require_gpu

        require_gpu()
    cfg = ModelConfig(seed=seed)
    options = [DecodeOptions(resolved, v, b, depth, quality, seed) for v in variant for b in budget]
    prompt_list = make_prompts(prompts, prompt_len, cfg.vocab, seed)
    with json_out.tables():
        runs = list(render.progress(run_e2e(prompt_list, tokens, options, cfg), len(prompt_list) * len(options),
                                    f"e2e ({resolved})", quiet=quiet, line=render.e2e_line))
        render.e2e_table(runs, quiet=quiet)
    json_out.write(lambda: {"meta": report.record_meta("e2e"), "model": cfg, "runs": runs})
    raise typer.Exit(0 if all(r.passed(strict) for r in runs) else 1)
