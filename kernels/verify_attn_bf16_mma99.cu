// verify_attn, variant bf16_paged, kernel `bf16_mma99`: bf16_mma's block at 48-row x 16-key tiles,
// so that it fits the 101,376 B of shared memory a block of sm_120 / sm_121 (RTX PRO 6000
// Blackwell, RTX 50xx, DGX Spark), sm_89 (L40S, RTX 4090) and sm_86 (A10, RTX 3090): the launch
// picks it where bf16_mma does not fit (kernels/README.md). Not yet run on any GPU: compile-checked
// only (docs/gpus.md says how the next GPU session verifies it, on the H200 run as sm_120).
//
// Launch (main): grid = (ceil(Q*H / 48), B, n_splits), block = 192 (6 warps), dynamic shared
//   memory 99,712 B (opt-in above 48 KB; one block per SM on a 99 KB GPU, two on an H200).
//   verify_attn_bf16_mma99(q bf16 [B*Q,H,576], kv_buffer bf16 [N,576], kv_indptr i32 [B+1],
//                          kv_indices i32 [*], tree_slots i32 [B*Q], custom_mask u8 [*],
//                          mask_indptr i32 [B+1], B, Q, H, sm_scale_log2 (= sm_scale*log2 e),
//                          n_splits, out bf16 [B*Q,H,512], lse f32 [B*Q,H], ws_o, ws_m, ws_l)
//   A block owns 48 consecutive (token, head) rows of one request and one split of the request's
//   keys, walked 16 keys a step (ceil(kvlen / n_splits) rounded up to 16). n_splits == 1 writes
//   out/lse directly; otherwise verify_attn_bf16_mma99_merge (grid = B*Q*H, block = 128) finishes.
//   The block is attn_bf16_mma.cuh's bf16_mma_block<48, 16>, the same code as bf16_mma's: 3 row
//   groups (warps 0-2 and 3-5 pair up over the two 288-dim halves of S). Shared memory: Q
//   [48][584] + a two-stage K/V ring [2][16][584] bf16 (93,440 B), S partials 6,144 B, slot
//   indices 128 B.
//
// Numerical contract: bf16_mma's (bf16 inputs, fp32 accumulation on mma.sync m16n8k16, scores in
//   the log2 domain, online softmax with exp2f, P rounded to bf16 for P.V, the row sum l of the
//   fp32 weights, out = bf16_rn(O / l), lse = ln 2 * (m + log2 l), natural log); each score is the
//   same fp32 sum as bf16_mma's, the softmax steps every 16 keys instead of 32.
#include "attn_bf16_mma.cuh"

extern "C" __global__ void __launch_bounds__(BF16_MMA_THREADS(48), 1)
verify_attn_bf16_mma99(ATTN_BF16_PAGED_PARAMS) {
    bf16_mma_block<48, 16>(BF16_MMA_ARGS);
}

ATTN_MERGE_ENTRY(verify_attn_bf16_mma99_merge, u16, StoreBF16)
