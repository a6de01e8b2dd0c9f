// verify_attn, variant fp32: MLA absorbed tree-verify attention, contiguous layout (ops.md §2).
//
// Launch (main): grid = (ceil(Q*H / 32), B, n_splits), block = 512, dynamic shared memory
//   FA_SMEM_BYTES (183,680 B: opt-in; one block per SM).
//   verify_attn_fp32(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B], visibility u8 [B,Q,Q],
//                    B, Q, H, S, sm_scale, n_splits, out f32 [B,Q,H,512], lse f32 [B,Q,H],
//                    ws_o, ws_m, ws_l)
//   A block owns 32 consecutive (token, head) rows of one request (rows are request-major
//   i*H + h, contiguous in q and out) and one split of that request's keys: the split size is
//   ceil(kvlen / n_splits) rounded up to 16 keys, kvlen = prefix_len[b] + Q, computed per request
//   on the device. With n_splits == 1 the block writes out/lse; otherwise the partials
//   (attn_common.cuh) and verify_attn_fp32_merge (grid = B*Q*H, block = 128) finishes.
//
// Numerical contract: exact FP32 arithmetic on FFMA (no tensor cores, no TF32, no fast-math):
//   s_j = sm_scale * (q . k_j) accumulated in fp32 (576 products as 16 partial sums of 36, then
//   added); online softmax with expf; out = (sum_j exp(s_j - m) v_j) / l, lse = m + logf(l),
//   natural log. Prefix keys are always visible, tree key j iff visibility[b, i, j]. kv rows at or
//   past prefix_len[b] + Q (NaN padding) are never read: their shared-memory rows are zero-filled by
//   cp.async with a 0-byte source, and masked keys get p = 0 exactly, so no NaN can leak.
//   Target: relative L2 <= 1e-6 against a float64 reference.
//
// Tiling per 16-key step (512 threads = 16 warps; K tiles double-buffered with cp.async, the next
// tile's copy overlapping this tile's math):
//   phase 1 (S = Q K^T, 32 x 16): warp w sums dims [36w, 36w + 36); lane owns rows {g + 8i} x
//     keys {kg + 4j} (g = lane / 4, kg = lane % 4; 4 x 4 per lane); float4 shared loads are
//     conflict-free thanks to the 580-float row stride; the 16 partial sums per score go through
//     shared memory.
//   softmax: one thread per (row, key); row max / sum over 16 lanes by shuffles.
//   phase 2 (O += P V, 32 x 512): thread owns 8 rows x 8 columns (columns 4c.. and 256 + 4c..) for
//     one half of the keys (64 fp32 accumulators); the key halves are added at the end.
// Measured on an H200 (B=1 H=16 Q=17 P=2048, CUDA-graph replay, clocks warmed): 65.3 us with the
// merge (14 splits, 117 blocks of ~10 key tiles), 19 TFLOP/s, short of the 35 us target. A block
// spends ~5 us per 16-key tile whatever the split count (4 splits: 180 us); without the phase-1
// FMAs 46.6 us, without the phase-2 FMAs 51.6 us: phase 1 runs at ~61% of the FFMA rate, phase 2
// at ~74%, and ~1.7 us per tile (softmax, three barriers, the tile wait) plus ~15 us fixed (Q
// load, merge, launch) is overhead that one block per SM cannot hide. kernels/NOTES.md.
// FA_DIAG (timing only, wrong results): 1 drops the phase-1 FMAs, 2 the phase-2 FMAs.
#include "attn_common.cuh"

#define FA_ROWS 32
#define FA_KEYS 16
#define FA_THREADS 512
#define FA_STR 580                               // floats per shared row (576 + 4: no bank conflicts)
#define FA_SLICES 16
#define FA_SMEM_FLOATS (FA_ROWS * FA_STR + 2 * FA_KEYS * FA_STR + FA_SLICES * FA_ROWS * FA_KEYS \
                        + FA_KEYS * FA_ROWS + 3 * FA_ROWS)
