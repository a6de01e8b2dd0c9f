"""Where fp32_gemm's fixed ~7.6 us goes (B=1 H=16 Q=17 P=2048, CUDA-graph replay, warm L2): the
main kernel and the merge kernel timed alone and together, with and without key tiles (FK_DIAG=3),
and with the merge kernel's preferred shared-memory carveout raised to the main kernel's (a
carveout change between consecutive kernels makes an SM drain and reconfigure its L1)."""
import json, os
from pathlib import Path
import numpy as np
import torch
from cuda.bindings import driver
import kdtr.device as dev
from tests.test_cuda_kernels import VERIFY_ATTN, _bench_attn_inputs, gpu_warmup_and_ceilings, time_graph

gpu_warmup_and_ceilings(lambda *a, **k: None)
ins = _bench_attn_inputs("fp32", 1, 16, 2048, 16)
params = {"sm_scale": 576 ** -0.5}
k = VERIFY_ATTN.CUDA_KERNELS["fp32_gemm"]
outs = {"out": torch.empty((1, 17, 16, 512), device="cuda"), "lse": torch.empty((1, 17, 16), device="cuda")}
skip = set()
launch = dev.Kernel.launch
def patched(self, *a, **kw):
    if self.name not in skip:
        return launch(self, *a, **kw)
dev.Kernel.launch = patched
res = {}
def run(label, defines=None, skip_names=()):
    skip.clear(); skip.update(skip_names)
    t = time_graph(lambda: VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel="fp32_gemm", defines=defines),
                   replays=5, samples=15)
    res[label] = round(float(np.median(t)), 2)
    print(f"{label:<40} {res[label]:8.2f} us", flush=True)
for rnd in range(2):
    sfx = "" if rnd == 0 else " (carveout 100 on merge)"
    run("full" + sfx)
    run("full FK_DIAG=3" + sfx, {"FK_DIAG": 3})
    run("main only" + sfx, None, (k.merge,))
    run("main only FK_DIAG=3" + sfx, {"FK_DIAG": 3}, (k.merge,))
    run("merge only" + sfx, None, (k.main,))
    if rnd == 0:
        for kern in [x for x in dev._kernels.values() if x.name == k.merge]:   # the loaded merge kernel(s)
            r = driver.cuFuncSetAttribute(kern.function,
                                          driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
            print("carveout attribute:", kern.name, r, flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "fp32_fixed.json").write_text(json.dumps(res, indent=1))
