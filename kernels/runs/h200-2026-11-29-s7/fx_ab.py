"""Session 7: s5's fd_ab.py (one process, CUDA-graph replay, outputs poisoned then checked against float64)
with an fp32_bf16x3 entry for FX_SKH = 1 (four score warps over both n8 tiles: 384 threads) registered
first, since the host's CUDA_KERNELS entry fixes the thread count (FX_SKH = 2: 512)."""
import runpy
from pathlib import Path
from tests.test_cuda_kernels import VERIFY_ATTN

k = VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3"]
VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3_skh1"] = k._replace(threads=384)
runpy.run_path(str(Path(__file__).parents[1] / "h200-2026-11-29-s5" / "fd_ab.py"), run_name="__main__")
