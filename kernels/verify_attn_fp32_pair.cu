// verify_attn, variant fp32, "pair": MLA absorbed tree-verify attention, contiguous layout (ops.md §2),
// two 256-thread warp groups per block sharing one Q tile, with pair-uniform shared loads. Entry
// `fp32_pair` in VerifyAttn.CUDA_KERNELS, not a default: correct on every GPU test, and 4% faster than
// fp32_ffma as built (62.9 against 65.5 us; 12% with FP_STAGGER=1, 57.8 us). With FP_STAGGER=1,
// compute-sanitizer racecheck reports 3-4 errors between group 1's publish of O (sRed) and group 0's
// read of it across the __syncthreads() between them; with FP_STAGGER=0 it reports none. The stagger
// adds one named barrier that only group 1 runs (an odd count of bar.sync 2); no reading of the code
// has found a real race there (kernels/NOTES.md), so the knob stays off until one is understood.
// Shared memory FT_SMEM_BYTES = 194,304 B, 128 registers, no spills (sm_90, sm_120; every knob). It
// replaced fp32_tiled (the same design with a plain lane mapping, no faster than fp32_ffma; in git
// history).
//
// Launch (main): grid = (ceil(Q*H / 32), B, n_splits), block = 512, dynamic shared memory
//   FT_SMEM_BYTES (194,304 B: opt-in; one block per SM).
//   verify_attn_fp32_pair(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B],
//                          visibility u8 [B,Q,Q], B, Q, H, S, sm_scale, n_splits,
//                          out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   The same arguments, rows and splits as verify_attn_fp32.cu: a block owns 32 consecutive
//   (token, head) rows of one request (request-major i*H + h) and one split of that request's keys
//   (ceil(kvlen / n_splits) rounded up to 16 keys, kvlen = prefix_len[b] + Q, per request on the
//   device). With n_splits == 1 the block writes out/lse; otherwise the partials of attn_common.cuh
//   and verify_attn_fp32_pair_merge (grid = B*Q*H, block = 128: the shared merge_row) finishes.
//
// Numerical contract: exact FP32 arithmetic on FFMA (no tensor cores, no TF32, no fast-math):
//   s_j = sm_scale * (q . k_j) in fp32 (576 products as 8 partial sums of 72, added in slice
//   order); online softmax with expf per warp group; the two groups' states (m, l, O) are combined
//   in fp32 with weights expf(m_g - M); out = O / l, lse = M + logf(l), natural log. Prefix keys are
//   always visible, tree key j iff visibility[b, i, j]. kv rows at or past prefix_len[b] + Q (NaN
//   padding) and q rows past the request's Q*H are never read: their shared rows are zero-filled by
//   cp.async with a 0-byte source, and masked keys get p = 0 exactly, so no NaN can leak.
//   Target: relative L2 <= 1e-6 against a float64 reference.
//
// Tiling. The 512 threads are two warp groups (G = tid / 256) with their own named barrier
// (id 1 + G), K buffer, score partials, P and running (m, l). Both groups share the block's Q tile
// (32 rows x 576, loaded once) and its key split: group G takes the 16-key tiles G, G + 2, G + 4...
// While one group waits for its tile or sits in a barrier or the softmax, the other runs FFMAs
// (the role of "two blocks per SM", without a second copy of Q: two Q copies would not fit).
// Per 16-key tile, per group (256 threads = 8 warps):
//   phase 1 (S = Q K^T, 32 x 16): warp w sums dims [72w, 72w + 72) (18 float4 steps); lane owns
//     rows {g + 8i} x keys {kg + 4j} (g = lane / 4, kg = lane % 4; a 4 x 4 register tile: 8
//     LDS.128 per 64 FFMA, conflict-free with the 580-float row stride); the 8 partial sums per
//     score go through shared memory (row stride 20: conflict-free stores).
//   softmax: thread (row r = t / 8, keys c and c + 8); sums of the 8 partials in slice order; row
//     max / sum over 8 lanes by shuffles.
//   phase 2 (O = alpha O + P V, 32 x 512): thread owns rows 8rq.. (8) x columns 4cq.. and
//     256 + 4cq.. (8), all 16 keys: a 8 x 8 register tile, 4 LDS.128 per 64 FFMA.
//   Each group's K buffer is single: the next tile is copied after phase 2 and waited for at once;
//   the other group hides that wait.
// End: group 1 publishes O in the freed Q area; group 0 combines and writes out / partials.
// (The lane mappings of phases 1 and 2 above are fp32_tiled's; this kernel's are in Changes 1 and 2.)
//
// Measured, this kernel (H200, B=1 H=16 Q=17 P=2048, graph replay, warm L2, same process;
// kernels/runs/h200-2026-11-29-s2/call3): 57.80 us (fp32_ffma 65.52, fp32_tiled 65.95); FP_STAGGER=0
// 62.91; FT_DIAG=1 35.85, FT_DIAG=2 44.87, FT_DIAG=3 (no key tiles: the fixed part) 10.04.
// Measured before it, fp32_tiled: 65.84 us (14 splits); 9 splits (15 tiles a block) 88.4, 20 splits (2 waves of 7) 89.9;
// FT_DIAG=1 (no phase-1 loop) 41.9, FT_DIAG=2 (no phase-2 loop) 51.1. Reading:
//   - ~4.5 us per 16-key tile (the slope of the split sweep), ~20 us fixed (its intercept).
//   - Phase 1 costs 2.4 us a tile, 2x its FFMA time (1.17 us). Shared memory returns one register
//     per lane per cycle (128 B/clk per SM): an LDS.128 takes 4 cycles, 2 when lanes T and T ^ 1
//     (or T and T ^ 2) read the same address. Per 4-dim step a warp issued 64 FFMA (16 SM cycles
//     at 4 warp-FFMA/clk) and 4 Q loads (pair-uniform: 2 cycles) + 4 K loads (4 cycles) = 24 LDS
//     cycles: phase 1 was bound by shared-memory return bandwidth, not by FFMA.
//   - Phase 2 costs 1.47 us a tile (70% of FFMA rate): per key 8 cycles of V loads (distinct
//     columns per lane) + 4 of P (warp-uniform halves) against 16 of FFMA.
//   - The two warp groups do symmetric work from a symmetric start, so they stay in phase: both
//     wait for their next K tile at the same time and the SM idles (5 times per block).
//   - The merge (merge_row) loads m_z, branches on it, then loads l_z and o_z, split after split:
//     ~28 dependent L2 round trips per row for 14 splits.
// Changes (each isolated by a knob or a DIAG run in tests/test_cuda_kernels.py --bench):
//   1. Phase 1 lanes: lane bits (0, 2) -> key kg, bits (1, 3, 4) -> row g: Q loads pair-uniform on
//      T ^ 1, K loads on T ^ 2: 16 LDS cycles per 16 FFMA cycles (was 24). Still conflict-free
//      (8 rows x 16 B at the 580-float stride cover the 32 banks; partial stores unchanged).
//   2. Phase 2 lanes: t bit 0 -> row group bit 0, bits 1..6 -> column quad cq, bit 7 -> row group
//      bit 1: V loads pair-uniform on T ^ 1, P loads on T ^ 2: 8 LDS cycles per key (was 12).
//   3. FP_STAGGER (default 0; 1 measured 57.8 us against 62.9 but racecheck reports it, below): group 1
//      copies its first tile after the prologue, one copy later
//      than group 0, so each group's tile wait falls in the other's FMA phases (0: no stagger).
//   4. The merge issues every split's m (one round trip), then every split's l and o (one more),
//      then sums in merge_row's order: same values, 2 round trips a row instead of ~2 per split.
// FT_DIAG (timing only, wrong results): 1 drops the phase-1 loop, 2 the phase-2 loop, 3 every key
//   tile (what remains is the fixed part: Q load, combine, partial writes, merge, launches).
// Prediction: kernels/NOTES.md, "fp32_pair".
#include "attn_common.cuh"

