"""fp32_dmma against fp32_gemm at the fp32 timing shape (B=1 H=16 Q=17 P=2048), one process, CUDA-graph
replay, warm L2, rounds in rotated order; each setting's output poisoned before and checked against a
float64 dense reference after its timing. Also: fp32_dmma's main kernel and merge alone, and forced
split counts (8, 12, 16 = default, and 1: one block per row tile, no merge)."""
import json, os
from pathlib import Path
import numpy as np
import torch
import kdtr.device as dev
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs, attn_errors_vs_dense, gpu_warmup_and_ceilings, time_graph

gpu_warmup_and_ceilings(lambda *a, **k: None)
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
outs = {"out": torch.empty((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
skip = set()
launch = dev.Kernel.launch
def patched(self, *a, **kw):
    if self.name not in skip:
        return launch(self, *a, **kw)
dev.Kernel.launch = patched
runs = [("fp32_gemm", None, ()), ("fp32_dmma", None, ()), ("fp32_dmma", 12, ()), ("fp32_dmma", 8, ()),
        ("fp32_dmma", 1, ()), ("fp32_dmma", None, ("verify_attn_fp32_dmma_merge",)),
        ("fp32_dmma", None, ("verify_attn_fp32_dmma",))]
res = {}
for rnd in range(3):
    order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
    for name, splits, skip_names in order:
        label = f"{name} splits={splits or 'auto'}" + (f" skip={','.join(skip_names)}" if skip_names else "")
        skip.clear(); skip.update(skip_names)
        for t in outs.values():
            t.fill_(float("nan"))
        t = time_graph(lambda: VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel=name, splits=splits),
                       replays=5, samples=15)
        med = round(float(np.median(t)), 2)
        check = attn_errors_vs_dense("fp32", ins, params, outs) if not skip_names else "(partial run: not checked)"
        res.setdefault(label, []).append(med)
        print(f"round {rnd} {label:<60} {med:8.2f} us  {check}", flush=True)
print("\nmedians per setting (3 rounds):")
for label, v in res.items():
    print(f"  {label:<60} {' '.join(f'{x:7.2f}' for x in v)}")
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "fd_time.json").write_text(json.dumps(res, indent=1))
