"""Run latency.cu on the GPU: cycles per dependent step of each probe (one warp)."""
import ctypes, json, os, sys
from pathlib import Path
import torch
from kdtr.device import get_kernel

names = ["DADD", "DSETP->FSEL(dbl)", "ISETP->SEL", "SHFL.IDX", "IADD", "VOTE.ANY->SEL", "LDS chase",
         "u64 cmp->sel", "DSETP.EQ->VOTE->DADD", "(s-a)+b"]
k = get_kernel(Path(__file__).with_name("latency.cu"), "probe")
din = torch.tensor([1.5, 0.25, -3.0], dtype=torch.float64, device="cuda")
iin = torch.tensor([3, 7, 11, 5, 9, 13], dtype=torch.int32, device="cuda")
dout = torch.zeros(32, dtype=torch.float64, device="cuda"); iout = torch.zeros(32, dtype=torch.int32, device="cuda")
cyc = torch.zeros(16, dtype=torch.float32, device="cuda")
res = {}
for rep in range(3):
    k.launch(1, 32, [din, iin, dout, iout, cyc]); torch.cuda.synchronize()
    res = {n: round(float(v), 2) for n, v in zip(names, cyc.tolist())}
print(json.dumps(res, indent=1))
out = os.environ.get("OUT")
if out:
    Path(out, "latency.json").write_text(json.dumps(res, indent=1))
