"""Session 7: s5's fd_ab.py (one process, CUDA-graph replay, outputs poisoned then checked against float64)
with an unclustered fp32_bf16x3 entry (cluster=1, run with FX_CLUSTER=1) registered first, since the
host's CUDA_KERNELS entry fixes the cluster size. (Call 5 used this file with an FX_SKH entry.)"""
import runpy
from pathlib import Path
from tests.test_cuda_kernels import VERIFY_ATTN

k = VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3"]
VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3_c1"] = k._replace(cluster=1)
runpy.run_path(str(Path(__file__).parents[1] / "h200-2026-11-29-s5" / "fd_ab.py"), run_name="__main__")
