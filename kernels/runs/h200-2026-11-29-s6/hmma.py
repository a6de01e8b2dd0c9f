"""Run hmma.cu: HMMA.16816 bf16 throughput per SM (132 blocks, W warps each), alone and with other
instructions beside it (OPK: 0 F2FP, 1 FFMA, 2 IADD/LOP, 3 PRMT, 4 LDS.128, 5 ldmatrix.x4); each
kind also alone. If `with` is near the larger of the two alone the pipes overlap; near the sum, they
share. Rates at the H200's 1980 MHz."""
import json, os
from ctypes import c_int
from pathlib import Path
import torch
from kdtr.device import get_kernel

SRC = Path(__file__).with_name("hmma.cu")
inp = torch.rand(4096, device="cuda")
iters = 2000
runs = [(8, 8, 0, 0), (12, 8, 0, 0)]
for opk in range(6):
    runs += [(8, 0, 16, opk), (8, 8, 16, opk)]
res = {}
for w, nacc, cv, opk in runs:
    k = get_kernel(str(SRC), "hmma", defines={"NACC": nacc, "CV": cv, "OPK": opk})
    out = torch.empty(132 * 32 * w, device="cuda")
    launch = lambda: k.launch(132, 32 * w, [inp, out, c_int(iters)])  # noqa: E731
    launch(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); [launch() for _ in range(3)]; b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 3 * 1e3)
    t = sorted(ts)[2]
    clk = 1.98e3
    label = f"W={w} NACC={nacc} CV={cv} OPK={opk}"
    res[label] = round(t, 1)
    print(f"{label:<28} {t:9.1f} us  {w * iters * nacc / (t * clk):6.3f} MMA/clk/SM  "
          f"{w * iters * cv / (t * clk):6.3f} other warp-instr/clk/SM", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "hmma.json").write_text(json.dumps(res, indent=1))
