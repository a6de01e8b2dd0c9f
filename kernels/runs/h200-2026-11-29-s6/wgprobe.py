"""Run wgprobe.cu: tensor-core MMAs (mma.sync or wgmma) in some warps and F2FP or FFMA in others, each
alone and both at once, same work each time. `both` near the larger of the two alone: they overlap;
near the sum: they share a unit. 132 blocks (one per SM), rates at 1980 MHz."""
import json, os
from ctypes import c_int
from pathlib import Path
import torch
from kdtr.device import get_kernel

SRC = Path(__file__).with_name("wgprobe.cu")
inp = torch.rand(4096, device="cuda")
res = {}
# (WG, CK, MMA warps, conversion warps, mma rounds, conversion rounds)
runs = []
for wg, mi in ((0, 2000), (1, 400)):
    for ck, ci in [(int(c), {0: 1200, 1: 3000, 2: 1500}[int(c)]) for c in os.environ.get("PROBE_CK", "01")]:
        runs += [(wg, ck, 8, 0, mi, ci), (wg, ck, 0, 8, mi, ci), (wg, ck, 8, 8, mi, ci)]
for wg, ck, nm, nc, mi, ci in runs:
    k = get_kernel(str(SRC), "wgprobe", arch="sm_90a", defines={"WG": wg, "CK": ck})
    threads = 32 * (nm + nc)
    out = torch.empty(132 * threads, device="cuda")
    launch = lambda: k.launch(132, threads, [inp, out, c_int(nm), c_int(mi), c_int(ci)], shared_mem=16384)  # noqa: E731
    launch(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); [launch() for _ in range(3)]; b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 3 * 1e3)
    t = sorted(ts)[2]
    flop = ((nm // 4) * mi * 8 * 64 * 64 * 16 * 2 if wg else nm * mi * 8 * 4096) if nm else 0   # per SM
    label = f"{'wgmma' if wg else 'mma.sync'} warps {nm} + {('F2FP', 'FFMA', 'INT')[ck]} warps {nc}"
    res[label] = round(t, 1)
    print(f"{label:<36} {t:9.1f} us  tensor {flop * 132 / t / 1e6:6.1f} TFLOP/s", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "wgprobe.json").write_text(json.dumps(res, indent=1))
