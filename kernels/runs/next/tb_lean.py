"""tb_sorted TB_LEAN 0 against 1 (CUDA-graph replay, warm L2), outputs checked bit for bit against the
reference after each timing; B=64 and B=1 at budget 64, L=15, K=64, the bench's generator (its batch
of 64 holds one request with an exact tie), plus budget 128 (TB_NPL 4) at B=64. The pattern of
kernels/runs/h200-2026-11-29-s3/tb_ck.py. Not yet run on a GPU."""
import json, os
from pathlib import Path
import numpy as np
from kdtr.dtypes import to_numpy, to_torch
from tests.test_cuda_kernels import (TREE_BUILD, assert_bit_exact, generated, gpu_warmup_and_ceilings,
                                     poisoned_outputs, time_graph)

gpu_warmup_and_ceilings(lambda *a, **k: None)
res = {}
for batch, budget in ((64, 64), (1, 64), (64, 128)):
    gen = generated(TREE_BUILD, "default", 1, batch=batch, depth=15, vocab=32000, budget=budget)
    ins = {n: to_torch(a, "cuda") for n, a in gen.inputs.items()}
    want = TREE_BUILD.reference("default", gen.inputs, gen.params)
    for rep in range(2):                               # ABAB: 0, 1, 0, 1 (drift shows as a split)
        for lean in (0, 1):
            outs = poisoned_outputs(TREE_BUILD, "default", gen.inputs, gen.params)
            t = time_graph(lambda: TREE_BUILD.run_cuda("default", ins, gen.params, outs, kernel="tb_sorted",
                                                       defines={"TB_LEAN": lean}))
            key = f"B={batch} budget={budget} TB_LEAN={lean} rep={rep}"
            assert_bit_exact(key, {n: to_numpy(v) for n, v in outs.items()}, want)
            res[key] = round(float(np.median(t)), 2)
            print(f"{key}: {res[key]} us (bit exact)", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "tb_lean.json").write_text(json.dumps(res, indent=1))
