// verify_attn, variant fp32, "gemm": MLA absorbed tree-verify attention, contiguous layout (ops.md §2),
// as two small register-tiled GEMMs per 64-key tile with one exact softmax between them (no online
// rescale inside a tile). Entry `fp32_gemm` in VerifyAttn.CUDA_KERNELS, the fp32 default where its
// shared memory fits (H200: 59.1 us at B=1 H=16 Q=17 P=2048 against fp32_ffma's 66.5; the
// prediction, the diagnostics and the knob timings are in kernels/NOTES.md, "fp32_gemm").
//
// Launch (main): grid = (ceil(Q*H / FK_ROWS), B, n_splits), block = 512, dynamic shared memory
//   FK_SMEM_BYTES (210,048 B with the defaults: opt-in; one block per SM). The kernel traps if it is
//   launched with less (it reads %dynamic_smem_size), so a knob/host mismatch cannot corrupt memory.
//   verify_attn_fp32_gemm(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B],
//                         visibility u8 [B,Q,Q], B, Q, H, S, sm_scale, n_splits,
//                         out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   A block owns FK_ROWS (68) consecutive (token, head) rows of one request (request-major i*H + h)
//   and one split of that request's keys: chunk = ceil(kvlen / n_splits) rounded up to 8 keys,
//   kvlen = prefix_len[b] + Q, per request on the device; split z has keys [z*chunk, min(kvlen,
//   (z+1)*chunk)) (possibly empty for short requests: it writes m = -inf, l = 0). The split is walked
//   in tiles of 64 keys. With n_splits == 1 the block writes out/lse; otherwise the partials of
//   attn_common.cuh (ws_o [n_splits][rows][512], ws_m, ws_l) and verify_attn_fp32_gemm_merge
//   (grid = B*Q*H, block = 128) finishes. The host (VerifyAttn._splits, split_min_tiles = 1, 64 keys)
//   picks 33 splits at B=1 H=16 Q=17 P=2048: 4 row tiles x 33 = 132 blocks, 32 of 64 keys, one of 17.
//
// Numerical contract: exact FP32 arithmetic on FFMA (no tensor cores, no TF32, no fast-math):
//   s_j = sm_scale * (q . k_j): dims d with (d % 64) / 8 == g form partial g (g = 0..7, 72 dims each,
//   one fmaf chain in ascending d), the 8 partials added in g order. Per 64-key tile one softmax:
//   m_new = max(m_old, max_j s_j), p_j = expf(s_j - m_new), alpha = expf(m_old - m_new),
//   l = alpha l + sum p (warp-shuffle tree), O_tile = sum_j p_j v_j (one fmaf chain in ascending j),
//   O = alpha O + O_tile (only for splits of several tiles; O lives in the output / partial row in
//   global memory between tiles, read back by the thread that wrote it). out = O / l,
//   lse = m + logf(l), natural log. Prefix keys are always visible, tree key j iff
//   visibility[b, i, j]. kv rows at or past prefix_len[b] + Q (NaN padding) and q rows past the
//   request's Q*H are never read: cp.async with a 0-byte source zero-fills their shared rows, and
//   masked keys get p = 0 exactly, so no NaN can leak. Target: relative L2 <= 1e-6 against float64.
//
// Shared memory (floats; defaults FK_ROWS = 68, FK_RING = 3):
//   X    max(FK_RING stages of pass A, the pass-A partials)             34,816 (QB=0: 35,328)
//        pass-A stage: Q[68 rows][68] then K[64 keys][68] (64 dims + 4 pad: conflict-free loads)
//        partials QB=1: [8 dim groups][68 rows][64 keys]; QB=0: [8][4 row quarters][17 * 64 + 16]
//   P    [68 rows][68] softmax weights of the tile (row stride 68: the 2 rows a warp reads differ
//        by 17 rows = 4 banks)                                                        4,624
//   V    FK_RING stages of [8 keys][512]                                            12,288
//   m, l, alpha, visibility row offset [68] each (padded to a multiple of 4)           272
//   total 52,000 floats = 208,000 B (QB=0: 52,512 = 210,048 B).
//
// One 64-key tile is a stream of 17 chunks, copied by cp.async FK_RING - 1 chunks ahead with one
// __syncthreads per chunk (the ring of each kind has FK_RING slots; chunks of consecutive tiles
// continue the same stream, so the next tile's Q/K stages load during this tile's pass B):
//   chunks 0..8  (pass A): stage s = Q and K dims [64s, 64s + 64). Warp w: row half rg = w & 1
//     (rows 34rg..34rg+33), dim group dg = w >> 1 (stage dims 8dg..8dg+7, 2 float4 steps).
//     FK_QB = 1: every lane of a warp holds the same 34 rows and keys lane, lane + 32
//     (68 accumulators); per float4 step 34 Q LDS.128 that are single-address broadcasts (1 load-return
//     cycle each) and 2 K LDS.128 (32 distinct rows, 4 cycles each): 42 cycles per 68 SM FFMA cycles.
//     FK_QB = 0 (default, v1): keys (lane & 15) + 16 j (j < 4), rows 34rg + 17 (lane >> 4) + r (r < 17);
//     17 Q LDS.128 whose two addresses split by lane >> 4 (assumed 4 cycles) + 4 K: up to 84 per 68.
//     Then the 8 dim-group partials go through X ([dg][row][key] with QB = 1).
//   softmax: warp w takes rows w + 16 rr (rr < 5), all five at once (independent shuffle chains
//     interleave; v1 ran them one after another); lane keys 2 lane, 2 lane + 1.
//   chunks 9..16 (pass B): 8 keys of V = kv dims [0, 512). FK_PB = 0 (default): warp rows as in v1
//     pass A, columns 64 (w >> 1) + 4 (lane & 15): 17 P LDS.128 with two addresses + 4 V per 4 keys.
//     FK_PB = 1: warp rows 17 (w & 3) .. + 16, columns 128 (w >> 2) + 4 lane: 17 P LDS.128 broadcasts
//     + 4 V LDS.128 (512 B each) = 33 cycles per 68 (v1: up to 84), but ptxas spills 36 B there
//     (a few LDL of loop-invariant scalars per chunk, none in the FMA bodies), hence not the default.
//   The lane layouts change which lane computes which (row, key) or (row, column), not any sum's order.
//
// Knobs (compile-time defines; the host reads FK_ROWS, FK_RING and FK_QB from `defines` to size the
// grid and the shared memory, see VerifyAttn.CUDA_KERNELS["fp32_gemm"] / fp32_gemm_sizing):
//   FK_ROWS (68): rows per block, a multiple of 4 (17 rows per quarter at 68); 64 gives 5 row tiles.
//   FK_RING (3): cp.async ring depth (chunks in flight + 1); 4 needs 226.5 KB (fits 227 KB).
//   FK_QB (0) / FK_PB (0): pass-A / pass-B lane layouts above (defaults: v1 layouts; see NOTES arithmetic).
//   Keys per split: the host's `splits` argument (33 -> one 64-key tile a block; 17 -> two tiles).
// FK_DIAG (timing only, wrong results): 1 drops the pass-A FMAs, 2 the pass-B FMAs, 3 every key
//   tile (the fixed part: partial writes, merge, launches).
#include "attn_common.cuh"

