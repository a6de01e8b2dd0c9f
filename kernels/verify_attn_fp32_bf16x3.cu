// verify_attn, variant fp32, kernel `fp32_bf16x3`: MLA absorbed tree-verify attention, contiguous layout (docs/ops/verify_attn.md),
// on the bf16 tensor cores without losing a bit of the fp32 inputs. Every fp32 operand x is split
// exactly into three bf16 pieces, x = x0 + x1 + x2 (x0 = bf16_rn(x), x1 = bf16_rn(x - x0), x2 = x - x0
// - x1; 8 + 8 + 8 significand bits hold fp32's 24), and a product a * b becomes the six piece
// products with i + j <= 2 (a0b0, a0b1, a1b0, a0b2, a1b1, a2b0); the three left out are at most
// about 2^-23 |a b| together (each piece is at most 2^-8 of the one before), the size of fp32's own
// rounding of a product. A bf16 x bf16 product is exact in fp32. The split conversions (F2FP) take
// the tensor pipe's time, so every operand is split once, by a kernel of its own, and the main kernel
// only streams pieces (why: kernels/NOTES.md).
//
// Launch (pieces): grid = (4 * (ceil(S / 16) + ceil(Q*H / 16)), B), block = 144 (FX_CH); below.
//   verify_attn_fp32_bf16x3_pieces(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B], Q, H, S,
//                                  pieces u8 [B][ceil(S/16) + ceil(Q*H/16)][FX_TILE_BYTES])
// Launch (main): grid = (ceil(Q*H / 16), B, n_splits), block = FX_THREADS (512), dynamic shared
//   memory FX_SMEM_BYTES (229,576 B: opt-in; one block per SM; the kernel traps with less); sm_90+,
//   built for sm_90a (FX_QREG below).
//   verify_attn_fp32_bf16x3(pieces, prefix_len i32 [B], visibility u8 [B,Q,Q], B, Q, H, S,
//                           sm_scale, n_splits, out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   A block owns 16 consecutive (token, head) rows of one request (one m16 tile) and one split of
//   its keys: chunk = ceil(kvlen / n_splits) rounded up to 16, kvlen = prefix_len[b] + Q; split z
//   has keys [z*chunk, min(kvlen, (z+1)*chunk)) (possibly empty: m = -inf, l = 0), walked in 16-key
//   sub-tiles, each one tile of `pieces` (chunk is a multiple of 16, so sub-tiles are whole tiles).
//   n_splits == 1 writes out/lse; otherwise the partials of attn_common.cuh and
//   verify_attn_fp32_bf16x3_merge (grid = B*Q*H, block = 128). The host picks n_splits by a wave
//   model (splits_for in kdtr/ops/verify_attn/cuda.py): at B=1 H=16 Q=17 P=2048 7 splits, 17 row
//   tiles x 7 = 119 blocks of <= 304 keys (19 sub-tiles); at B=4 P=8192 7 splits, 476 blocks.
//   The host may launch all three kernels as programmatic dependents (each passes grid_dep_wait
//   before its first global access and lets the next grid launch at once).
//
// Loads: thread 0 initialises the mbarriers and bulk-copies (cp.async.bulk, completion on an
//   mbarrier's transaction count) the Q tile's pieces and sub-tiles 0..2 into three K-piece slots.
//   With FX_QREG the Q tile's room becomes a fourth slot once the S warps hold Q in registers
//   (Q_EMPTY): softmax thread 0 copies sub-tile 3 there. Afterwards O thread 0 refills slot
//   t % FX_SLOTS with sub-tile t + FX_SLOTS once every O thread has released it.
// Warp roles, one warpgroup each but the O warps' two (hand-offs through mbarriers; each thread
//   arrives after its own accesses):
//   S warps 8..11 (one per SM sub-partition), MMAs only, per sub-tile t: S[16 rows][16 keys] over
//     dims [144w, 144w + 144) with mma.m16n8k16 bf16 (A = Q pieces, B = K pieces, both ldmatrix).
//     With FX_QREG (sm_90a / sm_100a) setmaxnreg gives them FX_NREG_S registers and they load their
//     Q pieces once (108 registers) instead of every sub-tile. The a0b0 product of each 16-dim k-step
//     goes into a zeroed accumulator that is then added to the partial in fp32 (round to nearest);
//     the five smaller products accumulate in chains of their own (k-step mod 3), so the tensor
//     cores' own accumulation never carries the partial sum: partial = main + ((x0 + x1) + x2) ->
//     sS[t & 1]; arrive S_FULL.
//   Softmax warps 12..15, per sub-tile t: thread st owns row st / 8 and keys 2 (st % 8), +1 (the four
//     partials added in w order), row max and sum over 8 lanes (xor 1, 2, 4); named barrier 2 (all
//     partials read), then P split into pieces and alpha written over the partials in sS[t & 1];
//     arrive P_FULL. They keep m and l and write lse or the split's m, l and sL at the end (L_FULL).
//   O warps 0..7, per sub-tile t: P pieces (ldmatrix) and alpha from sS[t & 1], arrive S_EMPTY;
//     O[16][64w ..+64) = alpha O + P V with V pieces by ldmatrix.trans, per n8 tile the six products
//     smallest first into a zeroed C, then O = fmaf(alpha, O, C); arrive KP_EMPTY.
//   mbarriers: S_FULL[2] (128 S threads: partials of t in sS[t & 1]), P_FULL[2] (128 softmax
//     threads: P of t there), S_EMPTY[2] (256 O threads: P read, the buffer free), Q_FULL and
//     KP_FULL[4] (one arrival with the copy's bytes), Q_EMPTY (128 S threads: Q in registers),
//     KP_EMPTY[4] (256 O threads: the slot's V pieces read; the S warps' reads of it precede S_FULL
//     of t), L_FULL (128 softmax threads: sL written).
//
// Numerical contract: no bit of an fp32 input is dropped; every product of two pieces is exact in
//   fp32; per 16 products the tensor cores add in their own order and rounding, after which sums
//   are fp32 round-to-nearest: s_j = fl(partial sum over 576 dims) * sm_scale. Per 16-key sub-tile
//   one online softmax step in fp32: m_new = max(m_old, max_j s_j), p_j = expf(s_j - m_new), alpha
//   = expf(m_old - m_new) (1 while m_new is -inf), l = alpha l + sum_j p_j (a balanced tree in key
//   order: pairs, quads, eights, then the partner lane's half); O = fmaf(alpha, O, sum_j p_j v_j) with the 16 keys' products summed on the tensor
//   cores. out = O / l, lse = m + logf(l). Prefix keys are always visible, tree key j iff
//   visibility[b, i, j - prefix_len]; kv rows at or past prefix_len[b] + Q (NaN padding) and q rows
//   past the request's Q*H are never read (their pieces are zeros) and masked keys get p = 0 exactly.
//   Target: relative L2 <= 1e-6 against float64 (docs/ops/verify_attn.md, tolerances).
//
// Knobs: FX_DIAG (timing only, wrong results) = 1 no score MMAs, 2 no P.V MMAs, 3 only the first
//   loads, 4 the launches alone; FX_NREG_O / _S / _SM (all three together) the setmaxnreg split.
//
// Shared memory (FX_SMEM_BYTES = 229,576 B):
//   sQp    [3 pieces][16 rows][576] bf16, 16-byte chunk c of row r at c ^ (r & 7)       55,296
//   slots  [3][3 pieces][16 keys][576] bf16, the same swizzle (slot 3: sQp's room)      165,888
//   sS     [2][4 S warps][16 rows][16 keys] fp32 partials, key k of row r at k ^ 8 ((r >> 1) & 1);
//          after the softmax: P [3 pieces][16 rows][16 keys] bf16 (8-key half h of row r at
//          h ^ ((r >> 2) & 1)), then alpha [16] fp32                                    8,192
//   sL     [16] fp32                                                                      64
//   17 mbarriers                                                                          136
#include "attn_common.cuh"

