"""tb_sorted checkpoint interval TB_CK against time (CUDA-graph replay, warm L2), outputs checked bit
for bit against the reference after each timing; B=64 and B=1 at budget 64, L=15, K=64, the bench's
generator (its batch of 64 holds one request with an exact tie)."""
import json, os
from pathlib import Path
import numpy as np
from kdtr.dtypes import to_numpy, to_torch
from tests.test_cuda_kernels import (TREE_BUILD, assert_bit_exact, generated, gpu_warmup_and_ceilings,
                                     poisoned_outputs, time_graph)

gpu_warmup_and_ceilings(lambda *a, **k: None)
res = {}
for batch in (64, 1):
    gen = generated(TREE_BUILD, "default", 1, batch=batch, depth=15, vocab=32000, budget=64)
    ins = {n: to_torch(a, "cuda") for n, a in gen.inputs.items()}
    want = TREE_BUILD.reference("default", gen.inputs, gen.params)
    for ck in (2, 4, 8, 16):
        outs = poisoned_outputs(TREE_BUILD, "default", gen.inputs, gen.params)
        t = time_graph(lambda: TREE_BUILD.run_cuda("default", ins, gen.params, outs, kernel="tb_sorted",
                                                   defines={"TB_CK": ck}))
        assert_bit_exact(f"TB_CK={ck}", {n: to_numpy(v) for n, v in outs.items()}, want)
        res[f"B={batch} TB_CK={ck}"] = round(float(np.median(t)), 2)
        print(f"B={batch} TB_CK={ck}: {res[f'B={batch} TB_CK={ck}']} us (bit exact)", flush=True)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "tb_ck.json").write_text(json.dumps(res, indent=1))
