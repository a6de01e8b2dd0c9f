// verify_attn, variant fp32, "bf16x3": MLA absorbed tree-verify attention, contiguous layout (ops.md §2),
// on the bf16 tensor cores without losing a bit of the fp32 inputs. Every fp32 operand x is split
// exactly into three bf16 pieces, x = x0 + x1 + x2 (x0 = bf16_rn(x), x1 = bf16_rn(x - x0), x2 = x - x0
// - x1; 8 + 8 + 8 significand bits hold fp32's 24), and a product a * b becomes the six piece
// products with i + j <= 2 (a0b0, a0b1, a1b0, a0b2, a1b1, a2b0); the three left out are at most
// about 2^-23 |a b| together (each piece is at most 2^-8 of the one before), the size of fp32's own
// rounding of a product. A bf16 x bf16 product is exact in fp32. Why: on the H200 an exact fp32
// kernel on FFMA / DMMA tops out near 62 TFLOP/s for all of its units together (kernels/NOTES.md,
// "Session 5"), while mma.sync bf16 runs at 0.57 MMA/clk/SM (~600 TFLOP/s; "Session 6"). The split
// conversions (F2FP) take the tensor pipe's time, so every operand is split once, by a kernel of its
// own, and the main kernel only streams pieces (session 7: splitting in the main kernel cost ~8 us).
//
// Launch (pieces): grid = (4 * (ceil(S / 16) + ceil(Q*H / 16)), B), block = 144 (FX_CH); below.
//   verify_attn_fp32_bf16x3_pieces(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B], Q, H, S,
//                                  pieces u8 [B][ceil(S/16) + ceil(Q*H/16)][FX_TILE_BYTES])
// Launch (main): grid = (ceil(Q*H / 16), B, n_splits), block = FX_THREADS (384), dynamic shared
//   memory FX_SMEM_BYTES (231,128 B: opt-in; one block per SM; the kernel traps with less); sm_90+.
//   verify_attn_fp32_bf16x3(pieces, prefix_len i32 [B], visibility u8 [B,Q,Q], B, Q, H, S,
//                           sm_scale, n_splits, out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   A block owns 16 consecutive (token, head) rows of one request (one m16 tile) and one split of
//   its keys: chunk = ceil(kvlen / n_splits) rounded up to 16, kvlen = prefix_len[b] + Q; split z
//   has keys [z*chunk, min(kvlen, (z+1)*chunk)) (possibly empty: m = -inf, l = 0), walked in 16-key
//   sub-tiles, each one tile of `pieces` (chunk is a multiple of 16, so sub-tiles are whole tiles).
//   n_splits == 1 writes out/lse; otherwise the partials of attn_common.cuh and
//   verify_attn_fp32_bf16x3_merge (grid = B*Q*H, block = 128). At B=1 H=16 Q=17 P=2048 the host
//   picks 7 splits: 17 row tiles x 7 = 119 blocks of <= 304 keys (19 sub-tiles).
//
// Loads: thread 0 initialises the mbarriers and bulk-copies (cp.async.bulk, completion on an
//   mbarrier's transaction count) the Q tile's pieces and sub-tiles 0..2 into three K-piece slots;
//   afterwards O thread 0 refills slot t % 3 with sub-tile t + 3 once every O thread has released it.
// Warp roles (hand-offs through mbarriers; each thread arrives after its own accesses):
//   S warps 8..11 (one per SM sub-partition), MMAs only, per sub-tile t: S[16 rows][16 keys] over
//     dims [144w, 144w + 144) with mma.m16n8k16 bf16 (A = Q pieces, B = K pieces, both ldmatrix).
//     The a0b0 product of each 16-dim k-step goes into a zeroed accumulator that is then added to
//     the partial in fp32 (round to nearest); the five smaller products accumulate in chains of
//     their own (k-step mod 3), so the tensor cores' own accumulation never carries the partial sum:
//     partial = main + ((x0 + x1) + x2) -> sS[t & 1]; arrive S_FULL.
//   O warps 0..7, per sub-tile t: the softmax, thread ot owning row ot / 16 and key ot % 16 (the four
//     partials added in w order; 16-lane shuffles), P split into pieces -> sPp, alpha -> sAlpha
//     (named barrier 1 before and after the writes); then P pieces (ldmatrix) and alpha; O[16][64w
//     ..+64) = alpha O + P V with V pieces by ldmatrix.trans, per n8 tile the six products smallest
//     first into a zeroed C, then O = fmaf(alpha, O, C).
//   mbarriers: S_FULL[2] (128 S threads: partials of t in sS[t & 1]), S_EMPTY[2] (256 O threads:
//     read), Q_FULL and KP_FULL[3] (one arrival with the copy's bytes), KP_EMPTY[3] (256 O threads:
//     the slot's V pieces read; the S warps' reads of it precede S_FULL of t).
//   Measured on the H200 (kernels/NOTES.md, "Session 7"): 39.6-41.1 us at the timing shape against
//   fp32_dmma's 50.1-51.8 in one process; of that ~9 us is the pieces kernel, the merge and their
//   launches (FX_DIAG=4) and ~2.4 us the first loads (FX_DIAG=3).
//
// Numerical contract: no bit of an fp32 input is dropped; every product of two pieces is exact in
//   fp32; per 16 products the tensor cores add in their own order and rounding, after which sums
//   are fp32 round-to-nearest: s_j = fl(partial sum over 576 dims) * sm_scale. Per 16-key sub-tile
//   one online softmax step in fp32: m_new = max(m_old, max_j s_j), p_j = expf(s_j - m_new), alpha
//   = expf(m_old - m_new) (1 while m_new is -inf), l = alpha l + sum_j p_j (xor-1, -2, -4, -8
//   shuffles); O = fmaf(alpha, O, sum_j p_j v_j) with the 16 keys' products summed on the tensor
//   cores. out = O / l, lse = m + logf(l). Prefix keys are always visible, tree key j iff
//   visibility[b, i, j - prefix_len]; kv rows at or past prefix_len[b] + Q (NaN padding) and q rows
//   past the request's Q*H are never read (their pieces are zeros) and masked keys get p = 0 exactly.
//   Target: relative L2 <= 1e-6 against float64 (ops.md fp32 tolerances).
//
// Knobs (timing only, wrong results): FX_DIAG = 1 no score MMAs, 2 no P.V MMAs, 3 only the first
//   loads, 4 the launches alone.
//
// Shared memory (FX_SMEM_BYTES = 231,128 B):
//   sQp    [3 pieces][16 rows][576] bf16, 16-byte chunk c of row r at c ^ (r & 7)       55,296
//   sKp    [3 slots][3 pieces][16 keys][576] bf16, the same swizzle                    165,888
//   sS     [2][4 S warps][16 rows][16 keys] fp32 partials, key k of row r at k ^ 8 ((r >> 1) & 1)
//                                                                                        8,192
//   sPp    [3 pieces][16 rows][16 keys] bf16, 8-key half h of row r at h ^ ((r >> 2) & 1)
//                                                                                        1,536
//   sAlpha [16], sL [16] fp32                                                              128
//   11 mbarriers                                                                            88
#include "attn_common.cuh"

