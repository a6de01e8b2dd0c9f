"""Host cost of one eager launch through kdtr (tree_accept.run_cuda, B=64 Q=65) against a torch op
of the same size, calls back to back with one sync at the end; and with the profiler's top frames."""
import cProfile, io, json, os, pstats, time
from pathlib import Path
import torch
from kdtr.ops import get_op
from kdtr.dtypes import to_torch
from tests.test_cuda_kernels import generated, poisoned_outputs

op = get_op("tree_accept")
gen = generated(op, "default", 1, batch=64, budget=64, depth=15, vocab=64)
ins = {n: to_torch(a, "cuda") for n, a in gen.inputs.items()}
outs = poisoned_outputs(op, "default", gen.inputs, gen.params)
x = torch.zeros(64 * 65, dtype=torch.int32, device="cuda")

def per_call(fn, n=3000):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

res = {"kdtr tree_accept.run_cuda eager (us/call)": per_call(lambda: op.run_cuda("default", ins, gen.params, outs)),
       "torch x.add_(1) (us/call)": per_call(lambda: x.add_(1))}
prof = cProfile.Profile(); prof.enable()
for _ in range(2000):
    op.run_cuda("default", ins, gen.params, outs)
torch.cuda.synchronize(); prof.disable()
s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
res = {k: round(v, 2) for k, v in res.items()}
print(json.dumps(res, indent=1)); print(s.getvalue()[:4000])
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "eager.json").write_text(json.dumps(res, indent=1) + "\n" + s.getvalue()[:4000])
