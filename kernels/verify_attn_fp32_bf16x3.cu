// verify_attn, variant fp32, "bf16x3": MLA absorbed tree-verify attention, contiguous layout (ops.md §2),
// on the bf16 tensor cores without losing a bit of the fp32 inputs. Every fp32 operand x is split
// exactly into three bf16 pieces, x = x0 + x1 + x2 (x0 = bf16_rn(x), x1 = bf16_rn(x - x0), x2 = x - x0
// - x1; 8 + 8 + 8 significand bits hold fp32's 24), and a product a * b becomes the six piece
// products with i + j <= 2 (a0b0, a0b1, a1b0, a0b2, a1b1, a2b0); the three left out are at most
// about 2^-23 |a b| together (each piece is at most 2^-8 of the one before), the size of fp32's own
// rounding of a product. A bf16 x bf16 product is exact in fp32. Why: on the H200 an exact fp32
// kernel on FFMA / DMMA tops out near 62 TFLOP/s for all of its units together (kernels/NOTES.md,
// "Session 5"), while mma.sync bf16 runs at 0.57 MMA/clk/SM (~600 TFLOP/s; "Session 6"). The split
// conversions (F2FP) take the tensor pipe's time (they run in the sum of their times with HMMA), so
// each kv element is split once per block, into shared memory, and both MMAs read the pieces.
//
// Launch (main): grid = (ceil(Q*H / 16), B, n_splits), block = FX_THREADS (384), dynamic shared
//   memory FX_SMEM_BYTES (214,272 B: opt-in; one block per SM; the kernel traps with less).
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
// Warp roles (hand-offs through mbarriers; each thread arrives after its own accesses):
//   S warps 8..11 (one per SM sub-partition), per sub-tile t: S[16 rows][16 keys] over dims
//     [144w, 144w + 144) with mma.m16n8k16 bf16 (A = Q pieces, B = K pieces, both ldmatrix). The
//     a0b0 product of each 16-dim k-step goes into a zeroed accumulator that is then added to the
//     partial in fp32 (round to nearest); the five smaller products accumulate in chains of their
//     own (k-step mod 3), so the tensor cores' own accumulation never carries the partial sum:
//     partial = main + ((x0 + x1) + x2) -> sS. Then (named barrier 1 over the S warps) the
//     softmax: thread st owns row st / 8 and keys 2 (st % 8), +1; the four partials added in w
//     order; P split into pieces -> sPp, alpha -> sAlpha; arrive FULL.
//   O warps 0..7, per sub-tile t: P pieces (ldmatrix) and alpha; O[16][64w ..+64) = alpha O + P V
//     with V pieces by ldmatrix.trans, per n8 tile the six products smallest first into a zeroed C,
//     then O = fmaf(alpha, O, C). Then they split sub-tile t + 2 from the fp32 staging slot into the
//     K-piece slot t & 1 they have just finished with and copy sub-tile t + 3 into the staging slot
//     (cp.async). A thread splits and copies only its own 16-byte chunks: warp w the dims of its own
//     V columns for all 16 keys, and thread ot one rope chunk (key ot / 16, dims 512 + 4 (ot % 16)),
//     read only by the S warps; so the staging slot needs no barrier and a K-piece slot only the
//     warp's own __syncwarp besides KP_FULL.
//   mbarriers: FULL[2] (128 S threads: P, alpha of t in buffer t & 1), EMPTY_S[2] (256 O threads:
//     P, alpha of t read), KP_FULL[2] (256 O threads: K pieces of sub-tile u >= 2 in slot u & 1),
//     FIN (128 S threads: sL and the row statistics written). Named barrier 1: the S warps
//     (partials written / read). The end hand-off is an mbarrier, not a 384-thread named barrier:
//     with one, synccheck reported divergent threads and racecheck a hazard on sL (session 6, call 6).
//   Measured on the H200 (kernels/NOTES.md, "Session 6"): 48.4-48.9 us at the timing shape against
//   fp32_dmma's 50.5-51.0 in one process (call 11); the version with a softmax warp of its own
//   (commit 39cdb12) ran 49.5-50.0.
//
// Numerical contract: no bit of an fp32 input is dropped; every product of two pieces is exact in
//   fp32; per 16 products the tensor cores add in their own order and rounding, after which sums
//   are fp32 round-to-nearest: s_j = fl(partial sum over 576 dims) * sm_scale. Per 16-key sub-tile
//   one online softmax step in fp32: m_new = max(m_old, max_j s_j), p_j = expf(s_j - m_new), alpha
//   = expf(m_old - m_new) (1 while m_new is -inf), l = alpha l + sum_j p_j (pairs, then xor-1, -2,
//   -4 shuffles); O = fmaf(alpha, O, sum_j p_j v_j) with the 16 keys' products summed on the
//   tensor cores. out = O / l, lse = m + logf(l). Prefix keys are always visible, tree key j iff
//   visibility[b, i, j - prefix_len]; kv rows at or past prefix_len[b] + Q (NaN padding) and q rows
//   past the request's Q*H are never read (zero-filled) and masked keys get p = 0 exactly.
//   Target: relative L2 <= 1e-6 against float64 (ops.md fp32 tolerances).
//
// Knobs (timing only, wrong results): FX_DIAG = 1 no score MMAs, 2 no P.V MMAs.
//
// Shared memory (FX_SMEM_BYTES = 214,272 B):
//   sQp    [3 pieces][16 rows][576] bf16, 16-byte chunk c of row r at c ^ (r & 7)       55,296
//   sKp    [2 slots][3 pieces][16 keys][576] bf16, the same swizzle                    110,592
//   sStage [16 keys][576] fp32, the next sub-tile to split                              36,864
//   sS     [2][4 S warps][16 rows][16 keys] fp32 partials, key k of row r at k ^ 8 ((r >> 1) & 1)
//                                                                                        8,192
//   sPp    [2][3 pieces][16 rows][16 keys] bf16, 8-key half h of row r at h ^ ((r >> 2) & 1)
//                                                                                        3,072
//   sAlpha [2][16], sL [16] fp32                                                           192
//   7 mbarriers                                                                             64
#include "attn_common.cuh"