#define FX_ROWS 16                               // rows per block: one m16 tile
#define FX_KEYS 16                               // keys per sub-tile
#define FX_SW 4                                  // S warps: split over 4 dim quarters
#define FX_OW 8                                  // O warps: 64 value columns each
#define FX_OT (FX_OW * 32)
#define FX_THREADS ((FX_SW + FX_OW) * 32)        // 384
#define FX_CH (ATTN_D / 4)                       // 16-byte fp32 chunks per row (144)
#define FX_KSTEPS (ATTN_D / (16 * FX_SW))        // k16 steps per S warp (9)
#define FX_PIECE_BYTES (16 * ATTN_D * 2)         // one [16][576] bf16 piece
#define FX_TILE_BYTES (3 * FX_PIECE_BYTES)       // a tile's three pieces: 55,296 B
#define FX_SLOTS 3                               // K-piece slots: sub-tiles t + 1, t + 2 load during t
#define FX_S_FLOATS (FX_SW * FX_ROWS * FX_KEYS)  // one sS buffer: a partial per dim quarter
#define FX_PP_BYTES (3 * FX_ROWS * FX_KEYS * 2)  // sPp
#define FX_SMEM_BYTES ((1 + FX_SLOTS) * FX_TILE_BYTES + 2 * FX_S_FLOATS * 4 + FX_PP_BYTES + 2 * FX_ROWS * 4 \
                       + 8 * (5 + 2 * FX_SLOTS))
#define FX_PIECES_ROWS 4                         // pieces kernel: rows a block (one 16-byte chunk a thread each)
#define FX_PIECES_SPLIT (FX_ROWS / FX_PIECES_ROWS)   // blocks a tile
#define FX_MAXZ 16                               // merge: splits loaded per batch
#ifndef FX_DIAG
// timing only: 1 no score MMAs, 2 no P.V MMAs, 3 only the prologue's loads, 4 nothing (the launch alone)
#define FX_DIAG 0
#endif