#define FA_SMEM_BYTES (FA_SMEM_FLOATS * 4)
// Timing diagnostics only (wrong results): 1 = no phase-1 FMAs, 2 = no phase-2 FMAs.
#ifndef FA_DIAG
#define FA_DIAG 0
#endif

extern "C" __global__ void __launch_bounds__(FA_THREADS, 1)
verify_attn_fp32(const float* __restrict__ q, const float* __restrict__ kv,
                 const int* __restrict__ prefix_len, const u8* __restrict__ visibility,
                 int B, int Q, int H, int S, float sm_scale, int n_splits,
                 float* __restrict__ out, float* __restrict__ lse,
                 float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(16) float smem_f[];
    float* sQ = smem_f;                                  // [32][580]
    float* sK = sQ + FA_ROWS * FA_STR;                   // [2][16][580]
    float* sPart = sK + 2 * FA_KEYS * FA_STR;            // [16 slices][32 rows][16 keys]
    float* sP = sPart + FA_SLICES * FA_ROWS * FA_KEYS;   // [16 keys][32 rows]
    float* sM = sP + FA_KEYS * FA_ROWS;                  // [32] running max
    float* sL = sM + FA_ROWS;                            // [32] running sum
    float* sAlpha = sL + FA_ROWS;                        // [32] rescale of this step

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
    const int ntiles = kend > kbeg ? (kend - kbeg + FA_KEYS - 1) / FA_KEYS : 0;
    const size_t grow0 = (size_t)b * rows_req + row0;     // global row of the tile's row 0
    const float* qb = q + grow0 * ATTN_D;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const u8* vis_b = visibility + (size_t)b * Q * Q;

    auto load_tile = [&](int buf, int key0) {          // 16 keys x 144 float4 = 4.5 per thread
        for (int e = tid; e < FA_KEYS * (ATTN_D / 4); e += FA_THREADS) {
            const int c = e / (ATTN_D / 4), c4 = e - c * (ATTN_D / 4);
            const int j = key0 + c;
            const bool ok = j < kend;
            cp_async16(sK + (buf * FA_KEYS + c) * FA_STR + c4 * 4, kvb + (size_t)(ok ? j : 0) * ATTN_D + c4 * 4, ok);
        }
    };
    for (int e = tid; e < FA_ROWS * (ATTN_D / 4); e += FA_THREADS) {
        const int r = e / (ATTN_D / 4), c4 = e - r * (ATTN_D / 4);
        const bool ok = r < nrows;
        cp_async16(sQ + r * FA_STR + c4 * 4, qb + (size_t)(ok ? r : 0) * ATTN_D + c4 * 4, ok);
    }
    if (ntiles > 0) load_tile(0, kbeg);
    cp_async_commit();
    if (tid < FA_ROWS) { sM[tid] = neg_inf(); sL[tid] = 0.f; }

    // phase 2: columns 4cq.. and 256 + 4cq.., rows 8rq.., keys 8kh..
    const int cq = tid & 63, rq = (tid >> 6) & 3, kh = tid >> 8;
    float o[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int x = 0; x < 8; ++x) o[r][x] = 0.f;

    for (int it = 0; it < ntiles; ++it) {
        const int key0 = kbeg + it * FA_KEYS;
        cp_async_wait<0>();                               // tile `it` landed
        __syncthreads();                                  // for everyone; step it-1 fully done
        if (it + 1 < ntiles) load_tile((it + 1) & 1, key0 + FA_KEYS);
        cp_async_commit();
        const float* Kt = sK + (it & 1) * FA_KEYS * FA_STR;

        {   // phase 1: partial dots over this warp's 36 dims, 32 rows x 16 keys
            const int slice = warp;
            const int g = lane >> 2, kg = lane & 3;
            const int kbase = slice * 36;
            const float* qrow = sQ + g * FA_STR + kbase;
            const float* krow = Kt + kg * FA_STR + kbase;
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) { acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f; }
#if FA_DIAG != 1
#pragma unroll
            for (int kk = 0; kk < 9; ++kk) {
                float4 qv[4], kv4[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) qv[i] = *(const float4*)(qrow + 8 * i * FA_STR + kk * 4);
#pragma unroll
                for (int j = 0; j < 4; ++j) kv4[j] = *(const float4*)(krow + 4 * j * FA_STR + kk * 4);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        acc[i][j] = fmaf(qv[i].x, kv4[j].x, acc[i][j]);
                        acc[i][j] = fmaf(qv[i].y, kv4[j].y, acc[i][j]);
                        acc[i][j] = fmaf(qv[i].z, kv4[j].z, acc[i][j]);
                        acc[i][j] = fmaf(qv[i].w, kv4[j].w, acc[i][j]);
                    }
                }
            }