#define FX_ROWS 16                               // rows per block: one m16 tile
#define FX_KEYS 16                               // keys per sub-tile
#define FX_SW 4                                  // S warps: split over 4 dim quarters
#define FX_OW 8                                  // O warps: 64 value columns each
#define FX_OT (FX_OW * 32)
#define FX_THREADS 512                           // 4 warpgroups: O warps, S warps, the softmax warp + 3 spare
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL)
#define FX_QREG 1                                // setmaxnreg: the S warps keep their Q pieces in registers
#else
#define FX_QREG 0
#endif
#define FX_CH (ATTN_D / 4)                       // 16-byte fp32 chunks per row (144)
#define FX_KSTEPS (ATTN_D / (16 * FX_SW))        // k16 steps per S warp (9)
#define FX_PIECE_BYTES (16 * ATTN_D * 2)         // one [16][576] bf16 piece
#define FX_TILE_BYTES (3 * FX_PIECE_BYTES)       // a tile's three pieces: 55,296 B
#ifndef FX_NREG_O                                // FX_QREG: registers per thread of the O, S and softmax
#define FX_NREG_O 104                            // warpgroups (2 O + S + softmax = 512; ptxas spills nothing
#define FX_NREG_S 240                            // at these in any FX_DIAG build)
#define FX_NREG_SM 64
#endif
#if 2 * FX_NREG_O + FX_NREG_S + FX_NREG_SM != 512
#error "setmaxnreg: the four warpgroups' registers must add up to the launch's 4 x 128"
#endif
#define FX_SLOTS (3 + FX_QREG)                   // K-piece slots; the 4th (FX_QREG) is the Q tile's once read
#define FX_SMW 4                                 // softmax warps: warpgroup 3
#define FX_ST (FX_SMW * 32)
#define FX_S_FLOATS (FX_SW * FX_ROWS * FX_KEYS)  // one sS buffer: a partial per dim quarter
#define FX_PP_BYTES (3 * FX_ROWS * FX_KEYS * 2)  // P's pieces, written over the partials they came from
#define FX_MBARS 17                              // S_FULL, S_EMPTY, P_FULL 2 each, Q_FULL, L_FULL, Q_EMPTY, KP_FULL 4, KP_EMPTY 4
#define FX_SMEM_BYTES (4 * FX_TILE_BYTES + 2 * FX_S_FLOATS * 4 + FX_ROWS * 4 + 8 * FX_MBARS)
#define FX_PIECES_ROWS 4                         // pieces kernel: rows a block (one 16-byte chunk a thread each)
#define FX_PIECES_SPLIT (FX_ROWS / FX_PIECES_ROWS)   // blocks a tile
#define FX_MAXZ 16                               // merge: splits loaded per batch
#ifndef FX_DIAG
// timing only: 1 no score MMAs, 2 no P.V MMAs, 3 only the prologue's loads, 4 nothing (the launch alone)
#define FX_DIAG 0
#endif