#if FX_ROWS * FX_KEYS != FX_OT || FX_KSTEPS % 3 || FX_KSTEPS * 16 * FX_SW != ATTN_D
#error "the softmax gives each O thread one key of one row; S warps take whole triples of k-steps"
#endif
#if 64 * FX_OW != ATTN_DV || FX_PIECES_SPLIT * FX_PIECES_ROWS != FX_ROWS
#error "O warp w owns value columns [64w, 64w + 64); the pieces blocks of a tile cover its rows"
#endif
#if defined(FX_EXPECT_SMEM) && FX_EXPECT_SMEM != FX_SMEM_BYTES
#error "FX_SMEM_BYTES differs from the host's CUDA_KERNELS entry (kdtr/ops/verify_attn.py)"
#endif
#if defined(FX_EXPECT_THREADS) && FX_EXPECT_THREADS != FX_THREADS
#error "FX_THREADS differs from the host's CUDA_KERNELS entry (kdtr/ops/verify_attn.py)"
#endif
#if defined(FX_EXPECT_PIECES) && FX_EXPECT_PIECES != FX_TILE_BYTES * 1000000 + FX_PIECES_SPLIT * 1000 + FX_CH
#error "the pieces kernel's tile bytes, blocks a tile or block size differ from run_cuda's (kdtr/ops/verify_attn.py)"
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

// grid = (FX_PIECES_SPLIT * (ceil(S / 16) + ceil(Q*H / 16)), B), block = FX_CH (144): block x is rows
// [16 (x / FX_PIECES_SPLIT) + FX_PIECES_ROWS (x % FX_PIECES_SPLIT), + FX_PIECES_ROWS) of tile x /
// FX_PIECES_SPLIT, one 16-byte chunk per thread and row. Tile i < ceil(S / 16) is kv rows [16i, 16i +
// 16) of request b, the rest are its q row tiles; each becomes FX_TILE_BYTES of `pieces` at tile
// index b * (kv tiles + q tiles) + i, laid out as the main kernel's shared memory holds it. kv rows at
// or past prefix_len[b] + Q and q rows past Q*H are zeros; kv tiles wholly past them are never read.
extern "C" __global__ void __launch_bounds__(FX_CH)
verify_attn_fp32_bf16x3_pieces(const float* __restrict__ q, const float* __restrict__ kv,
                               const int* __restrict__ prefix_len, int Q, int H, int S,
                               unsigned char* __restrict__ pieces) {
    const int b = blockIdx.y, tile = blockIdx.x / FX_PIECES_SPLIT, c = threadIdx.x;
    const int r0 = FX_PIECES_ROWS * (blockIdx.x % FX_PIECES_SPLIT);   // first row of the block in its tile
    const int kv_tiles = (S + FX_KEYS - 1) / FX_KEYS, q_tiles = (Q * H + FX_ROWS - 1) / FX_ROWS;
    const bool is_kv = tile < kv_tiles;
    const int row0 = FX_ROWS * (is_kv ? tile : tile - kv_tiles);
    const int valid = (is_kv ? prefix_len[b] + Q : Q * H) - row0;   // rows of the tile with data
    if (is_kv && valid <= 0) return;
    const float* src = is_kv ? kv + ((size_t)b * S + row0) * ATTN_D : q + ((size_t)b * Q * H + row0) * ATTN_D;
    unsigned char* dst = pieces + ((size_t)b * (kv_tiles + q_tiles) + tile) * FX_TILE_BYTES;
    float4 v[FX_PIECES_ROWS];                                    // all loads in flight before the first split
#pragma unroll
    for (int i = 0; i < FX_PIECES_ROWS; ++i)
        v[i] = r0 + i < valid ? __ldg((const float4*)(src + (size_t)(r0 + i) * ATTN_D + 4 * c))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < FX_PIECES_ROWS; ++i) split_store(dst, r0 + i, c, v[i]);
}