#define FX_ROWS 16                               // rows per block: one m16 tile
#define FX_KEYS 16                               // keys per sub-tile
#define FX_SW 4                                  // S warps: split over 4 dim quarters
#define FX_OW 8                                  // O warps: 64 value columns each
#define FX_OT (FX_OW * 32)
#define FX_THREADS ((FX_SW + FX_OW) * 32)        // 384
#define FX_CH (ATTN_D / 4)                       // 16-byte fp32 chunks per row (144)
#define FX_OWN (16 * FX_KEYS / 32 + 1)           // chunks an O thread splits per sub-tile (8 V + 1 rope)
#define FX_KSTEPS (ATTN_D / (16 * FX_SW))        // k16 steps per S warp (9)
#define FX_PIECE_BYTES (16 * ATTN_D * 2)         // one [16][576] bf16 piece
#define FX_STAGE_FLOATS (FX_KEYS * ATTN_D)
#define FX_S_FLOATS (FX_SW * FX_ROWS * FX_KEYS)  // one sS buffer
#define FX_PP_BYTES (3 * FX_ROWS * FX_KEYS * 2)  // one sPp buffer
#define FX_SMEM_BYTES (9 * FX_PIECE_BYTES + (FX_STAGE_FLOATS + 2 * FX_S_FLOATS) * 4 + 2 * FX_PP_BYTES \
                       + 3 * FX_ROWS * 4 + 64)
#define FX_MAXZ 16                               // merge: splits loaded per batch
#ifndef FX_DIAG
#define FX_DIAG 0                                // timing only: 1 no score MMAs, 2 no P.V MMAs
#endif

#if FX_ROWS * FX_KEYS != 2 * 32 * FX_SW
#error "the softmax gives each S thread two keys of one row"
#endif
#if 64 * FX_OW != ATTN_DV || FX_KEYS * 16 != FX_OT
#error "O warp w splits the 16 chunks of its 64 columns for 16 keys; thread ot one rope chunk"
#endif
#if defined(FX_EXPECT_SMEM) && FX_EXPECT_SMEM != FX_SMEM_BYTES
#error "FX_SMEM_BYTES differs from the host's CUDA_KERNELS entry (kdtr/ops/verify_attn.py)"
#endif
#if defined(FX_EXPECT_THREADS) && FX_EXPECT_THREADS != FX_THREADS
#error "FX_THREADS differs from the host's CUDA_KERNELS entry (kdtr/ops/verify_attn.py)"
#endif