#ifndef FK_ROWS
#define FK_ROWS 68
#endif
#ifndef FK_RING
#define FK_RING 3
#endif
#ifndef FK_DIAG
#define FK_DIAG 0
#endif
#ifndef FK_QB
#define FK_QB 0
#endif
#ifndef FK_PB
#define FK_PB 0
#endif
#define FK_A (FK_ROWS / 4)                       // rows per quarter
#define FK_THREADS 512
#define FK_KEYS 64                               // keys per tile: 16 lanes x 4
#define FK_DCH 64                                // dims per pass-A stage
#define FK_NA (ATTN_D / FK_DCH)                  // 9 pass-A chunks
#define FK_VK 8                                  // keys per pass-B chunk
#define FK_NV (FK_KEYS / FK_VK)                  // 8 pass-B chunks
#define FK_CHUNKS (FK_NA + FK_NV)                // 17 chunks a tile
#define FK_STR (FK_DCH + 4)                      // pass-A stage row stride
#define FK_STAGE_FLOATS ((FK_ROWS + FK_KEYS) * FK_STR)
#if FK_QB
#define FK_AR (2 * FK_A)                         // pass A: rows per lane (all lanes the same rows)
#define FK_AK 2                                  // keys per lane: lane + 32 j
#define FK_AKS 32
#define FK_PG (FK_ROWS * FK_KEYS)                // partials of one dim group: [row][key]
#else
#define FK_AR FK_A                               // pass A: rows per lane (lane halves: 2 rows apart)
#define FK_AK 4                                  // keys per lane: (lane & 15) + 16 j
#define FK_AKS 16
#define FK_HS (FK_A * FK_KEYS + 16)              // partial block of one row quarter
#define FK_PG (4 * FK_HS)                        // partials of one dim group
#endif
#define FK_PART_FLOATS (8 * FK_PG)
#define FK_RING_FLOATS (FK_RING * FK_STAGE_FLOATS)
#define FK_X_FLOATS (FK_RING_FLOATS > FK_PART_FLOATS ? FK_RING_FLOATS : FK_PART_FLOATS)
#define FK_PS (FK_KEYS + 4)                      // P row stride
#define FK_SR ((FK_ROWS + 15) / 16)              // softmax rows per warp
#define FK_V_FLOATS (FK_RING * FK_VK * ATTN_DV)
#define FK_STAT (((FK_ROWS + 3) / 4) * 4)
#define FK_SMEM_FLOATS (FK_X_FLOATS + FK_ROWS * FK_PS + FK_V_FLOATS + 4 * FK_STAT)
#define FK_SMEM_BYTES (FK_SMEM_FLOATS * 4)
#define FK_MAXZ 16                               // merge: splits loaded per batch

