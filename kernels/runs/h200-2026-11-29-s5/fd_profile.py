"""fp32_dmma's FD_PROFILE timing diagnostic at the fp32 timing shape (B=1 H=16 Q=17 P=2048, 16 splits):
clock64 stamps of O warp 0 (softmax + P.V), O warp 7 (P.V only) and S warp 8 (copies + score MMAs)
per sub-tile, written into `out` (the merge kernel is not launched). Prints per sub-tile medians over
the 128 blocks of each interval, in cycles, and block 0's timeline. Settings: FD_PROFILE_DEFINES
(JSON list of extra define dicts; default: none, FD_DIAG=1, FD_DIAG=2)."""
import json, os
from pathlib import Path
import numpy as np
import torch
import kdtr.device as dev
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs, gpu_warmup_and_ceilings

gpu_warmup_and_ceilings(lambda *a, **k: None)
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
outs = {"out": torch.zeros((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
launch = dev.Kernel.launch
def patched(self, *a, **kw):
    if not self.name.endswith("_merge"):
        return launch(self, *a, **kw)
dev.Kernel.launch = patched
# S-warp events since call 5 (call 3 had the refill before the partial: "EMPTY_KV wait+issue",
# "EMPTY_S wait", "write+FULL" for the last three)
S_EV = ("kv wait+bar", "MMAs", "EMPTY_S wait", "write+FULL", "EMPTY_KV wait+refill")
O_EV = ("FULL wait", "softmax", "arrive+barrier", "alpha+FFMA", "EMPTY_KV arrive")
settings = json.loads(os.environ.get("FD_PROFILE_DEFINES", "[{}, {\"FD_DIAG\": 1}, {\"FD_DIAG\": 2}]"))
report = {}
for extra in settings:
    defines = {"FD_PROFILE": 1, **extra}
    for _ in range(20):
        VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel="fp32_dmma", defines=defines)
    torch.cuda.synchronize()
    outs["out"].zero_()
    VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel="fp32_dmma", defines=defines)
    torch.cuda.synchronize()
    st = outs["out"].view(-1).view(torch.int64)[:128 * 3 * 60].cpu().numpy().reshape(128, 3, 10, 6).astype(np.int64)
    name = json.dumps(extra) if extra else "default"
    print(f"\n=== {name}", flush=True)
    rep = {}
    for wsel, label, evs in ((2, "S warp 8", S_EV), (0, "O warp 0", O_EV), (1, "O warp 7", O_EV)):
        total = np.median(st[:, wsel, 9, 1] - st[:, wsel, 9, 0])
        print(f"{label}: start->end median {total:.0f} cycles")
        rows = []
        for t in range(9):
            d = np.diff(st[:, wsel, t, :], axis=1)             # [block][5]
            rows.append([float(np.median(d[:, e])) for e in range(5)])
            print(f"  t={t} " + "  ".join(f"{evs[e]} {rows[-1][e]:7.0f}" for e in range(5)))
        rep[label] = {"total": float(total), "per_subtile": rows}
    b0 = st[0] - st[0, 2, 9, 0]
    print("block 0 timeline (cycles from its start): S e0/e2/e5, O0 e1/e3/e4")
    for t in range(9):
        print(f"  t={t} S {b0[2, t, 0]:7d} {b0[2, t, 2]:7d} {b0[2, t, 5]:7d} | O0 {b0[0, t, 1]:7d} {b0[0, t, 3]:7d} {b0[0, t, 4]:7d}")
    report[name] = rep
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "fd_profile.json").write_text(json.dumps(report, indent=1))
