"""Session 8's A/B entries, registered in the host's CUDA_KERNELS (import this first):
  v6          session 7's kernel (v6.cu beside this file: 384 threads, the softmax in the O warps)
  v8          the kernel of commit 931e9a7 (v8.cu beside this file)
  cur         fp32_bf16x3 as the working tree has it (call 2: v8, call 3: v9; kernels/NOTES.md, "Session 8")
  cur_plain   the same launched without programmatic dependent launch
  cur_noqreg  the same built for plain sm_90 (no setmaxnreg: Q in shared memory, reloaded every sub-tile)
Call 2 named cur, cur_plain, cur_noqreg v8, v8_plain, v8_noqreg (call2.sh as run)."""
from pathlib import Path
from tests.test_cuda_kernels import VERIFY_ATTN

k = VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3"]
VERIFY_ATTN.CUDA_KERNELS.update(
    v6=k._replace(source=str(Path(__file__).resolve().with_name("v6.cu")), threads=384, smem=231128,
                  arch_feature="", dependent=False),
    v8=k._replace(source=str(Path(__file__).resolve().with_name("v8.cu")), smem=229552),
    cur=k, cur_plain=k._replace(dependent=False), cur_noqreg=k._replace(arch_feature=""))