#if FK_ROWS % 4 != 0 || FK_ROWS < 4
#error "FK_ROWS must be a positive multiple of 4"
#endif
#if FK_KEYS % 32 != 0 || FK_VK % 4 != 0
#error "the copy loops assume 32 | FK_KEYS and 4 | FK_VK"
#endif
#if defined(FK_EXPECT_SMEM) && FK_EXPECT_SMEM != FK_SMEM_BYTES
#error "FK_SMEM_BYTES differs from the host's fp32_gemm_sizing (kdtr/ops/verify_attn.py)"
#endif
#if FK_RING < 2 || FK_RING > FK_NV
#error "FK_RING must be in [2, 8]"
#endif
#if (FK_QB != 0 && FK_QB != 1) || (FK_PB != 0 && FK_PB != 1)
#error "FK_QB and FK_PB are 0 or 1"
#endif

// offset of partial (row, key 0) inside one dim group's partial block
__device__ __forceinline__ int fk_part_row(int row) {
#if FK_QB
    return row * FK_KEYS;
#else
    return (row / FK_A) * FK_HS + (row % FK_A) * FK_KEYS;
#endif
}

extern "C" __global__ void __launch_bounds__(FK_THREADS, 1)
verify_attn_fp32_gemm(const float* __restrict__ q, const float* __restrict__ kv,
                      const int* __restrict__ prefix_len, const u8* __restrict__ visibility,
                      int B, int Q, int H, int S, float sm_scale, int n_splits,
                      float* __restrict__ out, float* __restrict__ lse,
                      float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(16) float smem_f[];
    if (dynamic_smem_bytes() < FK_SMEM_BYTES) __trap();         // host and knobs disagree
    float* sX = smem_f;                                          // pass-A ring / partials
    float* sP = sX + FK_X_FLOATS;                                // [ROWS][PS]
    float* sV = sP + FK_ROWS * FK_PS;                            // [RING][8][512]
    float* sM = sV + FK_V_FLOATS;
    float* sL = sM + FK_STAT;
    float* sAlpha = sL + FK_STAT;
    int* sVis = (int*)(sAlpha + FK_STAT);                        // [ROWS] visibility row offset i*Q

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = warp & 1, grp = warp >> 1;                    // pass A: row half; dim group
#if FK_QB
    const int arow = rg * (2 * FK_A);                            // pass A: this lane's first row
    const int akey = lane;                                       // and first key
#else
    const int arow = rg * (2 * FK_A) + (lane >> 4) * FK_A;
    const int akey = lane & 15;
#endif
#if FK_PB
    const int prow = (warp & 3) * FK_A;                          // pass B: this lane's first row
    const int pcol = (warp >> 2) * 128 + 4 * lane;               // and its 4 columns
#else
    const int prow = rg * (2 * FK_A) + (lane >> 4) * FK_A;
    const int pcol = grp * 64 + 4 * (lane & 15);
#endif

    const int b = blockIdx.y, z = blockIdx.z;
    const int rows_req = Q * H;
    const int row0 = blockIdx.x * FK_ROWS;
    const int nrows = min(FK_ROWS, rows_req - row0);
    const int P = prefix_len[b];
    const int kvlen = P + Q;
    ATTN_KEY_SPLIT(kvlen, n_splits, z, 8)
#if FK_DIAG == 3
    const int ntiles = 0;
#else
    const int ntiles = (kend - kbeg + FK_KEYS - 1) / FK_KEYS;
#endif
    const int total = ntiles * FK_CHUNKS;
    const size_t grow0 = (size_t)b * rows_req + row0;
    const size_t rows_total = (size_t)B * rows_req;
    const float* qb = q + grow0 * ATTN_D;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const u8* vis_b = visibility + (size_t)b * Q * Q;

    // copy chunk g of the stream into its ring slot (every thread; commit by the caller). Pass-A
    // stage: thread copies float4 column tid % 16 of K rows tid / 16 + 32 i (i < 2) and of Q rows
    // tid / 16 + 32 i (i < ceil(FK_ROWS / 32), the last only where the row exists); pass-B chunk:
    // float4 column tid % 128 of keys tid / 128 + 4 i (i < 2).
    auto issue = [&](int g) {
        // an opaque copy of the thread index: the copy addresses are recomputed per chunk (a dozen
        // integer instructions) instead of held in registers across the FMA loops (they spilled)
        int t = tid;
        asm volatile("" : "+r"(t));
        const int c16 = t & 15, r16 = t >> 4, c128 = t & 127, r128 = t >> 7;
        const int tt = g / FK_CHUNKS, c = g - tt * FK_CHUNKS;
        const int key0 = kbeg + tt * FK_KEYS;
        if (c < FK_NA) {
            float* st = sX + ((tt * FK_NA + c) % FK_RING) * FK_STAGE_FLOATS + r16 * FK_STR + c16 * 4;
            const int d = c * FK_DCH + c16 * 4;
#pragma unroll
            for (int i = 0; i < FK_KEYS / 32; ++i) {
                const int j = key0 + r16 + 32 * i;
                const bool ok = j < kend;
                cp_async16(st + (FK_ROWS + 32 * i) * FK_STR, kvb + (size_t)(ok ? j : 0) * ATTN_D + d, ok);
            }
#pragma unroll
            for (int i = 0; i < (FK_ROWS + 31) / 32; ++i) {
                const int r = r16 + 32 * i;
                if (32 * i + 32 <= FK_ROWS || r < FK_ROWS) {
                    const bool ok = r < nrows;
                    cp_async16(st + 32 * i * FK_STR, qb + (ok ? r : 0) * ATTN_D + d, ok);
                }
            }
        } else {
            const int v = tt * FK_NV + (c - FK_NA);
            float* st = sV + (v % FK_RING) * (FK_VK * ATTN_DV) + r128 * ATTN_DV + c128 * 4;
            const int kc0 = key0 + (c - FK_NA) * FK_VK + r128;
#pragma unroll
            for (int i = 0; i < FK_VK / 4; ++i) {
                const int j = kc0 + 4 * i;
                const bool ok = j < kend;
                cp_async16(st + 4 * i * ATTN_DV, kvb + (size_t)(ok ? j : 0) * ATTN_D + c128 * 4, ok);
            }
        }
    };

    if (tid < FK_ROWS) {
        sM[tid] = neg_inf(); sL[tid] = 0.f; sAlpha[tid] = 1.f;
        sVis[tid] = tid < nrows ? (row0 + tid) / H * Q : 0;
    }
#pragma unroll 1
    for (int g = 0; g < FK_RING - 1; ++g) {
        if (g < total) issue(g);
        cp_async_commit();
    }
    __syncthreads();                                             // stats initialised (ntiles may be 0)

    // stream step g: chunk g landed for every thread, chunk g - 1's slot is free; refill it
    auto step = [&](int g) {
        cp_async_wait<FK_RING - 2>();
        __syncthreads();
        if (g + FK_RING - 1 < total) issue(g + FK_RING - 1);
        cp_async_commit();
    };

#pragma unroll 1
    for (int tt = 0; tt < ntiles; ++tt) {
        const int key0 = kbeg + tt * FK_KEYS;
        float acc[FK_AR][FK_AK];
#pragma unroll
        for (int r = 0; r < FK_AR; ++r)
#pragma unroll
            for (int j = 0; j < FK_AK; ++j) acc[r][j] = 0.f;

        // ---- pass A: S = Q K^T (68 x 64), this warp's 8 dims of each 64-dim stage
#pragma unroll 1
        for (int c = 0; c < FK_NA; ++c) {
            step(tt * FK_CHUNKS + c);
            const float* st = sX + ((tt * FK_NA + c) % FK_RING) * FK_STAGE_FLOATS;
            const float* qs = st + arow * FK_STR + grp * 8;
            const float* ks = st + (FK_ROWS + akey) * FK_STR + grp * 8;
#if FK_DIAG != 1
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                float4 k4[FK_AK];
#pragma unroll
                for (int j = 0; j < FK_AK; ++j) k4[j] = *(const float4*)(ks + FK_AKS * j * FK_STR + 4 * s);
#pragma unroll
                for (int r = 0; r < FK_AR; ++r) {
                    const float4 qv = *(const float4*)(qs + r * FK_STR + 4 * s);
#pragma unroll
                    for (int j = 0; j < FK_AK; ++j) {
                        acc[r][j] = fmaf(qv.x, k4[j].x, acc[r][j]);
                        acc[r][j] = fmaf(qv.y, k4[j].y, acc[r][j]);
                        acc[r][j] = fmaf(qv.z, k4[j].z, acc[r][j]);
                        acc[r][j] = fmaf(qv.w, k4[j].w, acc[r][j]);
                    }
                }
            }
#endif
        }
        __syncthreads();                                         // every pass-A read of X done
        {   // partials of dim group grp at fk_part_row(row) + key (QB=0: the lane halves' row
            // quarters 16 banks apart; QB=1: 32 consecutive keys a store)
            float* pp = sX + grp * FK_PG + fk_part_row(arow) + akey;
#pragma unroll
            for (int r = 0; r < FK_AR; ++r)
#pragma unroll
                for (int j = 0; j < FK_AK; ++j) pp[r * FK_KEYS + FK_AKS * j] = acc[r][j];
        }
        __syncthreads();

        // ---- softmax over the tile: warp w rows w + 16 rr (rr < FK_SR), all at once (their shuffle
        // chains interleave; each row's arithmetic as before); lane keys 2 lane, 2 lane + 1
        {
            const int j0 = key0 + 2 * lane, j1 = j0 + 1;
            // an opaque copy of the warp index: keeps ptxas from hoisting every row's shared-memory
            // addresses out of the tile loop (it did, and spilled them)
            int wrow = warp;
            asm volatile("" : "+r"(wrow));
            float s0[FK_SR], s1[FK_SR], mx[FK_SR];
            bool ok0[FK_SR], ok1[FK_SR];
#pragma unroll
            for (int rr = 0; rr < FK_SR; ++rr) {
                const int row = wrow + 16 * rr;
                const bool in = row < FK_ROWS;                           // warp-uniform
                const int rowc = in ? row : 0;
                const float* pr = sX + fk_part_row(rowc) + 2 * lane;
                float d0 = 0.f, d1 = 0.f;
#pragma unroll
                for (int g8 = 0; g8 < 8; ++g8) {
                    const float2 v = *(const float2*)(pr + g8 * FK_PG);
                    d0 += v.x; d1 += v.y;
                }
                bool a0 = in && row < nrows && j0 < kend, a1 = in && row < nrows && j1 < kend;
                const u8* vrow = vis_b + sVis[rowc] - P;                  // vrow[j]: tree key j visible
                if (a0 && j0 >= P) a0 = vrow[j0] != 0;
                if (a1 && j1 >= P) a1 = vrow[j1] != 0;
                ok0[rr] = a0; ok1[rr] = a1;
                s0[rr] = a0 ? sm_scale * d0 : neg_inf();
                s1[rr] = a1 ? sm_scale * d1 : neg_inf();
                mx[rr] = fmaxf(s0[rr], s1[rr]);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
#pragma unroll
                for (int rr = 0; rr < FK_SR; ++rr) mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], off));
            float m_new[FK_SR], alpha[FK_SR], ps[FK_SR], p0[FK_SR], p1[FK_SR];