extern "C" __global__ void __launch_bounds__(FX_THREADS, 1)
verify_attn_fp32_bf16x3(const unsigned char* __restrict__ pieces, const int* __restrict__ prefix_len,
                        const u8* __restrict__ visibility, int B, int Q, int H, int S, float sm_scale,
                        int n_splits, float* __restrict__ out, float* __restrict__ lse,
                        float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    if (dynamic_smem_bytes() < FX_SMEM_BYTES) __trap();         // host and kernel disagree
    unsigned char* sQp = smem_raw;
    unsigned char* sKp = sQp + FX_TILE_BYTES;
    float* sS = (float*)(sKp + FX_SLOTS * FX_TILE_BYTES);
    unsigned char* sPp = (unsigned char*)(sS + 2 * FX_S_FLOATS);
    float* sAlpha = (float*)(sPp + FX_PP_BYTES);
    float* sL = sAlpha + FX_ROWS;
    // S_FULL 0,1 | S_EMPTY 2,3 | Q_FULL 4 | KP_FULL 5.. | KP_EMPTY 5 + FX_SLOTS..
    const unsigned mb = smem_addr(sL + FX_ROWS);
    const unsigned mb_s_full = mb, mb_s_empty = mb + 16, mb_q_full = mb + 32, mb_kp_full = mb + 40,
                   mb_kp_empty = mb_kp_full + 8 * FX_SLOTS;

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
    const int kv_tiles = (S + FX_KEYS - 1) / FX_KEYS;
    const unsigned char* tiles = pieces + (size_t)b * (kv_tiles + (rows_req + FX_ROWS - 1) / FX_ROWS) * FX_TILE_BYTES;
    const unsigned char* ktiles = tiles + (size_t)(kbeg / FX_KEYS) * FX_TILE_BYTES;   // sub-tile 0 of the split
    const bool s_warp = warp >= FX_OW;                           // warp-uniform role
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lhi = lane >> 4;   // ldmatrix x4 addressing

#if FX_DIAG == 4
    return;
#endif
    if (tid == 0) {     // mbarriers, then the Q tile's pieces and the first FX_SLOTS sub-tiles
        for (int i = 0; i < 2; ++i) {
            mbar_init(mb_s_full + 8 * i, 32 * FX_SW);
            mbar_init(mb_s_empty + 8 * i, FX_OT);
        }
        mbar_init(mb_q_full, 1);
        for (int i = 0; i < FX_SLOTS; ++i) {
            mbar_init(mb_kp_full + 8 * i, 1);
            mbar_init(mb_kp_empty + 8 * i, FX_OT);
        }
        mbar_fence_init();
        bulk_load(sQp, tiles + (size_t)(kv_tiles + blockIdx.x) * FX_TILE_BYTES, FX_TILE_BYTES, mb_q_full);
        for (int i = 0; i < min(FX_SLOTS, nsub); ++i)
            bulk_load(sKp + i * FX_TILE_BYTES, ktiles + (size_t)i * FX_TILE_BYTES, FX_TILE_BYTES, mb_kp_full + 8 * i);
    }
    __syncthreads();                                             // mbarriers initialised

    if (s_warp) {
        // ---------------- S warps: partial scores over their FX_KSTEPS k16 steps, nothing else
        const int sw = warp - FX_OW;                             // dim quarter
        mbar_wait(mb_q_full, 0);
#if FX_DIAG == 3
        for (int i = 0; i < min(FX_SLOTS, nsub); ++i) mbar_wait(mb_kp_full + 8 * i, 0);
        return;
#endif
#pragma unroll 1
        for (int t = 0; t < nsub; ++t) {
            const int buf = t & 1, slot = t % FX_SLOTS;
            mbar_wait(mb_kp_full + 8 * slot, (t / FX_SLOTS) & 1);   // K pieces of t
            const unsigned char* kp = sKp + slot * FX_TILE_BYTES;
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
            // the partial to sS[buf] once the O warps have read t - 2's
            if (t >= 2) mbar_wait(mb_s_empty + 8 * buf, ((t >> 1) - 1) & 1);
            float* ss = sS + buf * FX_S_FLOATS + sw * FX_ROWS * FX_KEYS;
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
            mbar_arrive(mb_s_full + 8 * buf);
        }
        return;
    }

    // ---------------- O warps, per sub-tile: the softmax (thread tid: row tid / 16, key tid % 16),
    // then O = alpha O + P V on 64 columns; thread 0 refills the slot they free
    const int srow = tid >> 4, skey = tid & 15;
    const bool srow_ok = srow < nrows;
    const u8* vrow = visibility + ((long long)b * Q * Q + (long long)(srow_ok ? (row0 + srow) / H : 0) * Q - P);
    const float* ss_at = sS + srow * FX_KEYS + (skey ^ (8 * ((srow >> 1) & 1)));
    unsigned char* pp_at = sPp + srow * 32 + 16 * ((skey >> 3) ^ ((srow >> 2) & 1)) + 2 * (skey & 7);
    float m_run = neg_inf(), l_run = 0.f;
    const int col0 = 64 * warp;                                  // this warp's value columns
    float o[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
#if FX_DIAG == 3
    return;
#endif

#pragma unroll 1
    for (int t = 0; t < nsub; ++t) {
        const int buf = t & 1, slot = t % FX_SLOTS, use = (t / FX_SLOTS) & 1;
        mbar_wait(mb_s_full + 8 * buf, (t >> 1) & 1);            // the partials of t
        float d = ss_at[buf * FX_S_FLOATS];
#pragma unroll
        for (int w = 1; w < FX_SW; ++w) d += ss_at[buf * FX_S_FLOATS + w * FX_ROWS * FX_KEYS];
        mbar_arrive(mb_s_empty + 8 * buf);                       // this thread's reads of sS[buf] done
        const int j = kbeg + t * FX_KEYS + skey;
        bool ok = srow_ok && j < kend;
        if (ok && j >= P) ok = vrow[j] != 0;
        const float s = ok ? d * sm_scale : neg_inf();
        float mx = s;
#pragma unroll
        for (int x = 1; x < 16; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
        const float m_new = fmaxf(m_run, mx);
        const float p = ok ? expf(s - m_new) : 0.f;              // ok => m_new finite
        const float alpha = m_new == neg_inf() ? 1.f : expf(m_run - m_new);
        float ps = p;
#pragma unroll
        for (int x = 1; x < 16; x <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, x);
        l_run = l_run * alpha + ps;
        m_run = m_new;
        u32 pp[3];
        split3(p, 0.f, pp[0], pp[1], pp[2]);
        named_barrier(1, FX_OT);                                 // every O thread has read P, alpha of t - 1
#pragma unroll
        for (int i = 0; i < 3; ++i) *(u16*)(pp_at + i * FX_ROWS * FX_KEYS * 2) = (u16)pp[i];
        if (skey == 0) sAlpha[srow] = alpha;
        named_barrier(1, FX_OT);                                 // P, alpha of t written
        u32 pa[3][4];
        const unsigned char* pb = sPp + lrow * 32 + 16 * (lhi ^ ((lrow >> 2) & 1));
#pragma unroll
        for (int i = 0; i < 3; ++i) ldmatrix_x4(pa[i], pb + i * FX_ROWS * FX_KEYS * 2);
        const float al0 = sAlpha[g], al1 = sAlpha[g + 8];
        mbar_wait(mb_kp_full + 8 * slot, use);                   // V pieces of t
        const unsigned char* kp = sKp + slot * FX_TILE_BYTES;
#pragma unroll
        for (int j0 = 0; j0 < 8; j0 += 4) {
            // four n tiles (32 columns) at once: V pieces by ldmatrix.trans (keys 0-7 / 8-15 of 8
            // columns, then of the next 8), each of the six products over the four, smallest first
            u32 bv[2][3][4];                                     // [column pair][piece]: n lo b0 b1, n hi b0 b1
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 3; ++i)
                    ldmatrix_x4_trans(bv[h][i], kp + i * FX_PIECE_BYTES +
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
                const int jc = j0 + jj;
                o[jc][0] = fmaf(al0, o[jc][0], c[jj][0]);
                o[jc][1] = fmaf(al0, o[jc][1], c[jj][1]);
                o[jc][2] = fmaf(al1, o[jc][2], c[jj][2]);
                o[jc][3] = fmaf(al1, o[jc][3], c[jj][3]);
            }
        }
        // the slot is free once every O thread has read it (the S warps read it before S_FULL of t)
        mbar_arrive(mb_kp_empty + 8 * slot);
        if (tid == 0 && t + FX_SLOTS < nsub) {
            mbar_wait(mb_kp_empty + 8 * slot, use);
            bulk_load(sKp + slot * FX_TILE_BYTES, ktiles + (size_t)(t + FX_SLOTS) * FX_TILE_BYTES, FX_TILE_BYTES,
                      mb_kp_full + 8 * slot);
        }
    }
    // the row statistics: lse, or the split's m and l; l for the normalisation below
    if (skey == 0) {
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
    named_barrier(1, FX_OT);                                     // sL written

    // ---------------- epilogue: O rows g, g + 8 (normalised when the keys are not split)
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
