"""tree_build's CUDA binding: the kernel registry (kernels/README.md is its table), the shared memory
each kernel lays out, the launch's choice of kernel and the launch, one 256-thread block per request."""

from __future__ import annotations

import math
from ctypes import c_int

from ...runtime.device import get_kernel, max_shared_optin
from ..base import CudaKernel, Gpu

SHARED_MEMORY_LIMIT = 227 * 1024   # bytes of shared memory one block may opt in to on sm_90
REGISTER_BUDGET_MAX = 512          # register-candidate kernels: 32 lanes x 16 slots >= budget

KERNELS = (
    CudaKernel(op="tree_build", variant="default", name="sorted", role="default", threads=256,
               serves=f"budget <= {REGISTER_BUDGET_MAX} where its log-prob table fits shared memory "
                      "(every production shape)"),
    CudaKernel(op="tree_build", variant="default", name="warp", role="fallback", threads=256,
               serves=f"budget <= {REGISTER_BUDGET_MAX} where sorted's log-prob table does not fit "
                      "(deep trees with a large K)"),
    CudaKernel(op="tree_build", variant="default", name="smem", role="fallback", threads=256,
               serves=f"budget > {REGISTER_BUDGET_MAX} (more candidates than the register kernels hold)"),
)


def _up16(n: int) -> int:
    return -(-n // 16) * 16


def kernel_shared_bytes(budget: int, depth: int) -> int:
    """Shared memory of the tree_build kernels before staging, as carve() in tree_build_common.cuh
    lays it out: candidates + nodes (40 B per node) and each node's rank path (2 B per depth)."""
    q = budget + 1
    return q * 40 + _up16(q * (depth + 1) * 2)


def sorted_shared_bytes(budget: int, depth: int, k: int) -> int:
    """Shared memory of the sorted kernel (tree_build_sorted.cu): the log-prob table as doubles,
    (L + 2) rows of Kc + 1 (an -inf column and two -inf rows: row L holds the child of a depth-L
    node, row L + 1 is that child's child row, which the pop reads when the child becomes the head
    of an empty list), the token ids [L][Kc], the node records (16 B per node)
    and each node's ancestor-or-self bit mask (ceil(Q / 32) words per node)."""
    q = budget + 1
    kc = min(k, q)
    return (_up16((depth + 2) * (kc + 1) * 8) + _up16(depth * kc * 4) + 16 * q
            + _up16(q * (-(-q // 32)) * 4))


STATIC_SHARED_BYTES = 64      # the kernels' static shared memory (s_num_nodes), with room to spare


def least_shared_bytes(name: str, budget: int, depth: int, k: int) -> int:
    """The shared memory the kernel `name` needs at least for this shape (with its static part),
    which a GPU must allow per block to run it: sorted's log-prob table, or warp's and smem's
    nodes without the staged log-probs."""
    if name == "sorted":
        return sorted_shared_bytes(budget, depth, k) + STATIC_SHARED_BYTES
    return kernel_shared_bytes(budget, depth) + STATIC_SHARED_BYTES


def check_kernel_limits(budget: int, depth: int) -> None:
    """Refuse up front what the kernels cannot hold, naming the limit."""
    need = kernel_shared_bytes(budget, depth)
    if need > SHARED_MEMORY_LIMIT:
        raise ValueError(f"budget {budget} at depth {depth} needs {need} B of shared memory; the tree_build "
                         f"kernel has {SHARED_MEMORY_LIMIT} B on sm_90 (lower the budget or the depth)")


def choose(inputs, params, gpu: Gpu | None) -> str:
    """The sorted register list up to REGISTER_BUDGET_MAX where its log-prob table fits shared
    memory (1.8x warp at budget 64 on an H200, kernels/NOTES.md), else warp; smem beyond."""
    budget = int(params["budget"])
    if budget > REGISTER_BUDGET_MAX:
        return "smem"
    _, depth, k = inputs["topk_logp"].shape
    gpu = gpu or Gpu.here()
    return "sorted" if least_shared_bytes("sorted", budget, depth, k) <= gpu.smem_optin else "warp"


def run_cuda(op, variant, inputs, params, outputs, kernel=None, defines=None) -> None:
    """`kernel` names an entry of KERNELS (default: the op's kernel_choice); `defines` are extra
    compile-time defines (sorted's TB_FORCE_EXACT, its timing diagnostic TB_PROFILE, which gives
    wrong outputs)."""
    defines = defines or {}
    lp = inputs["topk_logp"]
    batch, depth, k = lp.shape
    budget = int(params["budget"])
    name = kernel or op.kernel_choice(variant, inputs, params)
    entry = op.cuda_kernel(name, variant)
    if name != "smem" and budget > REGISTER_BUDGET_MAX:
        raise ValueError(f"{name} holds at most {REGISTER_BUDGET_MAX} candidates; budget {budget}")
    q = budget + 1
    check_kernel_limits(budget, depth)
    args = [lp, inputs["topk_ids"], inputs["root_token"], inputs["start"],
            c_int(batch), c_int(depth), c_int(k), c_int(budget)]
    args_out = [outputs[n] for n in ("tokens", "parents", "depths", "positions", "ranks",
                                     "scores", "visibility", "num_nodes")]
    slots = max(1, math.ceil(budget / 32))
    limit = max_shared_optin()
    if name == "sorted":         # 32 x per_lane >= budget slots; the log-prob table must fit
        smem = sorted_shared_bytes(budget, depth, k)
        if smem + STATIC_SHARED_BYTES > limit:
            raise ValueError(f"sorted needs {smem} B of shared memory at budget {budget}, depth "
                             f"{depth}, K {k}; the device has {limit} B")
        get_kernel(entry.source, entry.entry, defines={"TB_NPL": slots, **defines}).launch(
            batch, entry.threads, args + args_out, shared_mem=smem)
        return
    smem = kernel_shared_bytes(budget, depth)
    staged_bytes = 2 * _up16(depth * min(k, q) * 4)          # the log-probs, when they fit
    staged = smem + staged_bytes + STATIC_SHARED_BYTES <= limit
    smem += staged_bytes if staged else 0
    args += [c_int(int(staged))] + args_out
    if name == "warp":           # capacity 32 x per_lane >= budget (slots in use <= budget): 1..16
        defines = {"TB_NPL": 1 << (slots - 1).bit_length(), **defines}
    get_kernel(entry.source, entry.entry, defines=defines).launch(batch, entry.threads, args, shared_mem=smem)