#define FT_ROWS 32
#define FT_KEYS 16
#define FT_GROUP 256                             // threads per warp group
#define FT_THREADS (2 * FT_GROUP)
#define FT_STR 580                               // floats per shared Q/K row (576 + 4: no bank conflicts)
#define FT_SLICES 8                              // phase-1 dim slices (one per warp of a group), 72 dims each
#define FT_SLICE_DIMS (ATTN_D / FT_SLICES)
#define FT_PSTR 20                               // floats per partial row (16 keys + 4: conflict-free stores)
#define FT_PART_FLOATS (FT_SLICES * FT_ROWS * FT_PSTR)
// per group: K tile, partials, P [16 keys][32 rows], m, l, alpha
#define FT_GROUP_FLOATS (FT_KEYS * FT_STR + FT_PART_FLOATS + FT_KEYS * FT_ROWS + 3 * FT_ROWS)
#define FT_SMEM_FLOATS (FT_ROWS * FT_STR + 2 * FT_GROUP_FLOATS)
#define FT_SMEM_BYTES (FT_SMEM_FLOATS * 4)
#ifndef FT_DIAG
#define FT_DIAG 0
#endif
#ifndef FP_STAGGER
#define FP_STAGGER 0                             // 1: group 1 loads its first tile after the prologue
#endif
#define FP_MAXZ 16                               // splits merged with every load in flight (more: merge_row)

