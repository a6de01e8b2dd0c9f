"""Call 7: s5's fd_ab.py with fp32_bf16x3 entries for FX_SW = 6 (six score warps: 480 threads, a
larger sS) registered first, since the host's CUDA_KERNELS entry fixes threads and shared memory."""
import runpy
from pathlib import Path
from tests.test_cuda_kernels import VERIFY_ATTN

k = VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3"]
VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3_sw6"] = k._replace(threads=(6 + 9) * 32, smem=k.smem + 2 * 2 * 16 * 16 * 4)
runpy.run_path(str(Path(__file__).parents[1] / "h200-2026-11-29-s5" / "fd_ab.py"), run_name="__main__")
