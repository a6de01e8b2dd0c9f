"""tb_sorted session 4 against v4 (CUDA-graph replay, warm L2), outputs checked bit for bit against
the reference after each timing: v4 as committed in session 3 (`git show 025623f:kernels/tree_build_fast.cu`;
calls 2-4 read it from a copy, tb_v4.cu, since replaced by this git read) and the new kernel (stepped staging,
redo from the first flagged pop, TB_LEAN=1 since call4) with the streamed epilogue off (S0) and on
(S1, the default), and S1 with v4's prefetches (TB_LEAN=0). call2 and call3 ran earlier sets
(call2: TB_REPLAY, since removed; call3: TB_LEAN still 0 by default, "S1 lean" there is S1 here). B=64 and B=1 at budget 64,
L=15, K=64 (the bench's generator: its batch of 64 holds one request with an exact tie, request 36,
whose chunk the loop replays), and budget 128 (TB_NPL 4) at B=64. Rounds in rotated order, so that
drift shows as a spread rather than as a difference."""
import json, math, os, subprocess, tempfile
from ctypes import c_int
from pathlib import Path
import numpy as np
from kdtr.device import get_kernel
from kdtr.dtypes import to_numpy, to_torch
from kdtr.ops.tree_build import sorted_shared_bytes
from tests.test_cuda_kernels import (TREE_BUILD, assert_bit_exact, generated, gpu_warmup_and_ceilings,
                                     poisoned_outputs, time_graph)

V4 = Path(tempfile.mkdtemp()) / "tb_v4.cu"      # the baseline, from git (kernels/ is on the include path)
V4.write_text(subprocess.run(["git", "show", "025623f:kernels/tree_build_fast.cu"], capture_output=True,
                             text=True, check=True).stdout)
VARIANTS = {"v4": (V4, {}),
            "S0": ("tree_build_fast.cu", {"TB_STREAM": 0}),
            "S1": ("tree_build_fast.cu", {}),
            "S1 prefetch": ("tree_build_fast.cu", {"TB_LEAN": 0})}

gpu_warmup_and_ceilings(lambda *a, **k: None)
res = {}
for batch, budget in ((64, 64), (1, 64), (64, 128)):
    gen = generated(TREE_BUILD, "default", 1, batch=batch, depth=15, vocab=32000, budget=budget)
    ins = {n: to_torch(a, "cuda") for n, a in gen.inputs.items()}
    want = TREE_BUILD.reference("default", gen.inputs, gen.params)
    lp = ins["topk_logp"]
    _, depth, k = lp.shape
    smem = sorted_shared_bytes(budget, depth, k)
    npl = max(1, math.ceil(budget / 32))
    kernels = {name: get_kernel(src, "tree_build_sorted", defines={"TB_NPL": npl, **d})
               for name, (src, d) in VARIANTS.items()}
    names = list(VARIANTS)
    for rep in range(3):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            outs = poisoned_outputs(TREE_BUILD, "default", gen.inputs, gen.params)
            args = [lp, ins["topk_ids"], ins["root_token"], ins["start"], c_int(batch), c_int(depth), c_int(k),
                    c_int(budget)] + [outs[n] for n in ("tokens", "parents", "depths", "positions", "ranks",
                                                        "scores", "visibility", "num_nodes")]
            t = time_graph(lambda: kernels[name].launch(batch, 256, args, shared_mem=smem))
            key = f"B={batch} budget={budget} {name}"
            assert_bit_exact(f"{key} rep {rep}", {n: to_numpy(v) for n, v in outs.items()}, want)
            res.setdefault(key, []).append(round(float(np.median(t)), 2))
    for name in names:
        key = f"B={batch} budget={budget} {name}"
        print(f"{key:<28} {' '.join(f'{x:6.2f}' for x in res[key])} us (bit exact)", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "tb_stream.json").write_text(json.dumps(res, indent=1))