extern "C" __global__ void __launch_bounds__(FT_THREADS, 1)
verify_attn_fp32_pair(const float* __restrict__ q, const float* __restrict__ kv,
                       const int* __restrict__ prefix_len, const u8* __restrict__ visibility,
                       int B, int Q, int H, int S, float sm_scale, int n_splits,
                       float* __restrict__ out, float* __restrict__ lse,
                       float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l) {
    extern __shared__ __align__(16) float smem_f[];
    const int tid = threadIdx.x;
    const int grp = tid / FT_GROUP, t = tid % FT_GROUP, lane = t & 31, warp = t >> 5;
    float* sQ = smem_f;                                          // [32][580], shared by both groups
    float* sG = sQ + FT_ROWS * FT_STR + grp * FT_GROUP_FLOATS;   // this group's area
    float* sK = sG;                                              // [16][580]
    float* sPart = sK + FT_KEYS * FT_STR;                        // [8 slices][32 rows][20]
    float* sP = sPart + FT_PART_FLOATS;                          // [16 keys][32 rows]
    float* sM = sP + FT_KEYS * FT_ROWS;                          // [32] running max
    float* sL = sM + FT_ROWS;                                    // [32] running sum
    float* sAlpha = sL + FT_ROWS;                                // [32] rescale of this step
    const int bar_id = 1 + grp;

    const int b = blockIdx.y, z = blockIdx.z;
    const int rows_req = Q * H;
    const int row0 = blockIdx.x * FT_ROWS;
    const int nrows = min(FT_ROWS, rows_req - row0);
    const int P = prefix_len[b];
    const int kvlen = P + Q;
    const int per_split = (kvlen + n_splits - 1) / n_splits;
    const int chunk = (per_split + FT_KEYS - 1) / FT_KEYS * FT_KEYS;
    const int kbeg = z * chunk;
    const int kend = min(kbeg + chunk, kvlen);
#if FT_DIAG == 3
    const int ntiles = 0;                        // timing only: the fixed part (Q load, combine, merge)
#else
    const int ntiles = kend > kbeg ? (kend - kbeg + FT_KEYS - 1) / FT_KEYS : 0;
#endif
    const size_t grow0 = (size_t)b * rows_req + row0;           // global row of the tile's row 0
    const float* qb = q + grow0 * ATTN_D;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const u8* vis_b = visibility + (size_t)b * Q * Q;

    auto load_tile = [&](int key0) {                 // this group's 16 keys x 144 float4: 9 per thread
        for (int e = t; e < FT_KEYS * (ATTN_D / 4); e += FT_GROUP) {
            const int c = e / (ATTN_D / 4), c4 = e - c * (ATTN_D / 4);
            const int j = key0 + c;
            const bool ok = j < kend;
            cp_async16(sK + c * FT_STR + c4 * 4, kvb + (size_t)(ok ? j : 0) * ATTN_D + c4 * 4, ok);
        }
    };
    for (int e = tid; e < FT_ROWS * (ATTN_D / 4); e += FT_THREADS) {
        const int r = e / (ATTN_D / 4), c4 = e - r * (ATTN_D / 4);
        const bool ok = r < nrows;
        cp_async16(sQ + r * FT_STR + c4 * 4, qb + (size_t)(ok ? r : 0) * ATTN_D + c4 * 4, ok);
    }
#if FP_STAGGER
    if (grp == 0 && ntiles > 0) load_tile(kbeg);
#else
    if (grp < ntiles) load_tile(kbeg + grp * FT_KEYS);
#endif
    cp_async_commit();
    if (t < FT_ROWS) { sM[t] = neg_inf(); sL[t] = 0.f; }
    cp_async_wait<0>();
    __syncthreads();                                  // Q (copied by both groups) and the first tile(s) landed
#if FP_STAGGER
    // Group 1 starts one tile copy later than group 0. The groups' work is symmetric, so without
    // this they stay in phase and wait for their next K tiles at the same time, with the SM idle;
    // offset by one copy, each group's wait falls in the other group's FMA phases.
    if (grp == 1 && ntiles > 1) {
        load_tile(kbeg + FT_KEYS);
        cp_async_commit();
        cp_async_wait<0>();
        named_barrier(bar_id, FT_GROUP);
    }
#endif

    // phase 2: rows 8rq.., columns 4cq.. and 256 + 4cq..
    // t bit 0 -> row-group bit 0, bits 1..6 -> cq, bit 7 -> row-group bit 1: lanes T and T ^ 1 read
    // the same V address, T and T ^ 2 the same P address (2 return cycles per LDS.128 each)
    const int cq = (t >> 1) & 63, rq = (t & 1) | ((t >> 6) & 2);
    float o[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int x = 0; x < 8; ++x) o[r][x] = 0.f;

    for (int it = grp; it < ntiles; it += 2) {
        const int key0 = kbeg + it * FT_KEYS;

        {   // phase 1: partial dots over this warp's 72 dims, 32 rows x 16 keys
            // pair-uniform lanes: lane bits (0, 2) -> key kg, bits (1, 3, 4) -> row g, so lanes
            // T and T ^ 1 read the same Q address and T and T ^ 2 the same K address: each LDS.128
            // takes 2 return cycles instead of 4 (the Q loads were 2 already, the K loads 4)
            const int g = ((lane >> 1) & 1) | ((lane >> 2) & 6), kg = (lane & 1) | ((lane >> 1) & 2);
            const int dbase = warp * FT_SLICE_DIMS;
            const float* qrow = sQ + g * FT_STR + dbase;
            const float* krow = sK + kg * FT_STR + dbase;
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) { acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f; }
#if FT_DIAG != 1
#pragma unroll 1
            for (int kk = 0; kk < FT_SLICE_DIMS / 4; ++kk) {
                float4 qv[4], kv4[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) qv[i] = *(const float4*)(qrow + 8 * i * FT_STR + kk * 4);
#pragma unroll
                for (int j = 0; j < 4; ++j) kv4[j] = *(const float4*)(krow + 4 * j * FT_STR + kk * 4);
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
                    sPart[(warp * FT_ROWS + g + 8 * i) * FT_PSTR + kg + 4 * j] = acc[i][j];
        }
        named_barrier(bar_id, FT_GROUP);

        {   // softmax: thread (row r, keys c and c + 8)
            const int r = t >> 3, c = t & 7;
            float d0 = 0.f, d1 = 0.f;
#pragma unroll
            for (int w = 0; w < FT_SLICES; ++w) {
                d0 += sPart[(w * FT_ROWS + r) * FT_PSTR + c];
                d1 += sPart[(w * FT_ROWS + r) * FT_PSTR + c + 8];
            }
            const int j0 = key0 + c, j1 = j0 + 8;
            const int i_tok = (row0 + r) / H;
            bool ok0 = r < nrows && j0 < kend, ok1 = r < nrows && j1 < kend;
            if (ok0 && j0 >= P) ok0 = vis_b[(size_t)i_tok * Q + (j0 - P)] != 0;
            if (ok1 && j1 >= P) ok1 = vis_b[(size_t)i_tok * Q + (j1 - P)] != 0;
            const float s0 = ok0 ? sm_scale * d0 : neg_inf();
            const float s1 = ok1 ? sm_scale * d1 : neg_inf();
            float mx = fmaxf(s0, s1);
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_old = sM[r];
            const float m_new = fmaxf(m_old, mx);
            const float p0 = ok0 ? expf(s0 - m_new) : 0.f;           // ok => m_new finite
            const float p1 = ok1 ? expf(s1 - m_new) : 0.f;
            const float alpha = (m_new == neg_inf()) ? 1.f : expf(m_old - m_new);
            float ps = p0 + p1;
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            sP[c * FT_ROWS + r] = p0;
            sP[(c + 8) * FT_ROWS + r] = p1;
            __syncwarp();                 // every lane's read of sM[r] above precedes lane c == 0's write
            if (c == 0) {
                sM[r] = m_new;
                sL[r] = sL[r] * alpha + ps;
                sAlpha[r] = alpha;
            }
        }
        named_barrier(bar_id, FT_GROUP);

        {   // phase 2: O = alpha O + P V for rows 8rq.., columns 4cq.. and 256 + 4cq.., all 16 keys
            const float4 a0 = *(const float4*)(sAlpha + 8 * rq), a1 = *(const float4*)(sAlpha + 8 * rq + 4);
            const float al[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int x = 0; x < 8; ++x) o[r][x] *= al[r];
#if FT_DIAG != 2
#pragma unroll 2
            for (int c = 0; c < FT_KEYS; ++c) {
                const float4 v0 = *(const float4*)(sK + c * FT_STR + cq * 4);
                const float4 v1 = *(const float4*)(sK + c * FT_STR + 256 + cq * 4);
                const float4 p0 = *(const float4*)(sP + c * FT_ROWS + 8 * rq);
                const float4 p1 = *(const float4*)(sP + c * FT_ROWS + 8 * rq + 4);
                const float pr[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
                const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                for (int r = 0; r < 8; ++r)
#pragma unroll
                    for (int x = 0; x < 8; ++x) o[r][x] = fmaf(pr[r], v[x], o[r][x]);
            }
#endif
        }
        if (it + 2 < ntiles) {            // the group's next tile into its (single) K buffer
            named_barrier(bar_id, FT_GROUP);              // every phase-2 read of sK and sP done
            load_tile(key0 + 2 * FT_KEYS);
            cp_async_commit();
            cp_async_wait<0>();
            named_barrier(bar_id, FT_GROUP);              // the tile landed for the whole group
        }
    }
    __syncthreads();                                      // both groups done: sQ is free

    // combine the groups: group 1 publishes O (32 x 512 floats fit in sQ), group 0 adds it
    float* sRed = sQ;
    const float* g0 = sQ + FT_ROWS * FT_STR;                      // group 0's area
    const float* g1 = g0 + FT_GROUP_FLOATS;                       // group 1's area
    const int stats = FT_KEYS * FT_STR + FT_PART_FLOATS + FT_KEYS * FT_ROWS;   // offset of m in a group area
    const float* mA = g0 + stats; const float* lA = mA + FT_ROWS;
    const float* mB = g1 + stats; const float* lB = mB + FT_ROWS;
    if (grp == 1) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            *(float4*)(sRed + (8 * rq + i) * ATTN_DV + cq * 4) = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
            *(float4*)(sRed + (8 * rq + i) * ATTN_DV + 256 + cq * 4) = make_float4(o[i][4], o[i][5], o[i][6], o[i][7]);
        }
    }
    __syncthreads();
    const size_t rows_total = (size_t)B * rows_req;
    if (grp == 0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int r = 8 * rq + i;
            if (r < nrows) {
                const float ma = mA[r], mb = mB[r], M = fmaxf(ma, mb);
                const float wa = ma == neg_inf() ? 0.f : expf(ma - M);
                const float wb = mb == neg_inf() ? 0.f : expf(mb - M);
                const float l = wa * lA[r] + wb * lB[r];
                const size_t grow = grow0 + r;
                float* dst = n_splits == 1 ? out + grow * ATTN_DV : ws_o + ((size_t)z * rows_total + grow) * ATTN_DV;
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int col = h2 * 256 + cq * 4;
                    const float4 other = *(const float4*)(sRed + r * ATTN_DV + col);
                    float4 v = make_float4(wa * o[i][4 * h2] + wb * other.x, wa * o[i][4 * h2 + 1] + wb * other.y,
                                           wa * o[i][4 * h2 + 2] + wb * other.z, wa * o[i][4 * h2 + 3] + wb * other.w);
                    if (n_splits == 1) { v.x = v.x / l; v.y = v.y / l; v.z = v.z / l; v.w = v.w / l; }
                    *(float4*)(dst + col) = v;
                }
            }
        }
    } else if (t < nrows) {
        const float ma = mA[t], mb = mB[t], M = fmaxf(ma, mb);
        const float wa = ma == neg_inf() ? 0.f : expf(ma - M);
        const float wb = mb == neg_inf() ? 0.f : expf(mb - M);
        const float l = wa * lA[t] + wb * lB[t];
        const size_t grow = grow0 + t;
        if (n_splits == 1) {
            lse[grow] = M + logf(l);
        } else {
            ws_m[(size_t)z * rows_total + grow] = M;
            ws_l[(size_t)z * rows_total + grow] = l;
        }
    }
}

