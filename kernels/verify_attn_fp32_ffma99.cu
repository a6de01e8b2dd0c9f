// verify_attn, variant fp32, kernel `fp32_ffma99`: MLA absorbed tree-verify attention, contiguous layout
// (docs/ops/verify_attn.md), exact fp32 on the FMA units in 16-row x 8-key tiles, so that it fits the
// 101,376 B of shared memory a block of sm_120 / sm_121 (RTX PRO 6000 Blackwell, RTX 50xx, DGX Spark),
// sm_89 (L40S, RTX 4090) and sm_86 (A10, RTX 3090), and launches on A100 (sm_80), where the fp32
// tensor-core kernels do not (fp32_dmma: sm_90's m16n8k4 f64 MMA and 228,592 B; fp32_bf16x3: sm_90's
// bulk copies and 229,576 B). No special instruction but cp.async (sm_80): the same program on every
// GPU from sm_80 on. The launch picks it only where neither of those runs (kernels/README.md).
// Its structure is the retired fp32_ffma's (kernels/NOTES.md; verified on the H200 in its time) at
// smaller tiles. This kernel has run on the CPU emulator (tests/kernels/test_emulated_kernels.py), not
// yet on a GPU (docs/gpus.md).
//
// Launch (main): grid = (ceil(Q*H / 16), B, n_splits), block = FF_THREADS (256 = 8 warps), dynamic
//   shared memory FF_SMEM_BYTES (79,104 B: opt-in above 48 KB; the kernel traps with less). One block
//   an SM (its registers).
//   verify_attn_fp32_ffma99(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B],
//                           visibility u8 [B,Q,Q], B, Q, H, S, sm_scale, n_splits,
//                           out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   A block owns 16 consecutive (token, head) rows of one request (request-major i*H + h) and one
//   split of that request's keys: chunk = ceil(kvlen / n_splits) rounded up to 8 keys, kvlen =
//   prefix_len[b] + Q; split z has keys [min(z*chunk, kvlen), min(z*chunk + chunk, kvlen)) (possibly
//   empty: it writes m = -inf, l = 0). The split is walked in tiles of 8 keys, each copied with
//   cp.async into a two-slot ring one tile ahead (one __syncthreads a tile frees the slot). n_splits
//   == 1 writes out/lse; otherwise the partials of attn_common.cuh and verify_attn_fp32_ffma99_merge
//   (grid = B*Q*H, block = 128) finishes.
// Per tile, three phases between barriers:
//   scores: warp w sums dims [72w, 72w + 72) of all 16 x 8 scores; lane (g = lane / 4, kg = lane % 4)
//     rows g, g + 8 and keys kg, kg + 4, 18 float4 steps (the 580-float row stride puts the 8 rows'
//     16-byte loads in distinct bank quads); its 4 partial sums go to sPart[w][row][key].
//   softmax: threads 0..127, row tid / 8, key tid % 8; the row's max and sum over its 8 lanes.
//   P.V: thread (rq = tid / 64, cq = tid % 64) owns rows 4rq..4rq+3 and columns 4cq..+3 and
//     256 + 4cq..+3: the tile's 32 sums over its 8 keys (V = the tile's first 512 dims), then added
//     to O and its compensation (64 more accumulators: 156-167 registers, one block an SM).
//
// Numerical contract: exact FP32 arithmetic on FFMA (no tensor cores, no TF32, no fast-math):
//   s_j = fl(sm_scale * d_j), d_j = the 8 slice partials added in w order, each one fmaf chain over
//   its 72 dims in ascending order. Per 8-key tile one online softmax step: m_new = max(m_old,
//   max_j s_j), p_j = expf(s_j - m_new), alpha = expf(m_old - m_new) (1 while m_new is -inf).
//   Both running sums are compensated: l = alpha l + sum_j p_j (the 8 weights summed by xor-4, -2,
//   -1 shuffles) and O = alpha O + sum_j p_j v_j (one fmaf chain over the tile's keys in ascending
//   j) each add their tile's sum by TwoSum, carrying its exact rounding error in c (c = alpha c +
//   err), and use l + c, O + c at the end. Why: with one split a row's sums run over all its keys,
//   and a plain fp32 running sum of thousands of terms drifts ~u sqrt(terms): one fmaf chain over
//   the keys gave rel L2 1.9e-6 at P = 16k on the emulator (the contract: 1e-6), the compensated
//   sums 1.1e-7 (1.0e-7 at 32k). out = (O + c) / (l + c) (IEEE
//   division), lse = m + logf(l + c), natural log. Prefix keys are always visible, tree key j iff
//   visibility[b, i, j - prefix_len]. kv rows at or past prefix_len[b] + Q (NaN padding) and q rows
//   past the request's Q*H are never read (cp.async with a 0-byte source zero-fills them) and masked
//   keys get p = 0 exactly. Target: relative L2 <= 1e-6 against float64 (docs/ops/verify_attn.md).
//
// Shared memory (FF_SMEM_BYTES = 79,104 B):
//   sQ     [16 rows][580] fp32 (576 + 4 pad)                                            37,120
//   sK     [2 slots][8 keys][580] fp32                                                  37,120
//   sPart  [8 slices][16 rows][8 keys] fp32 score partials                               4,096
//   sP     [8 keys][16 rows] fp32 softmax weights                                          512
//   sM, sL, sC, sAlpha [16] fp32 each: running max, sum, its compensation, this tile's rescale 256
#include "attn_common.cuh"

