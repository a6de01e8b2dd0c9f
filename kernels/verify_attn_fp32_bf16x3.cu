// verify_attn, variant fp32, "bf16x3": MLA absorbed tree-verify attention, contiguous layout (ops.md §2),
// on the bf16 tensor cores without losing a bit of the fp32 inputs. Every fp32 operand x is split
// exactly into three bf16 pieces, x = x0 + x1 + x2 (x0 = bf16_rn(x), x1 = bf16_rn(x - x0), x2 = x - x0
// - x1; 8 + 8 + 8 significand bits hold fp32's 24), and a product a * b becomes the six piece
// products with i + j <= 2 (a0b0, a0b1, a1b0, a0b2, a1b1, a2b0); the three left out are below
// 2^-26 |a b| together. A bf16 x bf16 product is exact in fp32. Why: on the H200 an exact fp32
// kernel on FFMA / DMMA tops out near 62 TFLOP/s for all of its units together (kernels/NOTES.md,
// "Session 5"), so the 35 us target needs the bf16 tensor cores, six passes and all.
//
// Launch (main): grid = (ceil(Q*H / 16), B, n_splits), block = FX_THREADS (384), dynamic shared
//   memory FX_SMEM_BYTES (213,760 B: opt-in; one block per SM; the kernel traps with less).
//   verify_attn_fp32_bf16x3(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B],
//                           visibility u8 [B,Q,Q], B, Q, H, S, sm_scale, n_splits,
//                           out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   A block owns 16 consecutive (token, head) rows of one request (one m16 tile) and one split of
//   its keys: chunk = ceil(kvlen / n_splits) rounded up to 16, kvlen = prefix_len[b] + Q; split z
//   has keys [z*chunk, min(kvlen, (z+1)*chunk)) (possibly empty: m = -inf, l = 0), walked in 16-key
//   sub-tiles. n_splits == 1 writes out/lse; otherwise the partials of attn_common.cuh and
//   verify_attn_fp32_bf16x3_merge (grid = B*Q*H, block = 128). At B=1 H=16 Q=17 P=2048 the host
//   picks 7 splits: 17 row tiles x 7 = 119 blocks of <= 304 keys (19 sub-tiles).
//
// Warp roles (hand-offs through mbarriers, as in verify_attn_fp32_dmma.cu):
//   S warps 8..11 (one per SM sub-partition): copy each sub-tile's 16 kv rows (fp32) with cp.async
//     into a 4-slot ring (three sub-tiles ahead); S[16 rows][16 keys] over dims [144w, 144w + 144)
//     with mma.m16n8k16 bf16: A = the Q pieces (split once in the prologue, ldmatrix), B = the K
//     pieces split from the ring in registers. Per 16-dim k-step the a0b0 product goes into a zeroed
//     accumulator that is then added to the partial in fp32 (round to nearest); the five smaller
//     products accumulate in three chains of their own (k-step mod 3), so the tensor cores' own
//     accumulation never carries the partial sum. Partial = main + ((x0 + x1) + x2) -> sS.
//   O warps 0..7: warps 0, 1 run the softmax (thread: row tid / 4, keys 4 (tid % 4) ..+3) from the
//     four partials (added in w order); then each O warp does O[16][64-dim slice] = alpha O + P V:
//     P (fp32 from sP) and V (fp32 from the ring) split into pieces in registers, per n8 tile the
//     six products smallest first into a zeroed C, then O = fmaf(alpha, O, C).
//   Key order inside the P.V k16 step: MMA k index 2t, 2t+1, 2t+8, 2t+9 <-> key t, t+4, t+8, t+12
//     (t = lane % 4), so a thread's four V rows are keys 4c + t: one 16-byte load per key and dim
//     quad. Dim order inside a warp's 64 columns: n tile j, column n <-> dim 4n + j (j < 4) or
//     32 + 4n + j - 4, so a thread's C fragment holds dims 8t ..8t+7 and 32 + 8t ..+7 of rows g, g+8.
//
// Numerical contract: no bit of an fp32 input is dropped; every product of two pieces is exact in
//   fp32; per 16 products the tensor cores add in their own order and rounding, after which sums
//   are fp32 round-to-nearest: s_j = fl(partial sum over 576 dims) * sm_scale (two roundings).
//   The online softmax per sub-tile is verify_attn_fp32_dmma.cu's: m_new = max(m_old, max s_j),
//   p_j = expf(s_j - m_new), alpha = expf(m_old - m_new) (1 while m_new is -inf), l = alpha l +
//   ((p0 + p1) + (p2 + p3)) over xor-1 then xor-2 shuffles; O = fmaf(alpha, O, sum_j p_j v_j)
//   with the 16 keys' products summed on the tensor cores. out = O / l, lse = m + logf(l). Masks,
//   NaN padding and zero-fill as in verify_attn_fp32_dmma.cu. Target: relative L2 <= 1e-6 against
//   float64 (ops.md fp32 tolerances).
//
// Knobs (timing only, wrong results): FX_DIAG = 1 no score MMAs, 2 no P.V MMAs.
//
// Shared memory (FX_SMEM_BYTES = 213,760 B):
//   sQp  [3 pieces][16 rows][576] bf16, 16-byte chunk c of row r at c ^ (r & 7)         55,296
//   sKV  [4 slots][16 keys][576] fp32, 16-byte chunk c of key r at c ^ 2 (r & 3)      147,456
//   sS   [2][4 S warps][16 rows][16 keys] fp32 partials, key k of row r at k ^ 8 ((r >> 1) & 1)
//                                                                                      8,192
//   sP   [2][16][20] fp32 softmax weights, sAlpha [2][16], sL [16]                     2,752
//   8 mbarriers                                                                           64
#include "attn_common.cuh"