struct StoreF32Pair {
    float* out;
    __device__ void operator()(size_t at, float a, float b, float c, float d) const {
        *(float4*)(out + at) = make_float4(a, b, c, d);
    }
};

// grid = B*Q*H rows, block = MERGE_THREADS (128). merge_row's arithmetic in its order (splits in
// ascending z), but with every split's m, then every split's l and o, loaded before any is used: two
// L2 round trips per row instead of merge_row's two per split (its loop loads m_z, branches on it,
// then loads l_z and o_z). More than FP_MAXZ splits: merge_row.
extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
verify_attn_fp32_pair_merge(const float* __restrict__ ws_o, const float* __restrict__ ws_m,
                            const float* __restrict__ ws_l, int n_splits, int rows,
                            float* __restrict__ out, float* __restrict__ lse) {
    if (n_splits > FP_MAXZ) {
        merge_row(ws_o, ws_m, ws_l, n_splits, rows, lse, StoreF32Pair{out});
        return;
    }
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int col = threadIdx.x * 4;
    float m[FP_MAXZ];
#pragma unroll
    for (int z = 0; z < FP_MAXZ; ++z) m[z] = z < n_splits ? ws_m[(size_t)z * rows + row] : neg_inf();
    float M = neg_inf();
#pragma unroll
    for (int z = 0; z < FP_MAXZ; ++z) M = fmaxf(M, m[z]);
    float lz[FP_MAXZ];
    float4 oz[FP_MAXZ];
#pragma unroll
    for (int z = 0; z < FP_MAXZ; ++z) {
        const bool ok = m[z] != neg_inf();              // z < n_splits and the split saw a key
        lz[z] = ok ? ws_l[(size_t)z * rows + row] : 0.f;
        oz[z] = ok ? *(const float4*)(ws_o + ((size_t)z * rows + row) * ATTN_DV + col) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float l = 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int z = 0; z < FP_MAXZ; ++z) {
        if (m[z] == neg_inf()) continue;
        const float w = expf(m[z] - M);
        l += w * lz[z];
        acc[0] += w * oz[z].x; acc[1] += w * oz[z].y; acc[2] += w * oz[z].z; acc[3] += w * oz[z].w;
    }
    *(float4*)(out + (size_t)row * ATTN_DV + col) = make_float4(acc[0] / l, acc[1] / l, acc[2] / l, acc[3] / l);
    if (threadIdx.x == 0) lse[row] = M + logf(l);
}