#define FF_ROWS 16                               // rows per block
#define FF_KEYS 8                                // keys per tile
#define FF_THREADS 256
#define FF_WARPS (FF_THREADS / 32)               // score slices
#define FF_SLICE (ATTN_D / FF_WARPS)             // dims per slice (72)
#define FF_STR 580                               // floats per shared row (576 + 4: no bank conflicts)
#define FF_SMEM_FLOATS (FF_ROWS * FF_STR + 2 * FF_KEYS * FF_STR + FF_WARPS * FF_ROWS * FF_KEYS \
                        + FF_KEYS * FF_ROWS + 4 * FF_ROWS)
#define FF_SMEM_BYTES (FF_SMEM_FLOATS * 4)

#if FF_SLICE % 4 != 0 || FF_ROWS * FF_KEYS > FF_THREADS || FF_ROWS != 4 * (FF_THREADS / 64) || FF_KEYS != 8
#error "tiling: 8 slices of whole float4s, a softmax thread per score, 4 rows per P.V thread, 8-lane rows"
#endif
#if defined(FF_EXPECT_SMEM) && FF_EXPECT_SMEM != FF_SMEM_BYTES
#error "FF_SMEM_BYTES differs from the host's registry entry (kdtr/ops/verify_attn/cuda.py)"
#endif
#if defined(FF_EXPECT_THREADS) && FF_EXPECT_THREADS != FF_THREADS
#error "FF_THREADS differs from the host's registry entry (kdtr/ops/verify_attn/cuda.py)"
#endif

// s = fl(a + b) and its rounding error e = a + b - s, exactly (Knuth's TwoSum: no branch, no FMA)
__device__ __forceinline__ float two_sum(float a, float b, float& e) {
    const float s = __fadd_rn(a, b);
    const float bb = __fsub_rn(s, a);
    e = __fadd_rn(__fsub_rn(a, __fsub_rn(s, bb)), __fsub_rn(b, bb));
    return s;
}

