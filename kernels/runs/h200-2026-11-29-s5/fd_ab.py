"""Call 2: fp32_dmma's knobs against its default and fp32_gemm at the fp32 timing shape (B=1 H=16 Q=17
P=2048), one process, CUDA-graph replay, warm L2, rounds in rotated order; each setting's output
poisoned before and checked against a float64 dense reference after its timing (FD_DIAG settings are
timing only: wrong by design). Settings come from FD_RUNS (JSON list of [kernel, splits, defines]) or
the list below."""
import json, os
from pathlib import Path
import numpy as np
import torch
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs, attn_errors_vs_dense, gpu_warmup_and_ceilings, time_graph

gpu_warmup_and_ceilings(lambda *a, **k: None)
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
outs = {"out": torch.empty((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
runs = [("fp32_gemm", None, None), ("fp32_dmma", None, None), ("fp32_dmma", None, {"FD_ACC2": 1}),
        ("fp32_dmma", None, {"FD_DIAG": 1}), ("fp32_dmma", None, {"FD_DIAG": 2}),
        ("fp32_dmma", None, {"FD_DIAG": 1, "FD_ACC2": 1})]
if os.environ.get("FD_RUNS"):
    runs = [tuple(r) for r in json.loads(os.environ["FD_RUNS"])]
res = {}
for rnd in range(3):
    order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
    for name, splits, defines in order:
        label = f"{name} splits={splits or 'auto'}" + (f" {defines}" if defines else "")
        for t in outs.values():
            t.fill_(float("nan"))
        t = time_graph(lambda: VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel=name, splits=splits,
                                                    defines=defines), replays=5, samples=15)
        med = round(float(np.median(t)), 2)
        diag = any(k.endswith("_DIAG") for k in defines or {})
        check = "(timing diagnostic: not checked)" if diag else attn_errors_vs_dense("fp32", ins, params, outs)
        res.setdefault(label, []).append(med)
        print(f"round {rnd} {label:<60} {med:8.2f} us  {check}", flush=True)
print("\nmedians per setting (3 rounds):")
for label, v in res.items():
    print(f"  {label:<60} {' '.join(f'{x:7.2f}' for x in v)}")
if os.environ.get("OUT"):
    Path(os.environ["OUT"], os.environ.get("FD_JSON", "fd_ab.json")).write_text(json.dumps(res, indent=1))