#define FX_ROWS 16                               // rows per block: one m16 tile
#define FX_KEYS 16                               // keys per sub-tile
#define FX_SW 4                                  // S warps: split over 4 dim quarters
#define FX_OW 8                                  // O warps: 64 value columns each
#define FX_OT (FX_OW * 32)
#define FX_THREADS ((FX_SW + FX_OW) * 32)        // 384
#define FX_RING 4                                // kv ring slots (three sub-tiles ahead)
#define FX_CH (ATTN_D / 4)                       // 16-byte fp32 chunks per row (144)
#define FX_KSTEPS (ATTN_D / (16 * FX_SW))        // k16 steps per S warp (9)
#define FX_PSTR 20                               // sP row stride (floats): conflict-free A loads
#define FX_QP_BYTES (FX_ROWS * ATTN_D * 2)       // one Q piece
#define FX_KV_FLOATS (FX_KEYS * ATTN_D)
#define FX_S_FLOATS (FX_SW * FX_ROWS * FX_KEYS)  // one sS buffer
#define FX_SMEM_BYTES (3 * FX_QP_BYTES + (FX_RING * FX_KV_FLOATS + 2 * FX_S_FLOATS + 2 * FX_ROWS * FX_PSTR \
                                          + 3 * FX_ROWS) * 4 + 64)
#define FX_MAXZ 16                               // merge: splits loaded per batch
#ifndef FX_ISPLIT
#define FX_ISPLIT 0                              // 1: split with integer rounding (no cvt)
#endif
#ifndef FX_DIAG
#define FX_DIAG 0                                // timing only: 1 no score MMAs, 2 no P.V MMAs
#endif

#if FX_ROWS * 4 > 2 * 32 || 4 + FX_RING > 8
#error "softmax runs in warps 0 and 1 (4 threads a row); 4 + FX_RING mbarriers fit in 64 bytes"
#endif
#if defined(FX_EXPECT_SMEM) && FX_EXPECT_SMEM != FX_SMEM_BYTES
#error "FX_SMEM_BYTES differs from the host's CUDA_KERNELS entry (kdtr/ops/verify_attn.py)"
#endif

// float offset of dim `dim` of key row `key` in a swizzled ring slot
__device__ __forceinline__ int fx_kv_at(int key, int dim) {
    return key * ATTN_D + 4 * ((dim >> 2) ^ ((key & 3) << 1)) + (dim & 3);
}

// byte offset of 16-byte chunk `chunk` (dims 8 chunk ..+7) of row `row` in a Q piece
__device__ __forceinline__ int fx_q_at(int row, int chunk) {
    return row * (ATTN_D * 2) + 16 * (chunk ^ (row & 7));
}