extern "C" __global__ void __launch_bounds__(FF_THREADS, 1)
verify_attn_fp32_ffma99(ATTN_DENSE_PARAMS) {
    extern __shared__ __align__(16) float smem_f[];
    if (dynamic_smem_bytes() < FF_SMEM_BYTES) __trap();         // host and kernel disagree
    float* sQ = smem_f;                                          // [16][580]
    float* sK = sQ + FF_ROWS * FF_STR;                           // [2][8][580]
    float* sPart = sK + 2 * FF_KEYS * FF_STR;                    // [8 slices][16 rows][8 keys]
    float* sP = sPart + FF_WARPS * FF_ROWS * FF_KEYS;            // [8 keys][16 rows]
    float* sM = sP + FF_KEYS * FF_ROWS;                          // [16] running max
    float* sL = sM + FF_ROWS;                                    // [16] running sum
    float* sC = sL + FF_ROWS;                                    // [16] its compensation
    float* sAlpha = sC + FF_ROWS;                                // [16] rescale of this tile

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    ATTN_DENSE_REQUEST(FF_ROWS, FF_KEYS)
    const int ntiles = (kend - kbeg + FF_KEYS - 1) / FF_KEYS;
    const size_t grow0 = (size_t)b * rows_req + row0;           // global row of the tile's row 0
    const float* qb = q + grow0 * ATTN_D;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const u8* vis_b = visibility + (size_t)b * Q * Q;

    auto load_tile = [&](int slot, int key0) {                   // 8 keys x 144 float4: 4.5 a thread
        for (int e = tid; e < FF_KEYS * (ATTN_D / 4); e += FF_THREADS) {
            const int c = e / (ATTN_D / 4), c4 = e - c * (ATTN_D / 4);
            const int j = key0 + c;
            const bool ok = j < kend;
            cp_async16(sK + (slot * FF_KEYS + c) * FF_STR + c4 * 4, kvb + (size_t)(ok ? j : 0) * ATTN_D + c4 * 4, ok);
        }
    };
    for (int e = tid; e < FF_ROWS * (ATTN_D / 4); e += FF_THREADS) {
        const int r = e / (ATTN_D / 4), c4 = e - r * (ATTN_D / 4);
        const bool ok = r < nrows;
        cp_async16(sQ + r * FF_STR + c4 * 4, qb + (size_t)(ok ? r : 0) * ATTN_D + c4 * 4, ok);
    }
    if (ntiles > 0) load_tile(0, kbeg);
    cp_async_commit();
    if (tid < FF_ROWS) { sM[tid] = neg_inf(); sL[tid] = 0.f; sC[tid] = 0.f; }

    const int rq = tid >> 6, cq = tid & 63;                      // P.V: rows 4rq.., columns 4cq.., 256 + 4cq..
    float o[4][8], oc[4][8];                                     // O and its compensation
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int x = 0; x < 8; ++x) o[r][x] = oc[r][x] = 0.f;

    for (int it = 0; it < ntiles; ++it) {
        const int key0 = kbeg + it * FF_KEYS;
        cp_async_wait<0>();                                      // tile `it` (and Q) landed
        __syncthreads();                                         // ... for everyone; tile it-1 done
        if (it + 1 < ntiles) load_tile((it + 1) & 1, key0 + FF_KEYS);
        cp_async_commit();
        const float* Kt = sK + (it & 1) * FF_KEYS * FF_STR;

        {   // scores: partial dots over this warp's 72 dims, rows g, g+8 x keys kg, kg+4
            const int g = lane >> 2, kg = lane & 3;
            const float* qrow = sQ + g * FF_STR + warp * FF_SLICE;
            const float* krow = Kt + kg * FF_STR + warp * FF_SLICE;
            float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll 6
            for (int kk = 0; kk < FF_SLICE / 4; ++kk) {
                const float4 qv[2] = {*(const float4*)(qrow + kk * 4), *(const float4*)(qrow + 8 * FF_STR + kk * 4)};
                const float4 kv4[2] = {*(const float4*)(krow + kk * 4), *(const float4*)(krow + 4 * FF_STR + kk * 4)};
#pragma unroll
                for (int i = 0; i < 2; ++i) {
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
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    sPart[(warp * FF_ROWS + g + 8 * i) * FF_KEYS + kg + 4 * j] = acc[i][j];
        }
        __syncthreads();

        if (tid < FF_ROWS * FF_KEYS) {   // softmax: thread (r, c); warps 0..3, a row's 8 lanes in one warp
            const int r = tid >> 3, c = tid & 7;
            float dot = 0.f;
#pragma unroll
            for (int w = 0; w < FF_WARPS; ++w) dot += sPart[(w * FF_ROWS + r) * FF_KEYS + c];
            const int j = key0 + c;
            bool ok = r < nrows && j < kend;
            if (ok && j >= P) {
                const int i_tok = (row0 + r) / H;
                ok = vis_b[(size_t)i_tok * Q + (j - P)] != 0;
            }
            const float sv = ok ? __fmul_rn(sm_scale, dot) : neg_inf();
            float mx = sv;
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_old = sM[r];
            const float m_new = fmaxf(m_old, mx);
            const float p = ok ? expf(sv - m_new) : 0.f;         // ok => m_new finite
            const float alpha = (m_new == neg_inf()) ? 1.f : expf(m_old - m_new);
            float ps = p;
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            sP[c * FF_ROWS + r] = p;
            __syncwarp();                 // every lane's read of sM[r] above precedes lane c == 0's write
            if (c == 0) {
                float err;
                sL[r] = two_sum(__fmul_rn(sL[r], alpha), ps, err);
                sC[r] = __fmul_rn(sC[r], alpha) + err;
                sM[r] = m_new;
                sAlpha[r] = alpha;
            }
        }
        __syncthreads();

        {   // P.V: this tile's sum_c p_c v_c for rows 4rq.., columns 4cq.. and 256 + 4cq.., then O = alpha O + it
            const float4 a4 = *(const float4*)(sAlpha + 4 * rq);
            const float al[4] = {a4.x, a4.y, a4.z, a4.w};
            float t[4][8];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int x = 0; x < 8; ++x) t[r][x] = 0.f;
#pragma unroll 2
            for (int c = 0; c < FF_KEYS; ++c) {
                const float4 v0 = *(const float4*)(Kt + c * FF_STR + cq * 4);
                const float4 v1 = *(const float4*)(Kt + c * FF_STR + 256 + cq * 4);
                const float4 p4 = *(const float4*)(sP + c * FF_ROWS + 4 * rq);
                const float pr[4] = {p4.x, p4.y, p4.z, p4.w};
                const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int x = 0; x < 8; ++x) t[r][x] = fmaf(pr[r], v[x], t[r][x]);
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int x = 0; x < 8; ++x) {
                    float err;
                    o[r][x] = two_sum(__fmul_rn(o[r][x], al[r]), t[r][x], err);
                    oc[r][x] = __fmul_rn(oc[r][x], al[r]) + err;
                }
        }
    }
    cp_async_wait<0>();                                          // an empty split still waits for its Q copy
    __syncthreads();                                             // sL, sC, sM of the last tile written

    const size_t rows_total = (size_t)B * rows_req;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = 4 * rq + i;
        if (r >= nrows) continue;
        const size_t grow = grow0 + r;
        float* dst = n_splits == 1 ? out + grow * ATTN_DV : ws_o + ((size_t)z * rows_total + grow) * ATTN_DV;
        const float l = sL[r] + sC[r];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int x = 4 * h2;
            float4 v = make_float4(o[i][x] + oc[i][x], o[i][x + 1] + oc[i][x + 1], o[i][x + 2] + oc[i][x + 2],
                                   o[i][x + 3] + oc[i][x + 3]);
            if (n_splits == 1) { v.x = v.x / l; v.y = v.y / l; v.z = v.z / l; v.w = v.w / l; }
            *(float4*)(dst + h2 * 256 + cq * 4) = v;
        }
    }
    if (tid < nrows) {
        const size_t grow = grow0 + tid;
        const float l = sL[tid] + sC[tid];
        if (n_splits == 1) {
            lse[grow] = sM[tid] + logf(l);
        } else {
            ws_m[(size_t)z * rows_total + grow] = sM[tid];
            ws_l[(size_t)z * rows_total + grow] = l;
        }
    }
}

// grid = B*Q*H rows, block = MERGE_THREADS (128): attn_common.cuh's merge_row_batched
ATTN_MERGE_ENTRY(verify_attn_fp32_ffma99_merge, float, StoreF32)