#if FX_ROWS * FX_KEYS != 2 * FX_ST || FX_PP_BYTES + 4 * FX_ROWS > 4 * FX_S_FLOATS || FX_KSTEPS % 3 \
    || FX_KSTEPS * 16 * FX_SW != ATTN_D || (FX_OW + FX_SW + FX_SMW) * 32 != FX_THREADS
#error "softmax threads own 2 keys of a row; P and alpha fit in an sS buffer; S warps take whole k-step triples; 4 warpgroups"
#endif
#if 64 * FX_OW != ATTN_DV || FX_PIECES_SPLIT * FX_PIECES_ROWS != FX_ROWS
#error "O warp w owns value columns [64w, 64w + 64); the pieces blocks of a tile cover its rows"
#endif
#if defined(FX_EXPECT_SMEM) && FX_EXPECT_SMEM != FX_SMEM_BYTES
#error "FX_SMEM_BYTES differs from the host's registry entry (kdtr/ops/verify_attn/cuda.py)"
#endif
#if defined(FX_EXPECT_THREADS) && FX_EXPECT_THREADS != FX_THREADS
#error "FX_THREADS differs from the host's registry entry (kdtr/ops/verify_attn/cuda.py)"
#endif
#if defined(FX_EXPECT_QREG) && FX_EXPECT_QREG != FX_QREG
#error "FX_QREG (setmaxnreg, Q in the score warps' registers) differs from what the test expects for this arch"
#endif
#if defined(FX_EXPECT_PIECES) && FX_EXPECT_PIECES != FX_TILE_BYTES * 1000000 + FX_PIECES_SPLIT * 1000 + FX_CH
#error "the pieces kernel's tile bytes, blocks a tile or block size differ from run_cuda's (kdtr/ops/verify_attn/cuda.py)"
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
    grid_dep_wait();                                             // q, kv written by the grids before
    grid_dep_launch();
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
    grid_dep_wait();                                             // the pieces kernel's writes
    grid_dep_launch();
    unsigned char* sQp = smem_raw;                               // the Q tile, then K-piece slot 3
    float* sS = (float*)(smem_raw + 4 * FX_TILE_BYTES);
    float* sL = sS + 2 * FX_S_FLOATS;
    // S_FULL 0,1 | S_EMPTY 2,3 | P_FULL 4,5 | Q_FULL 6 | L_FULL 7 | Q_EMPTY 8 | KP_FULL 9..12 | KP_EMPTY 13..16
    const unsigned mb = smem_addr(sL + FX_ROWS);
    const unsigned mb_s_full = mb, mb_s_empty = mb + 16, mb_p_full = mb + 32, mb_q_full = mb + 48,
                   mb_l_full = mb + 56, mb_q_empty = mb + 64, mb_kp_full = mb + 72, mb_kp_empty = mb + 104;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    ATTN_DENSE_REQUEST(FX_ROWS, FX_KEYS)
    const int nsub = (kend - kbeg + FX_KEYS - 1) / FX_KEYS;
    const int kv_tiles = (S + FX_KEYS - 1) / FX_KEYS;
    const unsigned char* tiles = pieces + (size_t)b * (kv_tiles + (rows_req + FX_ROWS - 1) / FX_ROWS) * FX_TILE_BYTES;
    const unsigned char* ktiles = tiles + (size_t)(kbeg / FX_KEYS) * FX_TILE_BYTES;   // sub-tile 0 of the split
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lhi = lane >> 4;   // ldmatrix x4 addressing
    // K-piece slot i: slots 0..2 follow the Q tile, slot 3 is the Q tile's room
    auto slot_at = [&](int i) { return smem_raw + ((i + 1) & 3) * FX_TILE_BYTES; };