// exact split of two fp32 values into three packed bf16x2 pieces (lo = x, hi = y)
#if FX_ISPLIT
// integer rounding: bits + 0x8000 then the low half cleared rounds to the nearest bf16 (ties away
// from zero), full-rate integer ops instead of the conversion unit
__device__ __forceinline__ float fx_round_bf16(float x) {
    return __uint_as_float((__float_as_uint(x) + 0x8000u) & 0xffff0000u);
}
__device__ __forceinline__ void split3(float x, float y, u32& p0, u32& p1, u32& p2) {
    const float x0 = fx_round_bf16(x), y0 = fx_round_bf16(y);
    const float rx = x - x0, ry = y - y0;                       // exact: at most half a bf16 ulp
    const float x1 = fx_round_bf16(rx), y1 = fx_round_bf16(ry);
    const float x2 = rx - x1, y2 = ry - y1;                     // exact, at most 8 significant bits
    p0 = __byte_perm(__float_as_uint(x0), __float_as_uint(y0), 0x7632);
    p1 = __byte_perm(__float_as_uint(x1), __float_as_uint(y1), 0x7632);
    p2 = __byte_perm(__float_as_uint(x2), __float_as_uint(y2), 0x7632);
}
#else
__device__ __forceinline__ void split3(float x, float y, u32& p0, u32& p1, u32& p2) {
    p0 = pack_bf16x2(x, y);
    const float rx = x - bf16_lo(p0), ry = y - bf16_hi(p0);     // exact: below half a bf16 ulp
    p1 = pack_bf16x2(rx, ry);
    p2 = pack_bf16x2(rx - bf16_lo(p1), ry - bf16_hi(p1));       // exact, and exactly representable
}
#endif

