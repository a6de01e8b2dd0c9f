"""Run dmma_cvt.cu: fp32_dmma's S-warp loop alone, TFLOP/s of useful fp64-MMA FLOPs per setting
(132 blocks, CUDA events around 3 launches after a warm-up, median of 5)."""
import json, os
from ctypes import c_int
from pathlib import Path
import torch
from kdtr.device import get_kernel

SRC = Path(__file__).with_name("dmma_cvt.cu")
res = {}
inp = torch.randn(4096, device="cuda")
smem = (56 * 144) * 12
iters = 400
for warps in (4, 8):
    for cvt in (1, 0, 2):
        for acc2 in (0, 1):
            k = get_kernel(str(SRC), "probe", defines={"CVT": cvt, "ACC2": acc2})
            out = torch.empty(132 * 32 * warps, dtype=torch.float64, device="cuda")
            launch = lambda: k.launch(132, 32 * warps, [inp, out, c_int(iters)], shared_mem=smem)  # noqa: E731
            launch(); torch.cuda.synchronize()
            times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); [launch() for _ in range(3)]; b.record(); b.synchronize()
                times.append(a.elapsed_time(b) / 3 * 1e-3)
            t = sorted(times)[2]
            flop = 132 * warps * iters * 9 * 4 * 5 * 1024
            label = f"warps/SM={warps} CVT={cvt} ACC2={acc2}"
            res[label] = round(flop / t / 1e12, 1)
            print(f"{label:<28} {res[label]:6.1f} TFLOP/s  ({t * 1e6:.1f} us)", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "dmma_cvt.json").write_text(json.dumps(res, indent=1))