#pragma unroll
            for (int rr = 0; rr < FK_SR; ++rr) {
                const int row = wrow + 16 * rr;
                const float m_old = sM[row < FK_ROWS ? row : wrow];     // out of range: a row of this warp's (no race)
                m_new[rr] = fmaxf(m_old, mx[rr]);
                p0[rr] = ok0[rr] ? expf(s0[rr] - m_new[rr]) : 0.f;     // ok => m_new finite
                p1[rr] = ok1[rr] ? expf(s1[rr] - m_new[rr]) : 0.f;
                alpha[rr] = (m_new[rr] == neg_inf()) ? 1.f : expf(m_old - m_new[rr]);
                ps[rr] = p0[rr] + p1[rr];
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
#pragma unroll
                for (int rr = 0; rr < FK_SR; ++rr) ps[rr] += __shfl_xor_sync(0xffffffffu, ps[rr], off);
            __syncwarp();                        // every lane read sM[row] before lane 0 writes it
#pragma unroll
            for (int rr = 0; rr < FK_SR; ++rr) {
                const int row = wrow + 16 * rr;
                if (row < FK_ROWS) {                                     // warp-uniform
                    *(float2*)(sP + row * FK_PS + 2 * lane) = make_float2(p0[rr], p1[rr]);
                    if (lane == 0) {
                        sM[row] = m_new[rr];
                        sL[row] = sL[row] * alpha[rr] + ps[rr];
                        sAlpha[row] = alpha[rr];
                    }
                }
            }
        }
        // (the first pass-B step's __syncthreads publishes P and the stats)

        // ---- pass B: O_tile = P V (68 x 512), columns pcol.. pcol + 3, rows prow + r
        float o[FK_A][4];
