// verify_attn, variant fp32: MLA absorbed tree-verify attention, contiguous layout (ops.md §2).
//
// Launch (main): grid = (ceil(Q*H / 16), B, n_splits), block = 256, dynamic shared memory
//   FA_SMEM_BYTES (83,648 B: two blocks per SM).
//   verify_attn_fp32(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B], visibility u8 [B,Q,Q],
//                    B, Q, H, S, sm_scale, n_splits, out f32 [B,Q,H,512], lse f32 [B,Q,H],
//                    ws_o, ws_m, ws_l)
//   A block owns 16 consecutive (token, head) rows of one request (rows are request-major
//   i*H + h, contiguous in q and out) and one split of that request's keys: the split size is
//   ceil(kvlen / n_splits) rounded up to 16 keys, kvlen = prefix_len[b] + Q, computed per request
//   on the device. With n_splits == 1 the block writes out/lse; otherwise the partials
//   (attn_common.cuh) and verify_attn_fp32_merge (grid = B*Q*H, block = 128) finishes.
//
// Numerical contract: exact FP32 arithmetic on FFMA (no tensor cores, no TF32, no fast-math):
//   s_j = sm_scale * (q . k_j) accumulated in fp32 (576 products split into 8 partial sums of 72,
//   then added); online softmax with expf; out = (sum_j exp(s_j - m) v_j) / l, lse = m + logf(l),
//   natural log. Prefix keys are always visible, tree key j iff visibility[b, i, j]. kv rows at or
//   past prefix_len[b] + Q (NaN padding) are never read: their shared-memory rows are zero-filled by
//   cp.async with a 0-byte source, and masked keys get p = 0 exactly, so no NaN can leak.
//   Target: relative L2 <= 1e-6 against a float64 reference.
//
// Tiling per 16-key step (256 threads = 8 warps):
//   phase 1 (S = Q K^T, 16 x 16): warp w sums dims [72w, 72w + 72); lane owns rows {g, g+4, g+8,
//     g+12} x keys {kg, kg+8} (g = lane / 8, kg = lane % 8), float4 shared loads conflict-free
//     thanks to the 580-float row stride; the 8 partial sums go through shared memory.
//   softmax: one thread per (row, key); row max / sum over 16 lanes by shuffles.
//   phase 2 (O += P V, 16 x 512): thread owns 16 rows x 4 columns for half of the keys (64 fp32
//     accumulators); the two key halves are added at the end.
#include "attn_common.cuh"

#define FA_ROWS 16
#define FA_KEYS 16
#define FA_THREADS 256
#define FA_STR 580                               // floats per shared row (576 + 4: no bank conflicts)
#define FA_SMEM_FLOATS (2 * FA_ROWS * FA_STR + 8 * FA_ROWS * FA_KEYS + FA_KEYS * FA_ROWS + 3 * FA_ROWS)
#define FA_SMEM_BYTES (FA_SMEM_FLOATS * 4)

