"""Kernel timeline of one CUDA-graph replay (10 launches of run_cuda) at the fp32 timing shape, from the
torch profiler (CUPTI): each kernel's duration and the gap before it, per entry named in PROF_ENTRIES
(JSON list; entries as ab.py registers them)."""
import json, os, runpy
from pathlib import Path
import torch
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("AB_RUNS", "[]")
g = runpy.run_path(str(Path(__file__).with_name("ab.py")))      # registers the entries; AB_RUNS empty: times nothing
VERIFY_ATTN, ins, params, outs = g["VERIFY_ATTN"], g["ins"], g["params"], g["outs"]
for name in json.loads(os.environ.get("PROF_ENTRIES", '["cur", "cur_plain", "v6"]')):
    fn = lambda: VERIFY_ATTN.run_cuda("fp32", ins, params, outs, kernel=name)
    fn(); torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        for _ in range(10):
            fn()
    graph.replay(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay(); torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    print(f"== {name}: {len(evs)} kernels, span {evs[-1].time_range.end - evs[0].time_range.start:.1f} us")
    prev = None
    for e in evs[-9:]:                                          # the last three launches of the graph
        gap = e.time_range.start - prev if prev is not None else float("nan")
        print(f"  {e.name[-40:]:<40} {e.time_range.end - e.time_range.start:7.2f} us  gap {gap:6.2f}")
        prev = e.time_range.end