#pragma unroll
        for (int r = 0; r < FK_A; ++r) { o[r][0] = o[r][1] = o[r][2] = o[r][3] = 0.f; }
#pragma unroll 1
        for (int c = 0; c < FK_NV; ++c) {
            step(tt * FK_CHUNKS + FK_NA + c);
            const float* vs = sV + ((tt * FK_NV + c) % FK_RING) * (FK_VK * ATTN_DV) + pcol;
            const float* ps = sP + prow * FK_PS + c * FK_VK;
#if FK_DIAG != 2
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                float4 v4[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) v4[j] = *(const float4*)(vs + (4 * s + j) * ATTN_DV);
                ATTN_PV_4KEYS(o, v4, ps, FK_PS, 4 * s, FK_A)
            }
#endif
        }

        // ---- O = alpha O_prev + O_tile (O_prev: this thread's own earlier write), normalise at the end
        {
            const bool last = tt + 1 == ntiles;
            const bool direct = n_splits == 1;
            float* base = (direct ? out : ws_o + (size_t)z * rows_total * ATTN_DV)
                          + (grow0 + prow) * ATTN_DV + pcol;
#pragma unroll
            for (int r = 0; r < FK_A; ++r) {
                const int row = prow + r;
                if (row < nrows) {
                    float* p = base + r * ATTN_DV;
                    float4 v = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
                    if (tt > 0) {
                        const float a = sAlpha[row];
                        const float4 prev = *(const float4*)p;
                        v = make_float4(fmaf(a, prev.x, v.x), fmaf(a, prev.y, v.y),
                                        fmaf(a, prev.z, v.z), fmaf(a, prev.w, v.w));
                    }
                    if (last && direct) {
                        const float l = sL[row];
                        v = make_float4(v.x / l, v.y / l, v.z / l, v.w / l);
                    }
                    *(float4*)p = v;
                }
            }
        }
    }

    if (tid < nrows) {                   // stats: the last tile's softmax ran before >= 8 barriers
        const float m = sM[tid], l = sL[tid];
        const size_t grow = grow0 + tid;
        if (n_splits == 1) {
            lse[grow] = m + logf(l);
        } else {
            ws_m[(size_t)z * rows_total + grow] = m;
            ws_l[(size_t)z * rows_total + grow] = l;
        }
    }
    cp_async_wait<0>();                  // no copy may outlive the block (all are empty groups here)
}

// grid = B*Q*H rows, block = MERGE_THREADS (128): attn_common.cuh's merge_row_batched, FK_MAXZ
// splits' o rows in flight at once (3 round trips at 33 splits, against merge_row's ~2 per split).
ATTN_MERGE_BATCHED_ENTRY(verify_attn_fp32_gemm_merge, FK_MAXZ)