#if FX_DIAG == 4
    return;
#endif
    if (tid == 0) {     // mbarriers, then the Q tile's pieces and the first FX_SLOTS sub-tiles
        for (int i = 0; i < 2; ++i) {
            mbar_init(mb_s_full + 8 * i, 32 * FX_SW);
            mbar_init(mb_s_empty + 8 * i, FX_OT);
            mbar_init(mb_p_full + 8 * i, FX_ST);
        }
        mbar_init(mb_q_full, 1);
        mbar_init(mb_l_full, FX_ST);
        mbar_init(mb_q_empty, 32 * FX_SW);
        for (int i = 0; i < FX_SLOTS; ++i) {
            mbar_init(mb_kp_full + 8 * i, 1);
            mbar_init(mb_kp_empty + 8 * i, FX_OT);
        }
        mbar_fence_init();
        bulk_load(sQp, tiles + (size_t)(kv_tiles + blockIdx.x) * FX_TILE_BYTES, FX_TILE_BYTES, mb_q_full);
        for (int i = 0; i < min(3, nsub); ++i)                  // slot 3 once the S warps hold Q (below)
            bulk_load(slot_at(i), ktiles + (size_t)i * FX_TILE_BYTES, FX_TILE_BYTES, mb_kp_full + 8 * i);
    }
    __syncthreads();                                             // mbarriers initialised
    // With FX_QREG each role sets its warpgroup's registers (FX_NREG_*; 512 x 128 in all) where its
    // code starts, so that no value lives across a setmaxnreg.

    if (warp >= FX_OW && warp < FX_OW + FX_SW) {
        // ---------------- S warps: partial scores over their FX_KSTEPS k16 steps, nothing else
#if FX_QREG
        setmaxnreg_inc<FX_NREG_S>();
#endif
        const int sw = warp - FX_OW;                             // dim quarter
        mbar_wait(mb_q_full, 0);
#if FX_DIAG == 3
        for (int i = 0; i < min(3, nsub); ++i) mbar_wait(mb_kp_full + 8 * i, 0);
        return;
#endif
#if FX_QREG
        u32 aq[FX_KSTEPS][3][4];                                 // this warp's Q pieces, all its k-steps
#pragma unroll
        for (int u = 0; u < FX_KSTEPS; ++u)
#pragma unroll
            for (int p = 0; p < 3; ++p)
                ldmatrix_x4(aq[u][p], sQp + p * FX_PIECE_BYTES + fx_at(lrow, 2 * (FX_KSTEPS * sw + u) + lhi));
        mbar_arrive(mb_q_empty);                                 // the Q tile's room may take sub-tile 3
#endif
#pragma unroll 1
        for (int t = 0; t < nsub; ++t) {
            const int buf = t & 1, slot = t % FX_SLOTS;
            mbar_wait(mb_kp_full + 8 * slot, (t / FX_SLOTS) & 1);   // K pieces of t
            const unsigned char* kp = slot_at(slot);
            float acc[2][4], cx[2][3][4];
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] = cx[n][0][e] = cx[n][1][e] = cx[n][2][e] = 0.f;
#if FX_DIAG != 1
#if FX_QREG
#pragma unroll
#else
#pragma unroll 1
#endif
            for (int i0 = 0; i0 < FX_KSTEPS; i0 += 3) {
                // three k-steps at once: their A and B pieces first, then each of the six products
                // over the 3 x 2 (k-step, n tile) fragments, six independent MMAs in flight
                u32 a[3][3][4], bk[3][3][4];                     // [k-step][piece]; bk: n0 b0 b1, n1 b0 b1
#pragma unroll
                for (int u = 0; u < 3; ++u) {
                    const int kstep = FX_KSTEPS * sw + i0 + u;
#pragma unroll
                    for (int p = 0; p < 3; ++p) {
#if FX_QREG
#pragma unroll
                        for (int e = 0; e < 4; ++e) a[u][p][e] = aq[i0 + u][p][e];
#else
                        ldmatrix_x4(a[u][p], sQp + p * FX_PIECE_BYTES + fx_at(lrow, 2 * kstep + lhi));
#endif
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
            // the partial to sS[buf] once the O warps have taken t - 2's P out of it
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

    if (warp >= FX_OW + FX_SW) {
#if FX_QREG
        setmaxnreg_dec<FX_NREG_SM>();
#endif
        // ---------------- softmax warps, per sub-tile: thread st owns row r = st / 8, keys 2 (st % 8)
        // and the next; P's pieces and alpha replace the partials in sS[buf]. They keep the row
        // statistics and write them at the end.
        const int st = tid - (FX_OW + FX_SW) * 32, r = st >> 3, kpair = st & 7;
        const bool r_ok = r < nrows;
        const u8* vrow = visibility + ((long long)b * Q * Q + (long long)(r_ok ? (row0 + r) / H : 0) * Q - P);
        const int ss_off = r * FX_KEYS + ((2 * kpair) ^ (8 * ((r >> 1) & 1)));        // keys 2 kpair, +1 of row r
        const int pp_off = r * 32 + 16 * ((kpair >> 2) ^ ((r >> 2) & 1)) + 4 * (kpair & 3);
        float m_run = neg_inf(), l_run = 0.f;
#if FX_DIAG == 3
        return;
#endif
#if FX_QREG
        if (st == 0 && nsub > 3) {                               // sub-tile 3 into the Q tile's room
            mbar_wait(mb_q_empty, 0);
            bulk_load(slot_at(3), ktiles + (size_t)3 * FX_TILE_BYTES, FX_TILE_BYTES, mb_kp_full + 8 * 3);
        }
#endif
#pragma unroll 1
        for (int t = 0; t < nsub; ++t) {
            const int buf = t & 1;
            float* sb = sS + buf * FX_S_FLOATS;
            mbar_wait(mb_s_full + 8 * buf, (t >> 1) & 1);        // the partials of t
            float2 d = *(const float2*)(sb + ss_off);
#pragma unroll
            for (int w = 1; w < FX_SW; ++w) {
                const float2 x = *(const float2*)(sb + w * FX_ROWS * FX_KEYS + ss_off);
                d.x += x.x;
                d.y += x.y;
            }
            named_barrier(2, FX_ST);                             // every partial read: P may overwrite them
            const int j = kbeg + t * FX_KEYS + 2 * kpair;
            bool ok0 = r_ok && j < kend, ok1 = r_ok && j + 1 < kend;
            if (ok0 && j >= P) ok0 = vrow[j] != 0;
            if (ok1 && j + 1 >= P) ok1 = vrow[j + 1] != 0;
            const float s0 = ok0 ? d.x * sm_scale : neg_inf(), s1 = ok1 ? d.y * sm_scale : neg_inf();
            float mx = fmaxf(s0, s1);
#pragma unroll
            for (int x = 1; x < 8; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
            const float m_new = fmaxf(m_run, mx);
            const float p0 = ok0 ? expf(s0 - m_new) : 0.f, p1 = ok1 ? expf(s1 - m_new) : 0.f;   // ok => m_new finite
            const float alpha = m_new == neg_inf() ? 1.f : expf(m_run - m_new);
            // the 16 keys' sum as a balanced tree in key order: pairs, quads, eights, all
            float ps = p0 + p1;
#pragma unroll
            for (int x = 1; x < 8; x <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, x);
            l_run = l_run * alpha + ps;
            m_run = m_new;
            u32 pc[3];
            split3(p0, p1, pc[0], pc[1], pc[2]);
            unsigned char* pb = (unsigned char*)sb;
#pragma unroll
            for (int i = 0; i < 3; ++i) *(u32*)(pb + i * FX_ROWS * FX_KEYS * 2 + pp_off) = pc[i];
            if (kpair == 0) ((float*)(pb + FX_PP_BYTES))[r] = alpha;
            mbar_arrive(mb_p_full + 8 * buf);
        }
        if (kpair == 0) {
            sL[r] = l_run;
            if (r_ok) {
                const size_t grow = (size_t)b * rows_req + row0 + r, rows_total = (size_t)B * rows_req;
                if (n_splits == 1) {
                    lse[grow] = m_run + logf(l_run);
                } else {
                    ws_m[(size_t)z * rows_total + grow] = m_run;
                    ws_l[(size_t)z * rows_total + grow] = l_run;
                }
            }
        }
        mbar_arrive(mb_l_full);                                  // sL written
        return;
    }

    // ---------------- O warps, per sub-tile: O = alpha O + P V on 64 columns; thread 0 refills the
    // slot they free
#if FX_QREG
    setmaxnreg_dec<FX_NREG_O>();
#endif
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
        mbar_wait(mb_p_full + 8 * buf, (t >> 1) & 1);            // P and alpha of t
        const unsigned char* pbuf = (const unsigned char*)(sS + buf * FX_S_FLOATS);
        u32 pa[3][4];
        const unsigned char* pb = pbuf + lrow * 32 + 16 * (lhi ^ ((lrow >> 2) & 1));
#pragma unroll
        for (int i = 0; i < 3; ++i) ldmatrix_x4(pa[i], pb + i * FX_ROWS * FX_KEYS * 2);
        const float al0 = ((const float*)(pbuf + FX_PP_BYTES))[g], al1 = ((const float*)(pbuf + FX_PP_BYTES))[g + 8];
        mbar_arrive(mb_s_empty + 8 * buf);                       // this thread's reads of sS[buf] done
        mbar_wait(mb_kp_full + 8 * slot, use);                   // V pieces of t
        const unsigned char* kp = slot_at(slot);
#pragma unroll
        for (int j0 = 0; j0 < 8; j0 += 4) {
            // four n tiles (32 columns) at once: V pieces by ldmatrix.trans (keys 0-7 / 8-15 of 8
            // columns, then of the next 8), each of the six products over the four, smallest first
            u32 bv[2][3][4];                                     // [column pair][piece]: n lo b0 b1, n hi b0 b1
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                for (int i = 0; i < 3; ++i)
                    ldmatrix_x4_trans(bv[hh][i], kp + i * FX_PIECE_BYTES +
                                                 fx_at(lrow, (col0 + 8 * (j0 + 2 * hh)) / 8 + lhi));
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
            bulk_load(slot_at(slot), ktiles + (size_t)(t + FX_SLOTS) * FX_TILE_BYTES, FX_TILE_BYTES,
                      mb_kp_full + 8 * slot);
        }
    }
    mbar_wait(mb_l_full, 0);                                     // the softmax warp wrote sL

    // ---------------- epilogue: O rows g, g + 8 (normalised when the keys are not split)
    const bool direct = n_splits == 1;
    const size_t grow0 = (size_t)b * rows_req + row0, rows_total = (size_t)B * rows_req;   // here: not live across setmaxnreg
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
