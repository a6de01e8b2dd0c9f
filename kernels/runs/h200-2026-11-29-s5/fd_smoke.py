"""fp32_dmma on small cases, errors broken down (lse: scores / softmax; out per 64-column block: P.V),
at 1 and 3 forced splits and the default; NaN counts say whether a row or block was never written."""
import numpy as np
from tests.test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, generated, run_attn

for kw in (dict(batch=2, heads=8, prefix=300, budget=8), dict(batch=1, heads=16, prefix=2048, budget=16)):
    for splits in (1, 3, None):
        gen = generated(VERIFY_ATTN, "fp32", FRESH_SEED, **kw)
        want = VERIFY_ATTN.reference("fp32", gen.inputs, gen.params)
        got = run_attn("fp32", gen.inputs, gen.params, "fp32_dmma", splits=splits)
        out, ref = got["out"].astype(np.float64), want["out"].astype(np.float64)
        blocks = [float(np.linalg.norm(out[..., c:c + 64] - ref[..., c:c + 64]) / np.linalg.norm(ref[..., c:c + 64]))
                  for c in range(0, 512, 64)]
        lse = float(np.nanmax(np.abs(got["lse"].astype(np.float64) - want["lse"])))
        rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        print(f"{kw} splits={splits}: rel_l2 {rel:.2e} lse_max_err {lse:.2e} nan_out {int(np.isnan(out).sum())} "
              f"nan_lse {int(np.isnan(got['lse']).sum())} blocks {' '.join(f'{b:.1e}' for b in blocks)}", flush=True)
