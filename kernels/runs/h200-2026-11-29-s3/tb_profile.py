"""tb_sorted's TB_PROFILE timing diagnostic on the GPU: cycles per phase and per pop, and the SM clock.

Builds tree_build_fast.cu with TB_PROFILE=1 (its outputs are wrong: thread 0 of each block
overwrites scores[b][0..9] with clock64 / %globaltimer deltas and counts: the fields listed in the
kernel's header, FIELDS below; v4: the rerun flag became the count of restored checkpoints and
field 9 the pops replayed) on the
bench's inputs (tests/test_cuda_kernels.py bench(): seed 1, B=64, L=15, vocab 32000, K = budget)
at budgets 16, 32, 64, 128 (and 0, the fixed part), after a ~1 s warm-up that raises the clocks.
Prints one line per budget and writes $OUT/tb_profile.json (or ./tb_profile.json) with the
per-block medians and quartiles. Also times the normal build and the profile build with CUDA
events (plain launches, not graphs) so that the diagnostic's own overhead shows.

Run from the repository root: .venv/bin/python kernels/runs/h200-2026-11-29-s3/tb_profile.py
Extra compile-time defines for both builds: TB_DEFINES="TB_FORCE_EXACT=1,TB_UNROLL=1".
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kdtr.ops import get_op
from kdtr.ops.base import Case

# 0 staging cycles, 1 pop loop less the replays, 2 inside the tie replays, 3 epilogue, 4 total (cycles),
# 5 total ns, 6 pops, 7 checkpoints restored, 8 ns of the loop, 9 live pops replayed exactly
FIELDS = ("cyc_stage", "cyc_fast_loop", "cyc_replay", "cyc_epilogue", "cyc_total", "ns_total",
          "pops", "restores", "ns_loops", "replayed")
TB = get_op("tree_build")


def bench_inputs(batch: int, depth: int, budget: int, seed: int = 1):
    """The bench's generator (generated(TREE_BUILD, "default", 1, ...) in tests/test_cuda_kernels.py)."""
    params = {p.name: p.default for p in TB.params} | dict(batch=batch, depth=depth, vocab=32000, budget=budget)
    gen = TB.generate(Case(f"tree_build-default-s{seed}", "tree_build", "default", seed, params, inline={}))
    TB.check_inputs("default", gen.inputs, gen.params)
    return gen


def outputs_for(gen):
    outs = {}
    for name, (kind, shape) in TB.output_specs("default", gen.inputs, gen.params).items():
        dtype = {"i32": torch.int32, "f64": torch.float64, "u8": torch.uint8}[kind]
        outs[name] = torch.zeros(shape, dtype=dtype, device="cuda")
    return outs


def event_us(fn, launches: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(launches):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / launches


def warm_clocks(seconds: float = 1.0) -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def stats(x: np.ndarray) -> dict:
    return {"median": float(np.median(x)), "p25": float(np.percentile(x, 25)), "p75": float(np.percentile(x, 75)),
            "min": float(x.min()), "max": float(x.max())}


def main() -> int:
    extra = dict(kv.split("=", 1) for kv in os.environ.get("TB_DEFINES", "").split(",") if kv)
    print(f"device: {torch.cuda.get_device_name()}  extra defines {extra or '-'}", flush=True)
    warm_clocks()
    result = {"device": torch.cuda.get_device_name(), "defines": extra, "fields": FIELDS, "cases": {}}
    for budget in (64, 16, 32, 128, 0):
        gen = bench_inputs(64, 15, budget)
        ins = {n: torch.from_numpy(np.ascontiguousarray(a)).cuda() for n, a in gen.inputs.items()}
        outs = outputs_for(gen)
        normal = lambda: TB.run_cuda("default", ins, gen.params, outs, kernel="tb_sorted", defines=extra)  # noqa: E731
        prof = lambda: TB.run_cuda("default", ins, gen.params, outs, kernel="tb_sorted",  # noqa: E731
                                   defines={**extra, "TB_PROFILE": 1})
        us_normal = event_us(normal)
        us_prof = event_us(prof)
        for _ in range(5):
            prof()
        torch.cuda.synchronize()
        q = budget + 1
        raw = outs["scores"].cpu().numpy()[:, :min(q, len(FIELDS))]
        case = {"B": 64, "L": 15, "K": int(gen.params["topk"]), "budget": budget,
                "us_event_normal": us_normal, "us_event_profile": us_prof}
        cols = {FIELDS[j]: raw[:, j] for j in range(raw.shape[1])}
        for name, col in cols.items():
            case[name] = stats(col)
        if "ns_total" in cols:
            case["mhz_total"] = stats(cols["cyc_total"] / np.maximum(cols["ns_total"], 1) * 1e3)
        if "ns_loops" in cols:
            loops = cols["cyc_fast_loop"] + cols["cyc_replay"]
            case["mhz_loops"] = stats(loops / np.maximum(cols["ns_loops"], 1) * 1e3)
        if budget > 0 and "pops" in cols:
            pops = np.maximum(cols["pops"], 1)
            case["cyc_per_pop_fast"] = stats(cols["cyc_fast_loop"] / pops)
            case["cyc_per_pop_all_loops"] = stats((cols["cyc_fast_loop"] + cols["cyc_replay"]) / pops)
            case["restores"] = int(cols["restores"].sum()) if "restores" in cols else None
            case["replayed"] = int(cols["replayed"].sum()) if "replayed" in cols else None
            case["cyc_replay_max"] = float(cols["cyc_replay"].max())
        result["cases"][str(budget)] = case
        med = {k: (v["median"] if isinstance(v, dict) else v) for k, v in case.items()}
        line = (f"budget {budget:3d}: event {us_normal:6.2f} us (profile build {us_prof:6.2f}); "
                f"cycles stage {med.get('cyc_stage', float('nan')):7.0f}")
        if budget > 0:
            line += (f" fast loop {med['cyc_fast_loop']:7.0f} replay max {case['cyc_replay_max']:6.0f}"
                     f" epilogue {med['cyc_epilogue']:6.0f} total {med['cyc_total']:7.0f}"
                     f" | pops {med['pops']:.0f}, {med['cyc_per_pop_fast']:.1f} cycles/pop (fast loop),"
                     f" restores {case['restores']} ({case['replayed']} pops replayed)")
        if budget >= 8:
            line += f" | {med['mhz_total']:.0f} MHz (total), {med['mhz_loops']:.0f} MHz (loops)"
        print(line, flush=True)
    text = json.dumps(result, indent=1)
    out = Path(os.environ.get("OUT", "."), "tb_profile.json")
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
