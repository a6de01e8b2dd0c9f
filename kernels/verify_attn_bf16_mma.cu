// verify_attn, variant bf16_paged, kernel `bf16_mma`: SGLang's target-verify layout, page size 1
// (docs/ops/verify_attn.md), on mma.sync: the launch picks it on GPUs other than sm_90 with 166,208 B
// of shared memory a block (A100, B200; on sm_90 verify_attn_bf16_wgmma2.cu runs; kernels/README.md).
//
// Launch (main): grid = (ceil(Q*H / 64), B, n_splits), block = 256 (8 warps), dynamic shared
//   memory 166,144 B (opt-in above 48 KB; one block per SM).
//   verify_attn_bf16_mma(q bf16 [B*Q,H,576], kv_buffer bf16 [N,576], kv_indptr i32 [B+1],
//                        kv_indices i32 [*], tree_slots i32 [B*Q], custom_mask u8 [*],
//                        mask_indptr i32 [B+1], B, Q, H, sm_scale_log2 (= sm_scale*log2 e),
//                        n_splits, out bf16 [B*Q,H,512], lse f32 [B*Q,H], ws_o, ws_m, ws_l)
//   A block owns 64 consecutive (token, head) rows of one request and one split of the request's
//   keys, walked 32 keys a step (ceil(kvlen / n_splits) rounded up to 32). n_splits == 1 writes
//   out/lse directly; otherwise verify_attn_bf16_mma_merge (grid = B*Q*H, block = 128) finishes.
//   The block is attn_bf16_mma.cuh's bf16_mma_block<64, 32> (its header: keys, warp roles, shared
//   memory): Q [64][584] + a two-stage K/V ring [2][32][584] bf16 (149,504 B), S partials 16,384 B,
//   slot indices 256 B.
//
// Numerical contract: bf16 inputs, fp32 accumulation on tensor cores (mma.sync m16n8k16 bf16);
//   scores in the log2 domain (s * sm_scale * log2 e), online softmax with exp2f, one step per 32
//   keys; the weights p are rounded to bf16 for the P.V product (as FlashAttention / SGLang's
//   Triton kernel do) while the row sum l adds the fp32 weights; out = bf16_rn(O / l),
//   lse = ln 2 * (m + log2 l) (natural log).
#include "attn_bf16_mma.cuh"

extern "C" __global__ void __launch_bounds__(BF16_MMA_THREADS(64), 1)
verify_attn_bf16_mma(ATTN_BF16_PAGED_PARAMS) {
    bf16_mma_block<64, 32>(BF16_MMA_ARGS);
}

ATTN_MERGE_ENTRY(verify_attn_bf16_mma_merge, u16, StoreBF16)
