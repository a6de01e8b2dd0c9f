"""One launch of an A/B entry (ONCE_ENTRY, default cur) at the fp32 timing shape after a warm-up, for ncu."""
import os
import torch
import entries  # noqa: F401 - registers the A/B entries
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs

name = os.environ.get("ONCE_ENTRY", "cur")
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
outs = {"out": torch.empty((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
for _ in range(3):
    VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel=name)
torch.cuda.synchronize()
print("ran", name)
