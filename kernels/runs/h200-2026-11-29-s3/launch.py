"""Graph-replay time of tree_build-shaped launches (launch.cu) that do nothing, only store, or chase
global loads first; then the eager-launch probe again (after the device.py caching)."""
import json, os, subprocess, sys
from ctypes import c_int
from pathlib import Path
import numpy as np
import torch
from kdtr.device import get_kernel
from tests.test_cuda_kernels import gpu_warmup_and_ceilings, time_graph

gpu_warmup_and_ceilings(lambda *a, **k: None)
k = get_kernel(Path(__file__).with_name("launch.cu"), "launch_probe")
inp = torch.zeros(1024, dtype=torch.int32, device="cuda")
out = torch.zeros(64 * 4096, dtype=torch.int32, device="cuda")
res = {}
for label, smem, words, chase in [("empty, no smem", 0, 0, 0), ("empty, 16 KB smem", 16384, 0, 0),
                                  ("1 KB stores/block", 16384, 256, 0), ("4 KB stores/block", 16384, 1024, 0),
                                  ("16 KB stores/block", 16384, 4096, 0), ("1 global load, 4 KB stores", 16384, 1024, 1),
                                  ("4 chained loads, 4 KB stores", 16384, 1024, 4)]:
    t = time_graph(lambda: k.launch(64, 256, [inp, out, c_int(words), c_int(chase)], shared_mem=smem))
    res[label] = round(float(np.median(t)), 2)
    print(f"{label:<32} {res[label]:7.2f} us", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "launch.json").write_text(json.dumps(res, indent=1))
