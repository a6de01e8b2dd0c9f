"""Call 11: fp32_bf16x3 v3 (kernels/runs/h200-2026-11-29-s6/fp32_bf16x3_v3.patch applied to v4) with its closing
384-thread named barrier replaced by an mbarrier (FIN: the 128 S threads arrive after writing sL and
the row statistics, the O threads wait), generated into FX_V3_DIR, registered as `fp32_bf16x3_v3fin`
(384 threads, 214,272 B) and then either timed with s5's fd_ab.py (argument `ab`) or run once at the
timing shape and at forced splits 1 / 3 on rows that are not a multiple of 16 (argument `once`, for
the sanitizers), each output poisoned and checked against float64. It ran at 87caf5e's parent, where
kernels/verify_attn_fp32_bf16x3.cu was v4 (39cdb12's); at later commits that file is already v3 + FIN,
so take 39cdb12's copy of it first."""
import os, runpy, subprocess, sys
from pathlib import Path

root = Path(__file__).resolve().parents[3]
work = Path(os.environ.get("FX_V3_DIR", "/tmp/fx_v3fin"))
(work / "kernels").mkdir(parents=True, exist_ok=True)
src = work / "kernels" / "verify_attn_fp32_bf16x3.cu"
src.write_text((root / "kernels" / "verify_attn_fp32_bf16x3.cu").read_text())
patch = str(root / "kernels/runs/h200-2026-11-29-s6/fp32_bf16x3_v3.patch")
if subprocess.run(["patch", "-s", "-p1", "-i", patch], cwd=work).returncode != 0:     # no `patch` there: git
    subprocess.run(["git", "apply", patch], cwd=work, check=True)
text = src.read_text()
edits = [
    ("    const unsigned mb_full = mb, mb_empty_s = mb + 16, mb_kp_full = mb + 32;",
     "    const unsigned mb_full = mb, mb_empty_s = mb + 16, mb_kp_full = mb + 32, mb_fin = mb + 48;"),
    ("            mbar_init(mb_kp_full, FX_OT); mbar_init(mb_kp_full + 8, FX_OT);",
     "            mbar_init(mb_kp_full, FX_OT); mbar_init(mb_kp_full + 8, FX_OT);\n            mbar_init(mb_fin, 32 * FX_SW);"),
    ("        __syncwarp();                                            // bar.sync is warp-aligned\n        named_barrier(3, FX_THREADS);\n        return;",
     "        mbar_arrive(mb_fin);\n        return;"),
    ("    __syncwarp();                                                // bar.sync is warp-aligned\n    named_barrier(3, FX_THREADS);                                // sL written",
     "    mbar_wait(mb_fin, 0);                                        // sL written"),
]
for old, new in edits:
    assert text.count(old) == 1, old
    text = text.replace(old, new)
src.write_text(text)

from tests.test_cuda_kernels import VERIFY_ATTN, attn_errors_vs_dense, generated, poisoned_outputs, to_torch  # noqa: E402

k = VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3"]
VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3_v3fin"] = k._replace(source=str(src), threads=384, smem=214272)
if sys.argv[1:] == ["ab"]:
    runpy.run_path(str(root / "kernels/runs/h200-2026-11-29-s5/fd_ab.py"), run_name="__main__")
else:
    import torch
    for batch, heads, prefix, budget, splits in ((1, 16, 2048, 16, None), (2, 5, 3000, 12, 1), (2, 5, 3000, 12, 3)):
        gen = generated(VERIFY_ATTN, "fp32", 2048444617, batch=batch, heads=heads, prefix=prefix, budget=budget,
                        prefix_mode="mixed")
        ins = {n: to_torch(a, "cuda") for n, a in gen.inputs.items()}
        outs = poisoned_outputs(VERIFY_ATTN, "fp32", gen.inputs, gen.params)
        VERIFY_ATTN.run_cuda("fp32", ins, gen.params, outs, kernel="fp32_bf16x3_v3fin", splits=splits)
        torch.cuda.synchronize()
        print(f"B={batch} H={heads} P={prefix} budget={budget} splits={splits}:",
              attn_errors_vs_dense("fp32", ins, gen.params, outs), flush=True)
