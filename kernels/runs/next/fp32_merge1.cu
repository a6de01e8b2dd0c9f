// Queued experiment (not yet run on a GPU): fp32_gemm's split-KV merge in one round trip.
//
// Launch: grid = rows (B*Q*H), block = MERGE_THREADS (128); thread t owns output columns 4t..4t+3.
//   merge1(ws_o f32 [n_splits][rows][512], ws_m f32 [n_splits][rows], ws_l, n_splits, rows,
//          out f32 [rows][512], lse f32 [rows])
// Why: call2 of session 4 (kernels/runs/h200-2026-11-29-s4/fp32_fixed.py) timed the current merge
// (verify_attn_fp32_gemm_merge) alone at 8.7 us for 18.4 MB of partials at B=1 H=16 Q=17 P=2048: it
// loads m and l (one round trip, through shared memory), then the o rows in batches of 16 splits, each
// batch waiting on m (3 more round trips at 33 splits). Here every o load of a batch of M1_MAXZ splits
// (one batch at 33 splits) is issued first, unconditionally, then m and l, then the barrier: the o
// loads do not wait on anything. An empty split's o row is never written by the main kernel, so
// reading it is an uninitialised read (initcheck) though its weight is 0: before folding this into
// verify_attn_fp32_gemm.cu the main kernel must zero the o rows of its empty splits (none at the timing
// shape). Numerical contract: verify_attn_fp32_gemm_merge's arithmetic in its order (M the max over
// ascending z, then ascending z with empty splits skipped: w = expf(m - M), l += w l_z, acc += w o_z),
// so the outputs are bit-identical to it; fp32_merge1.py asserts that.
#include "attn_common.cuh"

#ifndef M1_MAXZ
#define M1_MAXZ 36                   // splits whose o loads are in flight at once
#endif

extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
merge1(const float* __restrict__ ws_o, const float* __restrict__ ws_m, const float* __restrict__ ws_l,
       int n_splits, int rows, float* __restrict__ out, float* __restrict__ lse) {
    __shared__ float s_m[256], s_l[256];
    const int row = blockIdx.x;
    if (row >= rows || n_splits > 256) return;            // the caller keeps the current merge past 256
    const int col = threadIdx.x * 4;
    float4 oz[M1_MAXZ];
#pragma unroll
    for (int k = 0; k < M1_MAXZ; ++k)                     // first batch: issued before anything waits
        oz[k] = k < n_splits ? *(const float4*)(ws_o + ((size_t)k * rows + row) * ATTN_DV + col)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int z = threadIdx.x; z < n_splits; z += MERGE_THREADS) {
        s_m[z] = ws_m[(size_t)z * rows + row];
        s_l[z] = ws_l[(size_t)z * rows + row];
    }
    __syncthreads();
    float M = neg_inf();
    for (int z = 0; z < n_splits; ++z) M = fmaxf(M, s_m[z]);
    float l = 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int z0 = 0; z0 < n_splits; z0 += M1_MAXZ) {
        if (z0 > 0) {                                     // later batches (more than M1_MAXZ splits)
#pragma unroll
            for (int k = 0; k < M1_MAXZ; ++k) {
                const int zz = z0 + k;
                oz[k] = zz < n_splits ? *(const float4*)(ws_o + ((size_t)zz * rows + row) * ATTN_DV + col)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        merge_batch(oz, s_m, s_l, z0, n_splits, M, l, acc);
    }
    merge_finish(row, col, acc, l, M, lse, StoreF32{out});
}