extern "C" __global__ void __launch_bounds__(FX_THREADS, 1)
verify_attn_fp32_bf16x3(const float* __restrict__ q, const float* __restrict__ kv,
                        const int* __restrict__ prefix_len, const u8* __restrict__ visibility,
                        int B, int Q, int H, int S, float sm_scale, int n_splits,
                        float* __restrict__ out, float* __restrict__ lse,
                        float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    if (dynamic_smem_bytes() < FX_SMEM_BYTES) __trap();         // host and kernel disagree
    unsigned char* sQp = smem_raw;
    float* sKV = (float*)(smem_raw + 3 * FX_QP_BYTES);
    float* sS = sKV + FX_RING * FX_KV_FLOATS;
    float* sP = sS + 2 * FX_S_FLOATS;
    float* sAlpha = sP + 2 * FX_ROWS * FX_PSTR;
    float* sL = sAlpha + 2 * FX_ROWS;
    const unsigned mb = smem_addr(sL + FX_ROWS);                 // FULL 0,1 | EMPTY_S 2,3 | EMPTY_KV 4..7
    const unsigned mb_full = mb, mb_empty_s = mb + 16, mb_empty_kv = mb + 32;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int b = blockIdx.y, z = blockIdx.z;
    const int rows_req = Q * H;
    const int row0 = blockIdx.x * FX_ROWS;
    const int nrows = min(FX_ROWS, rows_req - row0);
    const int P = prefix_len[b];
    const int kvlen = P + Q;
    const int chunk = ((kvlen + n_splits - 1) / n_splits + FX_KEYS - 1) / FX_KEYS * FX_KEYS;
    const int kbeg = min(z * chunk, kvlen);
    const int kend = min(kbeg + chunk, kvlen);
    const int nsub = (kend - kbeg + FX_KEYS - 1) / FX_KEYS;
    const size_t grow0 = (size_t)b * rows_req + row0;
    const size_t rows_total = (size_t)B * rows_req;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const bool s_warp = warp >= FX_OW;                           // warp-uniform role
    const int st = tid - FX_OT;                                  // S thread index 0..127

    // kv rows of sub-tile s into ring slot s % FX_RING (S threads; commit by the caller)
    auto issue_kv = [&](int s) {
        float* dst = sKV + (s % FX_RING) * FX_KV_FLOATS;
        const int key0 = kbeg + s * FX_KEYS;
#pragma unroll
        for (int i = 0; i < FX_KEYS * FX_CH / (32 * FX_SW); ++i) {
            const int e = st + 32 * FX_SW * i, r = e / FX_CH, c = e - r * FX_CH;
            const int j = key0 + r;
            const bool ok = j < kend;
            cp_async16(dst + fx_kv_at(r, 4 * c), kvb + (size_t)(ok ? j : 0) * ATTN_D + 4 * c, ok);
        }
    };

    {   // prologue: kv sub-tiles 0..2 in flight (S threads); the Q tile split into its three pieces
        // (every thread; rows past nrows zero)
        if (s_warp) {
#pragma unroll
            for (int s = 0; s < FX_RING - 1; ++s) {
                if (s < nsub) issue_kv(s);
                cp_async_commit();
            }
        }
        const float* qb = q + grow0 * ATTN_D;
        for (int e = tid; e < FX_ROWS * FX_CH; e += FX_THREADS) {
            const int r = e / FX_CH, c = e - r * FX_CH;
            const float4 v = r < nrows ? __ldg((const float4*)(qb + (size_t)r * ATTN_D + 4 * c))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
            uint2 pc[3];
            split3(v.x, v.y, pc[0].x, pc[1].x, pc[2].x);
            split3(v.z, v.w, pc[0].y, pc[1].y, pc[2].y);
            const int at = fx_q_at(r, c >> 1) + 8 * (c & 1);
#pragma unroll
            for (int p = 0; p < 3; ++p) *(uint2*)(sQp + p * FX_QP_BYTES + at) = pc[p];
        }
        if (tid == 0) {
            mbar_init(mb_full, 32 * FX_SW); mbar_init(mb_full + 8, 32 * FX_SW);
            mbar_init(mb_empty_s, FX_OT); mbar_init(mb_empty_s + 8, FX_OT);
            for (int i = 0; i < FX_RING; ++i) mbar_init(mb_empty_kv + 8 * i, FX_OT);
        }
        __syncthreads();                                         // Q pieces visible, mbarriers initialised
    }

    if (s_warp) {
        // ---------------- S warps: partial scores of each sub-tile over dims [144w, 144w + 144)
        const int sw = warp - FX_OW;
        const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lhalf = lane >> 4;   // ldmatrix x4 rows
#pragma unroll 1
        for (int t = 0; t < nsub; ++t) {
            cp_async_wait<FX_RING - 2>();                        // sub-tile t (t + 1, t + 2 may pend)
            named_barrier(1, 32 * FX_SW);                        // ... for every S thread
            const float* ks = sKV + (t % FX_RING) * FX_KV_FLOATS;
            float acc[2][4], cx[2][3][4];
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] = cx[n][0][e] = cx[n][1][e] = cx[n][2][e] = 0.f;
#if FX_DIAG != 1
#pragma unroll 1
            for (int i0 = 0; i0 < FX_KSTEPS; i0 += 3) {
                // three k-steps at once: their A and B pieces first, then each of the six products
                // over the 3 x 2 (k-step, n tile) fragments, so six independent MMAs are in flight
                u32 a[3][3][4], bp[3][2][3][2];
#pragma unroll
                for (int u = 0; u < 3; ++u) {
                    const int kstep = FX_KSTEPS * sw + i0 + u;
#pragma unroll
                    for (int p = 0; p < 3; ++p)
                        ldmatrix_x4(a[u][p], sQp + p * FX_QP_BYTES + fx_q_at(lrow, 2 * kstep + lhalf));
#pragma unroll
                    for (int n = 0; n < 2; ++n) {
                        const int key = 8 * n + g, dim = 16 * kstep + 2 * t4;
                        const float2 lo = *(const float2*)(ks + fx_kv_at(key, dim));
                        const float2 hi = *(const float2*)(ks + fx_kv_at(key, dim + 8));
                        split3(lo.x, lo.y, bp[u][n][0][0], bp[u][n][1][0], bp[u][n][2][0]);
                        split3(hi.x, hi.y, bp[u][n][0][1], bp[u][n][1][1], bp[u][n][2][1]);
                    }
                }
#pragma unroll
                for (int u = 0; u < 3; ++u)
#pragma unroll
                    for (int n = 0; n < 2; ++n) {
                        float c[4] = {0.f, 0.f, 0.f, 0.f};
                        mma_bf16_16816(c, a[u][0], bp[u][n][0][0], bp[u][n][0][1]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[n][e] += c[e];
                    }
                // the five smaller products (a2b0, a1b1, a0b2, a1b0, a0b1) into chain u
                constexpr int AP[5] = {2, 1, 0, 1, 0}, BP[5] = {0, 1, 2, 0, 1};
#pragma unroll
                for (int k = 0; k < 5; ++k)
#pragma unroll
                    for (int u = 0; u < 3; ++u)
#pragma unroll
                        for (int n = 0; n < 2; ++n)
                            mma_bf16_16816(cx[n][u], a[u][AP[k]], bp[u][n][BP[k]][0], bp[u][n][BP[k]][1]);
            }
#endif
            // the partial to sS[t & 1] once the O warps have read sub-tile t - 2's
            if (t >= 2) mbar_wait(mb_empty_s + 8 * (t & 1), ((t >> 1) - 1) & 1);
            float* ss = sS + (t & 1) * FX_S_FLOATS + sw * FX_ROWS * FX_KEYS;
            const int sk = 8 * ((g >> 1) & 1);                   // rows g, g + 8 share it
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int key = (8 * n + 2 * t4) ^ sk;
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = acc[n][e] + ((cx[n][0][e] + cx[n][1][e]) + cx[n][2][e]);
                *(float2*)(ss + g * FX_KEYS + key) = make_float2(v[0], v[1]);
                *(float2*)(ss + (g + 8) * FX_KEYS + key) = make_float2(v[2], v[3]);
            }
            mbar_arrive(mb_full + 8 * (t & 1));
            // then the refill: sub-tile t + 3 goes to the slot of t - 1, free once the O warps are done
            if (t + FX_RING - 1 < nsub) {
                if (t >= 1) mbar_wait(mb_empty_kv + 8 * ((t - 1) % FX_RING), ((t - 1) / FX_RING) & 1);
                issue_kv(t + FX_RING - 1);
            }
            cp_async_commit();
        }
        cp_async_wait<0>();                                      // only empty groups are left
        return;
    }

    // ---------------- O warps: softmax (warps 0, 1), then O = alpha O + P V on 64 columns each
    const int col0 = 64 * warp;                                  // this warp's value columns
    const bool s_role = warp < 2;                                // warp-uniform
    const int srow = tid >> 2, skq = 4 * (tid & 3);
    const bool srow_ok = s_role && srow < nrows;
    const u8* vrow = visibility + ((long long)b * Q * Q + (long long)(srow_ok ? (row0 + srow) / H : 0) * Q - P);
    float m_run = neg_inf(), l_run = 0.f;
    float o[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

#pragma unroll 1
    for (int t = 0; t < nsub; ++t) {
        const int buf = t & 1;
        mbar_wait(mb_full + 8 * buf, (t >> 1) & 1);              // partials of t (and its kv rows)
        float* pb = sP + buf * FX_ROWS * FX_PSTR;
        float* ab = sAlpha + buf * FX_ROWS;
        if (s_role) {
            const float* ss = sS + buf * FX_S_FLOATS + srow * FX_KEYS + (skq ^ (8 * ((srow >> 1) & 1)));
            float4 d = *(const float4*)ss;
#pragma unroll
            for (int w = 1; w < FX_SW; ++w) {
                const float4 e = *(const float4*)(ss + w * FX_ROWS * FX_KEYS);
                d.x += e.x; d.y += e.y; d.z += e.z; d.w += e.w;
            }
            const float dots[4] = {d.x, d.y, d.z, d.w};
            const int j0 = kbeg + t * FX_KEYS + skq;
            float s[4], mx = neg_inf();
            bool ok[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int j = j0 + k;
                bool a = srow_ok && j < kend;
                if (a && j >= P) a = vrow[j] != 0;
                ok[k] = a;
                s[k] = a ? dots[k] * sm_scale : neg_inf();
                mx = fmaxf(mx, s[k]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run, mx);
            float p[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) p[k] = ok[k] ? expf(s[k] - m_new) : 0.f;   // ok => m_new finite
            const float alpha = m_new == neg_inf() ? 1.f : expf(m_run - m_new);
            float ps = (p[0] + p[1]) + (p[2] + p[3]);
            ps += __shfl_xor_sync(0xffffffffu, ps, 1);
            ps += __shfl_xor_sync(0xffffffffu, ps, 2);
            l_run = l_run * alpha + ps;
            m_run = m_new;
            *(float4*)(pb + srow * FX_PSTR + skq) = make_float4(p[0], p[1], p[2], p[3]);
            if (skq == 0) ab[srow] = alpha;
        }
        mbar_arrive(mb_empty_s + 8 * buf);                       // this thread's reads of sS[buf] done
        named_barrier(2, FX_OT);                                 // P, alpha of t written

        // P A fragment: rows g, g + 8; k 2t, 2t+1, 2t+8, 2t+9 <-> keys t, t+4, t+8, t+12
        u32 pa[3][4];
        {
            const float* p0 = pb + g * FX_PSTR + t4;
            const float* p1 = p0 + 8 * FX_PSTR;
            split3(p0[0], p0[4], pa[0][0], pa[1][0], pa[2][0]);
            split3(p1[0], p1[4], pa[0][1], pa[1][1], pa[2][1]);
            split3(p0[8], p0[12], pa[0][2], pa[1][2], pa[2][2]);
            split3(p1[8], p1[12], pa[0][3], pa[1][3], pa[2][3]);
        }
        const float al0 = ab[g], al1 = ab[g + 8];
        const float* vs = sKV + (t % FX_RING) * FX_KV_FLOATS;
        float4 va[4], vb[4];                                     // keys 4c + t4: dims col0 + 4g ..+3, +32
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            va[c] = *(const float4*)(vs + fx_kv_at(4 * c + t4, col0 + 4 * g));
            vb[c] = *(const float4*)(vs + fx_kv_at(4 * c + t4, col0 + 32 + 4 * g));
        }
#pragma unroll
        for (int j0 = 0; j0 < 8; j0 += 4) {
            // four n tiles at once: their V pieces, then each of the six products over the four
            // (four independent MMAs in flight), smallest first into zeroed C fragments
            u32 bp[4][3][2];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                float v[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float4& w = j0 == 0 ? va[c] : vb[c];
                    v[c] = jj == 0 ? w.x : jj == 1 ? w.y : jj == 2 ? w.z : w.w;
                }
                split3(v[0], v[1], bp[jj][0][0], bp[jj][1][0], bp[jj][2][0]);
                split3(v[2], v[3], bp[jj][0][1], bp[jj][1][1], bp[jj][2][1]);
            }
            float c[4][4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) c[jj][0] = c[jj][1] = c[jj][2] = c[jj][3] = 0.f;
#if FX_DIAG != 2
            constexpr int AP[6] = {2, 1, 0, 1, 0, 0}, BP[6] = {0, 1, 2, 0, 1, 0};
#pragma unroll
            for (int k = 0; k < 6; ++k)
#pragma unroll
                for (int jj = 0; jj < 4; ++jj)
                    mma_bf16_16816(c[jj], pa[AP[k]], bp[jj][BP[k]][0], bp[jj][BP[k]][1]);
#endif
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = j0 + jj;
                o[j][0] = fmaf(al0, o[j][0], c[jj][0]);
                o[j][1] = fmaf(al0, o[j][1], c[jj][1]);
                o[j][2] = fmaf(al1, o[j][2], c[jj][2]);
                o[j][3] = fmaf(al1, o[j][3], c[jj][3]);
            }
        }
        mbar_arrive(mb_empty_kv + 8 * (t % FX_RING));            // this thread is done with slot t % 4
    }

    // ---------------- epilogue: O rows g, g + 8 (normalised when the keys are not split), the stats
    if (s_role && skq == 0) sL[srow] = l_run;
    named_barrier(2, FX_OT);
    const bool direct = n_splits == 1;
    float* base = (direct ? out : ws_o + (size_t)z * rows_total * ATTN_DV) + grow0 * ATTN_DV + col0 + 8 * t4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {                                // h = 0: row g (c0, c1), 1: row g + 8
        const int r = g + 8 * h;
        if (r < nrows) {
            float* dst = base + (size_t)r * ATTN_DV;
            const int e0 = 2 * h, e1 = 2 * h + 1;
            // C column 2t -> dims 8t + j (j < 4), 32 + 8t + j - 4; column 2t + 1 -> the same + 4
            float4 w[4] = {make_float4(o[0][e0], o[1][e0], o[2][e0], o[3][e0]),
                           make_float4(o[0][e1], o[1][e1], o[2][e1], o[3][e1]),
                           make_float4(o[4][e0], o[5][e0], o[6][e0], o[7][e0]),
                           make_float4(o[4][e1], o[5][e1], o[6][e1], o[7][e1])};
            if (direct) {
                const float l = sL[r];
#pragma unroll
                for (int k = 0; k < 4; ++k) w[k] = make_float4(w[k].x / l, w[k].y / l, w[k].z / l, w[k].w / l);
            }
            *(float4*)(dst) = w[0];
            *(float4*)(dst + 4) = w[1];
            *(float4*)(dst + 32) = w[2];
            *(float4*)(dst + 36) = w[3];
        }
    }
    if (s_role && srow_ok && skq == 0) {
        const size_t grow = grow0 + srow;
        if (direct) {
            lse[grow] = m_run + logf(l_run);
        } else {
            ws_m[(size_t)z * rows_total + grow] = m_run;
            ws_l[(size_t)z * rows_total + grow] = l_run;
        }
    }
}

// grid = B*Q*H rows, block = MERGE_THREADS (128): attn_common.cuh's merge_row_batched
ATTN_MERGE_BATCHED_ENTRY(verify_attn_fp32_bf16x3_merge, FX_MAXZ)
