"""Session 8's A/B entries, registered in the host's CUDA_KERNELS (import this first):
  v6          session 7's kernel (384 threads, the softmax in the O warps): the .cu of commit ccd7517
  v8          the .cu of commit 931e9a7
  cur         fp32_bf16x3 as the working tree has it (call 2: v8, call 3: v9; kernels/NOTES.md, "Session 8")
  cur_plain   the same launched without programmatic dependent launch
  cur_noqreg  the same built for plain sm_90 (no setmaxnreg: Q in shared memory, reloaded every sub-tile)
The old sources come out of git (`git show REV:path`) into the temp folder; their attn_common.cuh
include resolves to the tree's. Call 2 named cur, cur_plain, cur_noqreg v8, v8_plain, v8_noqreg
(call2.sh as run); the calls ran frozen copies of the two commits' files."""
import subprocess, tempfile
from pathlib import Path
from tests.test_cuda_kernels import VERIFY_ATTN

SOURCE = "kernels/verify_attn_fp32_bf16x3.cu"


def at_commit(rev: str) -> str:
    """Path of a temp copy of SOURCE as commit `rev` has it."""
    out = Path(tempfile.gettempdir()) / "kdtree-s8" / f"fx-{rev}.cu"    # a folder of its own: no header beside it
    if not out.exists():
        out.parent.mkdir(exist_ok=True)
        text = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[3]).stdout
        out.write_text(text)
    return str(out)


k = VERIFY_ATTN.CUDA_KERNELS["fp32_bf16x3"]
VERIFY_ATTN.CUDA_KERNELS.update(
    v6=k._replace(source=at_commit("ccd7517"), threads=384, smem=231128, arch_feature="", dependent=False),
    v8=k._replace(source=at_commit("931e9a7"), smem=229552),
    cur=k, cur_plain=k._replace(dependent=False), cur_noqreg=k._replace(arch_feature=""))