// byte offset of 16-byte chunk `chunk` (dims 8 chunk ..+7) of row `row` in a [16][576] bf16 piece
__device__ __forceinline__ int fx_at(int row, int chunk) {
    return row * (ATTN_D * 2) + 16 * (chunk ^ (row & 7));
}

// exact split of two fp32 values into three packed bf16x2 pieces (lo = x, hi = y)
__device__ __forceinline__ void split3(float x, float y, u32& p0, u32& p1, u32& p2) {
    p0 = pack_bf16x2(x, y);
    const float rx = x - bf16_lo(p0), ry = y - bf16_hi(p0);     // exact: below half a bf16 ulp
    p1 = pack_bf16x2(rx, ry);
    p2 = pack_bf16x2(rx - bf16_lo(p1), ry - bf16_hi(p1));       // exact, and exactly representable
}

// a float4 (fp32 chunk `chunk`: dims 4 chunk ..+3 of row `row`) split into its three pieces, each
// stored at its place in its [16][576] bf16 piece
__device__ __forceinline__ void split_store(unsigned char* pieces, int row, int chunk, float4 v) {
    const int at = fx_at(row, chunk >> 1) + 8 * (chunk & 1);
    uint2 pc[3];
    split3(v.x, v.y, pc[0].x, pc[1].x, pc[2].x);
    split3(v.z, v.w, pc[0].y, pc[1].y, pc[2].y);
#pragma unroll
    for (int p = 0; p < 3; ++p) *(uint2*)(pieces + p * FX_PIECE_BYTES + at) = pc[p];
}

