"""One launch of an fp32 kernel at the timing shape (B=1 H=16 Q=17 P=2048) after a warm-up, for ncu:
FX_KERNEL names the CUDA_KERNELS entry (default fp32_bf16x3), FX_DEFINES (JSON) its knobs."""
import json, os
import torch
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs

name = os.environ.get("FX_KERNEL", "fp32_bf16x3")
defines = json.loads(os.environ.get("FX_DEFINES", "{}")) or None
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
outs = {"out": torch.empty((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
for _ in range(3):
    VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel=name, defines=defines)
torch.cuda.synchronize()
print("ran", name, defines)