extern "C" __global__ void __launch_bounds__(FA_THREADS, 2)
verify_attn_fp32(const float* __restrict__ q, const float* __restrict__ kv,
                 const int* __restrict__ prefix_len, const u8* __restrict__ visibility,
                 int B, int Q, int H, int S, float sm_scale, int n_splits,
                 float* __restrict__ out, float* __restrict__ lse,
                 float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(16) float smem_f[];
    float* sQ = smem_f;                                  // [16][580]
    float* sK = sQ + FA_ROWS * FA_STR;                   // [16][580]
    float* sPart = sK + FA_KEYS * FA_STR;                // [8 warps][16 rows][16 keys]
    float* sP = sPart + 8 * FA_ROWS * FA_KEYS;           // [16 keys][16 rows]
    float* sM = sP + FA_KEYS * FA_ROWS;                  // [16] running max
    float* sL = sM + FA_ROWS;                            // [16] running sum
    float* sAlpha = sL + FA_ROWS;                        // [16] rescale of this step

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int b = blockIdx.y, z = blockIdx.z;
    const int rows_req = Q * H;
    const int row0 = blockIdx.x * FA_ROWS;
    const int nrows = min(FA_ROWS, rows_req - row0);
    const int P = prefix_len[b];
    const int kvlen = P + Q;
    const int per_split = (kvlen + n_splits - 1) / n_splits;
    const int chunk = (per_split + FA_KEYS - 1) / FA_KEYS * FA_KEYS;
    const int kbeg = z * chunk;
    const int kend = min(kbeg + chunk, kvlen);
    const size_t grow0 = (size_t)b * rows_req + row0;     // global row of the tile's row 0
    const float* qb = q + grow0 * ATTN_D;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const u8* vis_b = visibility + (size_t)b * Q * Q;

    for (int e = tid; e < FA_ROWS * (ATTN_D / 4); e += FA_THREADS) {
        const int r = e / (ATTN_D / 4), c4 = e - r * (ATTN_D / 4);
        const bool ok = r < nrows;
        cp_async16(sQ + r * FA_STR + c4 * 4, qb + (size_t)(ok ? r : 0) * ATTN_D + c4 * 4, ok);
    }
    cp_async_commit();
    if (tid < FA_ROWS) { sM[tid] = neg_inf(); sL[tid] = 0.f; }

    float o[FA_ROWS][4];
#pragma unroll
    for (int r = 0; r < FA_ROWS; ++r) { o[r][0] = o[r][1] = o[r][2] = o[r][3] = 0.f; }
    const int cg = tid & 127, kh = tid >> 7;              // phase 2: columns 4cg.., key half

    for (int key0 = kbeg; key0 < kend; key0 += FA_KEYS) {
        __syncthreads();                                  // previous step done with sK and sP
        for (int e = tid; e < FA_KEYS * (ATTN_D / 4); e += FA_THREADS) {
            const int c = e / (ATTN_D / 4), c4 = e - c * (ATTN_D / 4);
            const int j = key0 + c;
            const bool ok = j < kend;
            cp_async16(sK + c * FA_STR + c4 * 4, kvb + (size_t)(ok ? j : 0) * ATTN_D + c4 * 4, ok);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        {   // phase 1: partial dots over this warp's 72 dims
            const int g = lane >> 3, kg = lane & 7;
            const int kbase = warp * 72;
            float acc[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) { acc[i][0] = 0.f; acc[i][1] = 0.f; }
#pragma unroll 6
            for (int kk = 0; kk < 18; ++kk) {
                const int k = kbase + kk * 4;
                float4 qv[4], kv4[2];
#pragma unroll
                for (int i = 0; i < 4; ++i) qv[i] = *(const float4*)(sQ + (g + 4 * i) * FA_STR + k);
#pragma unroll
                for (int j = 0; j < 2; ++j) kv4[j] = *(const float4*)(sK + (kg + 8 * j) * FA_STR + k);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        acc[i][j] = fmaf(qv[i].x, kv4[j].x, acc[i][j]);
                        acc[i][j] = fmaf(qv[i].y, kv4[j].y, acc[i][j]);
                        acc[i][j] = fmaf(qv[i].z, kv4[j].z, acc[i][j]);
                        acc[i][j] = fmaf(qv[i].w, kv4[j].w, acc[i][j]);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    sPart[(warp * FA_ROWS + g + 4 * i) * FA_KEYS + kg + 8 * j] = acc[i][j];
        }
        __syncthreads();

        {   // softmax: thread (r, c)
            const int r = tid >> 4, c = tid & 15;
            float dot = 0.f;
#pragma unroll
            for (int w = 0; w < 8; ++w) dot += sPart[(w * FA_ROWS + r) * FA_KEYS + c];
            const int j = key0 + c;
            bool ok = r < nrows && j < kend;
            if (ok && j >= P) {
                const int i_tok = (row0 + r) / H;
                ok = vis_b[(size_t)i_tok * Q + (j - P)] != 0;
            }
            const float sv = ok ? sm_scale * dot : neg_inf();
            float mx = sv;
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_old = sM[r];
            const float m_new = fmaxf(m_old, mx);
            const float p = ok ? expf(sv - m_new) : 0.f;          // ok => m_new finite
            const float alpha = (m_new == neg_inf()) ? 1.f : expf(m_old - m_new);
            float ps = p;
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            sP[c * FA_ROWS + r] = p;
            if (c == 0) {
                sM[r] = m_new;
                sL[r] = sL[r] * alpha + ps;
                sAlpha[r] = alpha;
            }
        }
        __syncthreads();

        {   // phase 2: O = alpha * O + P V over this thread's key half
            float al[FA_ROWS];
#pragma unroll
            for (int r4 = 0; r4 < FA_ROWS / 4; ++r4) {
                const float4 a = *(const float4*)(sAlpha + 4 * r4);
                al[4 * r4] = a.x; al[4 * r4 + 1] = a.y; al[4 * r4 + 2] = a.z; al[4 * r4 + 3] = a.w;
            }
#pragma unroll
            for (int r = 0; r < FA_ROWS; ++r) {
                o[r][0] *= al[r]; o[r][1] *= al[r]; o[r][2] *= al[r]; o[r][3] *= al[r];
            }
#pragma unroll 1
            for (int cc = 0; cc < FA_KEYS / 2; ++cc) {
                const int c = kh * (FA_KEYS / 2) + cc;
                const float4 v = *(const float4*)(sK + c * FA_STR + cg * 4);
                float pr[FA_ROWS];
#pragma unroll
                for (int r4 = 0; r4 < FA_ROWS / 4; ++r4) {
                    const float4 pp = *(const float4*)(sP + c * FA_ROWS + 4 * r4);
                    pr[4 * r4] = pp.x; pr[4 * r4 + 1] = pp.y; pr[4 * r4 + 2] = pp.z; pr[4 * r4 + 3] = pp.w;
                }
#pragma unroll
                for (int r = 0; r < FA_ROWS; ++r) {
                    o[r][0] = fmaf(pr[r], v.x, o[r][0]);
                    o[r][1] = fmaf(pr[r], v.y, o[r][1]);
                    o[r][2] = fmaf(pr[r], v.z, o[r][2]);
                    o[r][3] = fmaf(pr[r], v.w, o[r][3]);
                }
            }
        }
    }
    cp_async_wait<0>();                                   // an empty split still waits for its Q copy
    __syncthreads();

    // add the two key halves (sQ is free now: 16 x 512 floats fit in it)
    float* sRed = sQ;
    if (kh == 1) {
#pragma unroll
        for (int r = 0; r < FA_ROWS; ++r)
            *(float4*)(sRed + r * ATTN_DV + cg * 4) = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
    }
    __syncthreads();
    const size_t rows_total = (size_t)B * rows_req;
    if (kh == 0) {
#pragma unroll
        for (int r = 0; r < FA_ROWS; ++r) {
            if (r < nrows) {
                const float4 h = *(const float4*)(sRed + r * ATTN_DV + cg * 4);
                float4 v = make_float4(o[r][0] + h.x, o[r][1] + h.y, o[r][2] + h.z, o[r][3] + h.w);
                const size_t grow = grow0 + r;
                if (n_splits == 1) {
                    const float l = sL[r];
                    v.x = v.x / l; v.y = v.y / l; v.z = v.z / l; v.w = v.w / l;
                    *(float4*)(out + grow * ATTN_DV + cg * 4) = v;
                } else {
                    *(float4*)(ws_o + ((size_t)z * rows_total + grow) * ATTN_DV + cg * 4) = v;
                }
            }
        }
    }
    if (tid < nrows) {
        const size_t grow = grow0 + tid;
        if (n_splits == 1) {
            lse[grow] = sM[tid] + logf(sL[tid]);
        } else {
            ws_m[(size_t)z * rows_total + grow] = sM[tid];
            ws_l[(size_t)z * rows_total + grow] = sL[tid];
        }
    }
}

struct StoreF32 {
    float* out;
    __device__ void operator()(size_t at, float a, float b, float c, float d) const {
        *(float4*)(out + at) = make_float4(a, b, c, d);
    }
};

// grid = B*Q*H rows, block = MERGE_THREADS (128)
extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
verify_attn_fp32_merge(const float* __restrict__ ws_o, const float* __restrict__ ws_m,
                       const float* __restrict__ ws_l, int n_splits, int rows,
                       float* __restrict__ out, float* __restrict__ lse) {
    merge_row(ws_o, ws_m, ws_l, n_splits, rows, lse, StoreF32{out});
}
