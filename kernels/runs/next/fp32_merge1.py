"""Queued experiment (not yet run on a GPU): merge1 (fp32_merge1.cu, the merge in one round trip)
against fp32_gemm's current merge on the same partials, B=1 H=16 Q=17 P=2048 (33 splits, 18.4 MB of
partials), CUDA-graph replay, warm L2, rounds alternated; outputs asserted bit-identical. The
partials are those fp32_gemm's main kernel writes in a normal run_cuda call (captured from its merge
launch). Prediction (kernels/NOTES.md, "Session 4"): 8.7 us -> 3-5 us for the merge alone."""
import json, os
from pathlib import Path
import numpy as np
import torch
import kdtr.device as dev
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs, gpu_warmup_and_ceilings, time_graph

gpu_warmup_and_ceilings(lambda *a, **k: None)
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
k = VERIFY_ATTN.CUDA_KERNELS["fp32_gemm"]
outs = {"out": torch.empty((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
captured = {}
launch = dev.Kernel.launch
def capture(self, grid, block, args, **kw):
    if self.name == k.merge:
        captured.update(kernel=self, grid=grid, block=block, args=list(args))
    return launch(self, grid, block, args, **kw)
dev.Kernel.launch = capture
VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel="fp32_gemm")
torch.cuda.synchronize()
dev.Kernel.launch = launch
ws_o, ws_m, ws_l, n_splits, rows = captured["args"][:5]
current = captured["kernel"]
merge1 = dev.get_kernel(Path(__file__).with_name("fp32_merge1.cu"), "merge1")
res = {}
results = {}
for rnd in range(3):
    for name, kern in (("current", current), ("merge1", merge1)):
        out = torch.full((rows.value, 512), float("nan"), device="cuda")
        lse = torch.full((rows.value,), float("nan"), device="cuda")
        t = time_graph(lambda: kern.launch(rows.value, 128, [ws_o, ws_m, ws_l, n_splits, rows, out, lse]))
        res.setdefault(name, []).append(round(float(np.median(t)), 2))
        results[name] = (out.cpu().numpy(), lse.cpu().numpy())
    a, b = results["current"], results["merge1"]
    same = all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))
    assert same, f"merge1 differs: max |d out| {np.nanmax(np.abs(a[0] - b[0]))}, max |d lse| {np.nanmax(np.abs(a[1] - b[1]))}"
print(f"splits {n_splits.value}, rows {rows.value}: current {res['current']} us, merge1 {res['merge1']} us (bit identical)")
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "fp32_merge1.json").write_text(json.dumps(res, indent=1))
