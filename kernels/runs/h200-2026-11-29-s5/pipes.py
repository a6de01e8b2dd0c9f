"""Run pipes.cu: the DMMA loop (4 warps an SM) and FFMA chains (8 warps) alone and together, same work
each time; if the SM runs both units at once, `together` is close to the larger of the two alone, if
they share an issue or math path it is close to their sum. Call 4: each operand mode (CVT 1 F2F from
fp32, 0 fp64 shared memory, 2 registers only, 3 conversions without MMAs)."""
import json, os
from ctypes import c_int
from pathlib import Path
import torch
from kdtr.device import get_kernel

SRC = Path(__file__).with_name("pipes.cu")
inp = torch.randn(4096, device="cuda") * 1e-3
iters, fiters = 200, 5000
res = {}
for cvt, dw, fw in ((1, 0, 8), (1, 4, 0), (1, 4, 8), (0, 4, 0), (0, 4, 8), (2, 4, 0), (2, 4, 8), (3, 4, 0), (3, 4, 8)):
    k = get_kernel(str(SRC), "pipes", defines={"DW": dw, "FW": fw, "CVT": cvt})
    out = torch.empty(132 * 32 * (dw + fw), dtype=torch.float64, device="cuda")
    launch = lambda: k.launch(132, 32 * (dw + fw), [inp, out, c_int(iters), c_int(fiters)])  # noqa: E731
    launch(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); [launch() for _ in range(3)]; b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 3 * 1e3)
    t = sorted(ts)[2]
    label = f"CVT={cvt} DMMA warps {dw} + FFMA warps {fw}"
    res[label] = round(t, 1)
    dflop = 132 * dw * iters * 9 * 4 * 5 * 1024
    fflop = 132 * fw * 32 * 64 * fiters * 2
    print(f"{label:<30} {t:8.1f} us  (DMMA {dflop / t / 1e6:5.1f} TFLOP/s, FFMA {fflop / t / 1e6:5.1f} TFLOP/s)", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "pipes.json").write_text(json.dumps(res, indent=1))