#endif
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    sPart[(slice * FA_ROWS + g + 8 * i) * FA_KEYS + kg + 4 * j] = acc[i][j];
        }
        __syncthreads();

        {   // softmax: thread (r, c)
            const int r = tid >> 4, c = tid & 15;
            float dot = 0.f;
#pragma unroll
            for (int w = 0; w < FA_SLICES; ++w) dot += sPart[(w * FA_ROWS + r) * FA_KEYS + c];
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
            __syncwarp();                 // every lane's read of sM[r] above precedes lane c == 0's write
            if (c == 0) {
                sM[r] = m_new;
                sL[r] = sL[r] * alpha + ps;
                sAlpha[r] = alpha;
            }
        }
        __syncthreads();

        {   // phase 2: O = alpha * O + P V for rows 8rq.., columns 4cq.. and 256 + 4cq.., keys 8kh..
            const float4 a0 = *(const float4*)(sAlpha + 8 * rq), a1 = *(const float4*)(sAlpha + 8 * rq + 4);
            const float al[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int x = 0; x < 8; ++x) o[r][x] *= al[r];
#if FA_DIAG != 2
#pragma unroll 2
            for (int cc = 0; cc < FA_KEYS / 2; ++cc) {
                const int c = kh * (FA_KEYS / 2) + cc;
                const float4 v0 = *(const float4*)(Kt + c * FA_STR + cq * 4);
                const float4 v1 = *(const float4*)(Kt + c * FA_STR + 256 + cq * 4);
                const float4 p0 = *(const float4*)(sP + c * FA_ROWS + 8 * rq);
                const float4 p1 = *(const float4*)(sP + c * FA_ROWS + 8 * rq + 4);
                const float pr[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
                const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                for (int r = 0; r < 8; ++r)
#pragma unroll
                    for (int x = 0; x < 8; ++x) o[r][x] = fmaf(pr[r], v[x], o[r][x]);
            }
#endif
        }
    }
    cp_async_wait<0>();                                   // an empty split still waits for its Q copy
    __syncthreads();

    // add the two key halves (sQ is free now: 32 x 512 floats fit in it)
    float* sRed = sQ;
    if (kh == 1) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            *(float4*)(sRed + (8 * rq + i) * ATTN_DV + cq * 4) = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
            *(float4*)(sRed + (8 * rq + i) * ATTN_DV + 256 + cq * 4) = make_float4(o[i][4], o[i][5], o[i][6], o[i][7]);
        }
    }
    __syncthreads();
    const size_t rows_total = (size_t)B * rows_req;
    if (kh == 0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int r = 8 * rq + i;
            if (r < nrows) {
                const size_t grow = grow0 + r;
                float* dst = n_splits == 1 ? out + grow * ATTN_DV : ws_o + ((size_t)z * rows_total + grow) * ATTN_DV;
                const float l = n_splits == 1 ? sL[r] : 1.f;
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int col = h2 * 256 + cq * 4;
                    const float4 other = *(const float4*)(sRed + r * ATTN_DV + col);
                    float4 v = make_float4(o[i][4 * h2] + other.x, o[i][4 * h2 + 1] + other.y,
                                           o[i][4 * h2 + 2] + other.z, o[i][4 * h2 + 3] + other.w);
                    if (n_splits == 1) { v.x = v.x / l; v.y = v.y / l; v.z = v.z / l; v.w = v.w / l; }
                    *(float4*)(dst + col) = v;
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

ATTN_MERGE_ENTRY(verify_attn_fp32_merge, float, StoreF32)