extern "C" __global__ void __launch_bounds__(FX_THREADS, 1)
verify_attn_fp32_bf16x3(const float* __restrict__ q, const float* __restrict__ kv,
                        const int* __restrict__ prefix_len, const u8* __restrict__ visibility,
                        int B, int Q, int H, int S, float sm_scale, int n_splits,
                        float* __restrict__ out, float* __restrict__ lse,
                        float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    if (dynamic_smem_bytes() < FX_SMEM_BYTES) __trap();         // host and kernel disagree
    unsigned char* sQp = smem_raw;
    unsigned char* sKp = sQp + 3 * FX_PIECE_BYTES;
    float* sStage = (float*)(sKp + 6 * FX_PIECE_BYTES);
    float* sS = sStage + FX_STAGE_FLOATS;
    unsigned char* sPp = (unsigned char*)(sS + 2 * FX_S_FLOATS);
    float* sAlpha = (float*)(sPp + 2 * FX_PP_BYTES);
    float* sL = sAlpha + 2 * FX_ROWS;
    const unsigned mb = smem_addr(sL + FX_ROWS);                 // FULL 0,1 | EMPTY_S 2,3 | KP_FULL 4,5 | FIN 6
    const unsigned mb_full = mb, mb_empty_s = mb + 16, mb_kp_full = mb + 32, mb_fin = mb + 48;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int b = blockIdx.y, z = blockIdx.z;
    const int rows_req = Q * H;
    const int row0 = blockIdx.x * FX_ROWS;
    const int nrows = min(FX_ROWS, rows_req - row0);
    const int P = prefix_len[b];
    const int kvlen = P + Q;
    ATTN_KEY_SPLIT(kvlen, n_splits, z, FX_KEYS)
    const int nsub = (kend - kbeg + FX_KEYS - 1) / FX_KEYS;
    const size_t grow0 = (size_t)b * rows_req + row0;
    const size_t rows_total = (size_t)B * rows_req;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const bool s_warp = warp >= FX_OW;                           // warp-uniform role
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lhi = lane >> 4;   // ldmatrix x4 addressing

    // O thread's own chunk i of a sub-tile: key and fp32 chunk index (i < 8: its warp's V columns)
    auto own = [&](int i, int& key, int& ch) {
        if (i < FX_OWN - 1) {
            const int e = lane + 32 * i;
            key = e >> 4; ch = 16 * warp + (e & 15);
        } else {
            key = tid >> 4; ch = ATTN_DV / 4 + (tid & 15);
        }
    };
    // cp.async of this O thread's chunks of sub-tile s into the staging slot (commit by the caller)
    auto stage_own = [&](int s) {
        const int key0 = kbeg + s * FX_KEYS;
#pragma unroll
        for (int i = 0; i < FX_OWN; ++i) {
            int key, ch;
            own(i, key, ch);
            const bool ok = key0 + key < kend;
            cp_async16(sStage + key * ATTN_D + 4 * ch, kvb + (size_t)(ok ? key0 + key : 0) * ATTN_D + 4 * ch, ok);
        }
    };

    {   // prologue: sub-tiles 0 and 1 split straight from global into K-piece slots 0, 1 and sub-tile 2
        // staged (O threads); the Q tile split into its pieces (every thread; rows past nrows zero)
        if (!s_warp) {
            if (nsub > 2) stage_own(2);
            cp_async_commit();
            float4 v[2][FX_OWN];
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int i = 0; i < FX_OWN; ++i) {
                    int key, ch;
                    own(i, key, ch);
                    const int j = kbeg + s * FX_KEYS + key;
                    v[s][i] = s < nsub && j < kend ? __ldg((const float4*)(kvb + (size_t)j * ATTN_D + 4 * ch))
                                                   : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int i = 0; i < FX_OWN; ++i) {
                    int key, ch;
                    own(i, key, ch);
                    split_store(sKp + 3 * s * FX_PIECE_BYTES, key, ch, v[s][i]);
                }
        }
        const float* qb = q + grow0 * ATTN_D;
        for (int e = tid; e < FX_ROWS * FX_CH; e += FX_THREADS) {
            const int r = e / FX_CH, c = e - r * FX_CH;
            const float4 v = r < nrows ? __ldg((const float4*)(qb + (size_t)r * ATTN_D + 4 * c))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
            split_store(sQp, r, c, v);
        }
        if (tid == 0) {
            mbar_init(mb_full, 32 * FX_SW); mbar_init(mb_full + 8, 32 * FX_SW);
            mbar_init(mb_empty_s, FX_OT); mbar_init(mb_empty_s + 8, FX_OT);
            mbar_init(mb_kp_full, FX_OT); mbar_init(mb_kp_full + 8, FX_OT);
            mbar_init(mb_fin, 32 * FX_SW);
        }
        __syncthreads();                                         // pieces visible, mbarriers initialised
    }

    if (s_warp) {
        // ---------------- S warps: partial scores over dims [144w, 144w + 144), then the softmax
        const int sw = warp - FX_OW, st = tid - FX_OT;
        const int srow = st >> 3, se = st & 7;                   // softmax: row, keys 2 se, 2 se + 1
        const bool srow_ok = srow < nrows;
        const u8* vrow = visibility + ((long long)b * Q * Q + (long long)(srow_ok ? (row0 + srow) / H : 0) * Q - P);
        float m_run = neg_inf(), l_run = 0.f;
#pragma unroll 1
        for (int t = 0; t < nsub; ++t) {
            const int buf = t & 1;
            if (t >= 2) mbar_wait(mb_kp_full + 8 * buf, ((t >> 1) - 1) & 1);   // K pieces of t
            const unsigned char* kp = sKp + 3 * buf * FX_PIECE_BYTES;
            float acc[2][4], cx[2][3][4];
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] = cx[n][0][e] = cx[n][1][e] = cx[n][2][e] = 0.f;
#if FX_DIAG != 1
#pragma unroll 1
            for (int i0 = 0; i0 < FX_KSTEPS; i0 += 3) {
                // three k-steps at once: their A and B pieces first, then each of the six products
                // over the 3 x 2 (k-step, n tile) fragments, six independent MMAs in flight
                u32 a[3][3][4], bk[3][3][4];                     // [k-step][piece]; bk: n0 b0 b1, n1 b0 b1
#pragma unroll
                for (int u = 0; u < 3; ++u) {
                    const int kstep = FX_KSTEPS * sw + i0 + u;
#pragma unroll
                    for (int p = 0; p < 3; ++p) {
                        ldmatrix_x4(a[u][p], sQp + p * FX_PIECE_BYTES + fx_at(lrow, 2 * kstep + lhi));
                        // matrices: keys 0-7 dims lo / hi, keys 8-15 dims lo / hi
                        ldmatrix_x4(bk[u][p], kp + p * FX_PIECE_BYTES +
                                              fx_at((lane & 7) + 8 * lhi, 2 * kstep + ((lane >> 3) & 1)));
                    }
                }
#pragma unroll
                for (int u = 0; u < 3; ++u)
#pragma unroll
                    for (int n = 0; n < 2; ++n) {
                        float c[4] = {0.f, 0.f, 0.f, 0.f};
                        mma_bf16_16816(c, a[u][0], bk[u][0][2 * n], bk[u][0][2 * n + 1]);
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
                            mma_bf16_16816(cx[n][u], a[u][AP[k]], bk[u][BP[k]][2 * n], bk[u][BP[k]][2 * n + 1]);
            }
#endif
            {   // the partial to sS[buf] (its previous readers, the S threads, passed barrier 1 since)
                float* ss = sS + buf * FX_S_FLOATS + sw * FX_ROWS * FX_KEYS;
                const int sk = 8 * ((g >> 1) & 1);               // rows g, g + 8 share it
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const int key = (8 * n + 2 * t4) ^ sk;
                    float v[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) v[e] = acc[n][e] + ((cx[n][0][e] + cx[n][1][e]) + cx[n][2][e]);
                    *(float2*)(ss + g * FX_KEYS + key) = make_float2(v[0], v[1]);
                    *(float2*)(ss + (g + 8) * FX_KEYS + key) = make_float2(v[2], v[3]);
                }
            }
            named_barrier(1, 32 * FX_SW);                        // every partial of t written
            // softmax of row srow, keys 2 se, 2 se + 1
            const float* ss = sS + buf * FX_S_FLOATS + srow * FX_KEYS + ((2 * se) ^ (8 * ((srow >> 1) & 1)));
            float2 d = *(const float2*)ss;
#pragma unroll
            for (int w = 1; w < FX_SW; ++w) {
                const float2 e = *(const float2*)(ss + w * FX_ROWS * FX_KEYS);
                d.x += e.x; d.y += e.y;
            }
            const int j0 = kbeg + t * FX_KEYS + 2 * se;
            float s[2], mx = neg_inf();
            bool ok[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int j = j0 + k;
                bool a = srow_ok && j < kend;
                if (a && j >= P) a = vrow[j] != 0;
                ok[k] = a;
                s[k] = a ? (k ? d.y : d.x) * sm_scale : neg_inf();
                mx = fmaxf(mx, s[k]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            const float m_new = fmaxf(m_run, mx);
            const float p0 = ok[0] ? expf(s[0] - m_new) : 0.f;   // ok => m_new finite
            const float p1 = ok[1] ? expf(s[1] - m_new) : 0.f;
            const float alpha = m_new == neg_inf() ? 1.f : expf(m_run - m_new);
            float ps = p0 + p1;
            ps += __shfl_xor_sync(0xffffffffu, ps, 1);
            ps += __shfl_xor_sync(0xffffffffu, ps, 2);
            ps += __shfl_xor_sync(0xffffffffu, ps, 4);
            l_run = l_run * alpha + ps;
            m_run = m_new;
            u32 pp[3];
            split3(p0, p1, pp[0], pp[1], pp[2]);
            // P and alpha of t to buffer buf once the O warps have read t - 2's
            if (t >= 2) mbar_wait(mb_empty_s + 8 * buf, ((t >> 1) - 1) & 1);
            unsigned char* pb = sPp + buf * FX_PP_BYTES + srow * 32 + 16 * ((se >> 2) ^ ((srow >> 2) & 1)) + 4 * (se & 3);
#pragma unroll
            for (int p = 0; p < 3; ++p) *(u32*)(pb + p * FX_ROWS * FX_KEYS * 2) = pp[p];
            if (se == 0) sAlpha[buf * FX_ROWS + srow] = alpha;
            mbar_arrive(mb_full + 8 * buf);
        }
        // the row statistics: lse, or the split's m and l; l for the O warps' normalisation
        if (se == 0) {
            sL[srow] = l_run;
            if (srow_ok) {
                const size_t grow = grow0 + srow;
                if (n_splits == 1) {
                    lse[grow] = m_run + logf(l_run);
                } else {
                    ws_m[(size_t)z * rows_total + grow] = m_run;
                    ws_l[(size_t)z * rows_total + grow] = l_run;
                }
            }
        }
        mbar_arrive(mb_fin);
        return;
    }

    // ---------------- O warps: O = alpha O + P V on 64 columns, then the split of sub-tile t + 2
    const int col0 = 64 * warp;                                  // this warp's value columns
    float o[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

#pragma unroll 1
    for (int t = 0; t < nsub; ++t) {
        const int buf = t & 1;
        if (t >= 2) mbar_wait(mb_kp_full + 8 * buf, ((t >> 1) - 1) & 1);   // K pieces of t (other lanes')
        mbar_wait(mb_full + 8 * buf, (t >> 1) & 1);              // P, alpha of t
        u32 pa[3][4];
        const unsigned char* pb = sPp + buf * FX_PP_BYTES + lrow * 32 + 16 * (lhi ^ ((lrow >> 2) & 1));
#pragma unroll
        for (int p = 0; p < 3; ++p) ldmatrix_x4(pa[p], pb + p * FX_ROWS * FX_KEYS * 2);
        const float al0 = sAlpha[buf * FX_ROWS + g], al1 = sAlpha[buf * FX_ROWS + g + 8];
        mbar_arrive(mb_empty_s + 8 * buf);                       // this thread's reads of P, alpha done
        const unsigned char* kp = sKp + 3 * buf * FX_PIECE_BYTES;
#pragma unroll
        for (int j0 = 0; j0 < 8; j0 += 4) {
            // four n tiles (32 columns) at once: V pieces by ldmatrix.trans (keys 0-7 / 8-15 of 8
            // columns, then of the next 8), each of the six products over the four, smallest first
            u32 bv[2][3][4];                                     // [column pair][piece]: n lo b0 b1, n hi b0 b1
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int p = 0; p < 3; ++p)
                    ldmatrix_x4_trans(bv[h][p], kp + p * FX_PIECE_BYTES +
                                                fx_at(lrow, (col0 + 8 * (j0 + 2 * h)) / 8 + lhi));
            float c[4][4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) c[jj][0] = c[jj][1] = c[jj][2] = c[jj][3] = 0.f;
#if FX_DIAG != 2
            constexpr int AP[6] = {2, 1, 0, 1, 0, 0}, BP[6] = {0, 1, 2, 0, 1, 0};
#pragma unroll
            for (int k = 0; k < 6; ++k)
#pragma unroll
                for (int jj = 0; jj < 4; ++jj)
                    mma_bf16_16816(c[jj], pa[AP[k]], bv[jj >> 1][BP[k]][2 * (jj & 1)],
                                   bv[jj >> 1][BP[k]][2 * (jj & 1) + 1]);
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
        if (t + 2 < nsub) {
            // slot buf is free: the S warps are past FULL of t, and this warp's own reads of its
            // columns are done (__syncwarp); split sub-tile t + 2 from the staging slot into it
            __syncwarp();
            cp_async_wait<0>();
            unsigned char* dst = sKp + 3 * buf * FX_PIECE_BYTES;
#pragma unroll
            for (int i = 0; i < FX_OWN; ++i) {
                int key, ch;
                own(i, key, ch);
                split_store(dst, key, ch, *(const float4*)(sStage + key * ATTN_D + 4 * ch));
            }
            if (t + 3 < nsub) stage_own(t + 3);
            cp_async_commit();
            mbar_arrive(mb_kp_full + 8 * buf);
        }
    }
    cp_async_wait<0>();

    // ---------------- epilogue: O rows g, g + 8 (normalised when the keys are not split)
    mbar_wait(mb_fin, 0);                                        // sL written
    const bool direct = n_splits == 1;
    float* base = (direct ? out : ws_o + (size_t)z * rows_total * ATTN_DV) + grow0 * ATTN_DV + col0 + 2 * t4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {                                // h = 0: row g (c0, c1), 1: row g + 8
        const int r = g + 8 * h;
        if (r < nrows) {
            const float l = direct ? sL[r] : 1.f;
            float* dst = base + (size_t)r * ATTN_DV;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float2 w = make_float2(o[j][2 * h], o[j][2 * h + 1]);
                if (direct) w = make_float2(w.x / l, w.y / l);
                *(float2*)(dst + 8 * j) = w;
            }
        }
    }
}

// grid = B*Q*H rows, block = MERGE_THREADS (128): attn_common.cuh's merge_row_batched
ATTN_MERGE_BATCHED_ENTRY(verify_attn_fp32_bf16x3_merge, FX_MAXZ)
