"""Run dmma.cu: TFLOP/s of FP64 tensor-core MMA shapes against FP32 FFMA, all SMs, same process.
Decides whether an FP64-tensor-core variant of verify_attn fp32 can beat the FFMA kernels."""
import json, os
from ctypes import c_int
from pathlib import Path
import torch
from kdtr.device import get_kernel
from tests.test_cuda_kernels import gpu_warmup_and_ceilings

gpu_warmup_and_ceilings(lambda *a, **k: None)
src = Path(__file__).with_name("dmma.cu")
fma_per_mma = {0: 256, 1: 512, 2: 1024, 3: 2048}
sms = torch.cuda.get_device_properties(0).multi_processor_count
inp = torch.rand(4096, dtype=torch.float64, device="cuda")
res = {}
for shape in (9, 0, 1, 2, 3):
    for smem in ((0,) if shape == 9 else (0, 1)):
        for nacc, warps in ((4, 4), (8, 4), (4, 8)):
            if shape == 9 and nacc == 8:
                continue
            k = get_kernel(src, "probe", defines={"SHAPE": shape, "NACC": nacc, "SMEMOP": smem})
            blocks = sms * 2
            out = torch.zeros(blocks * warps * 32, dtype=torch.float64, device="cuda")
            iters = 4096 if shape == 9 else 2048 * 256 // fma_per_mma[shape] // nacc * 4
            k.launch(blocks, warps * 32, [inp, out, c_int(iters)]); torch.cuda.synchronize()
            ts = []
            for _ in range(5):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(); k.launch(blocks, warps * 32, [inp, out, c_int(iters)]); e1.record()
                torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1) * 1e-3)
            t = sorted(ts)[2]
            if shape == 9:
                flop = blocks * warps * 32 * iters * 16 * 8 * 2
            else:
                flop = blocks * warps * iters * nacc * fma_per_mma[shape] * 2
            label = f"shape={shape} smem={smem} nacc={nacc} warps={warps}"
            res[label] = {"us": round(t * 1e6, 1), "tflops": round(flop / t / 1e12, 2)}
            print(f"{label:<40} {t*1e6:9.1f} us {flop/t/1e12:7.2f} TFLOP/s", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "dmma.json").write_text(json.dumps(res, indent=1))
