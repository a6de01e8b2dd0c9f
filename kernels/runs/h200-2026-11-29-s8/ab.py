"""Session 8 A/B at the fp32 timing shape (B=1 H=16 Q=17 P=2048): one process, CUDA-graph replay (5
launches a graph, 15 samples), rounds in rotated order; every setting's outputs poisoned (NaN) before
and, after its timing, checked against the float64 dense reference and compared bit for bit with the
first setting's (FX_DIAG settings are timing only: not checked). Entries: the host's and entries.py's
(call 1 ran before entries.py, with v7_plain = the kernel of then without programmatic launch).
Settings: AB_RUNS (JSON list of [entry, splits, defines]); AB_SHAPE "B,H,P,budget" (default 1,16,2048,16)."""
import json, os
from pathlib import Path
import numpy as np
import torch
import entries  # noqa: F401 - registers the A/B entries
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs, attn_errors_vs_dense, gpu_warmup_and_ceilings, time_graph

gpu_warmup_and_ceilings(lambda *a, **kw: None)
batch, heads, prefix, budget = (int(x) for x in os.environ.get("AB_SHAPE", "1,16,2048,16").split(","))
ins = _bench_attn_inputs("fp32", batch, heads, prefix, budget)
q_len = ins["q"].shape[1]
params = {"sm_scale": 576 ** -0.5}
outs = {"out": torch.empty((batch, q_len, heads, 512), device="cuda"),
        "lse": torch.empty((batch, q_len, heads), device="cuda")}
runs = [tuple(r) for r in json.loads(os.environ["AB_RUNS"])]
first: dict[str, torch.Tensor] = {}
res = {}
for rnd in range(3):
    order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
    for name, splits, defines in order:
        label = f"{name} splits={splits or 'auto'}" + (f" {defines}" if defines else "")
        for t in outs.values():
            t.fill_(float("nan"))
        try:
            t = time_graph(lambda: VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel=name, splits=splits,
                                                        defines=defines), replays=5, samples=15)
        except Exception as err:  # noqa: BLE001 - a setting that fails is reported, the others still run
            print(f"round {rnd} {label:<50} FAILED {type(err).__name__}: {err}", flush=True)
            continue
        med = round(float(np.median(t)), 2)
        if any(key.endswith("_DIAG") for key in defines or {}):
            check = "(timing diagnostic: not checked)"
        else:
            check = attn_errors_vs_dense("fp32", ins, params, outs)
            if not first:
                first = {n: v.clone() for n, v in outs.items()}
            same = all(torch.equal(outs[n], first[n]) for n in outs)
            check += "  bit-identical to the first checked setting" if same else "  ** DIFFERS from the first checked setting **"
        res.setdefault(label, []).append(med)
        print(f"round {rnd} {label:<50} {med:8.2f} us  {check}", flush=True)
print("\nmedians per setting (3 rounds):")
for label, v in res.items():
    print(f"  {label:<50} {' '.join(f'{x:7.2f}' for x in v)}")
if os.environ.get("OUT"):
    Path(os.environ["OUT"], os.environ.get("AB_JSON", "ab.json")).write_text(json.dumps(res, indent=1))
