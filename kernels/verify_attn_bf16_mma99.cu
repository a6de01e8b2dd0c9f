// verify_attn, variant bf16_paged, kernel `bf16_mma99`: the op on mma.sync within the 101,376 B of
// shared memory a block of sm_120 / sm_121 (RTX PRO 6000 Blackwell, RTX 50xx, DGX Spark), sm_89 (L40S,
// RTX 4090) and sm_86 (A10, RTX 3090): the launch picks it where bf16_mma does not fit
// (kernels/README.md). Run on a GPU only as sm_90 code (an H100 run as sm_120, docs/gpus.md); its
// design and what it is expected to do on 188 SMs: kernels/NOTES.md, "bf16_mma99".
//
// Launch (main): grid = (ceil(Q*H / M99_ROWS), B, n_splits), block = 8 * M99_ROWS threads (4 warps a
//   16-row group: 384 at the default 48 rows), dynamic shared memory M99_SMEM_BYTES (87,424 B at 48
//   rows and 4 stages; opt-in above 48 KB; one block an SM).
//   verify_attn_bf16_mma99(q bf16 [B*Q,H,576], kv_buffer bf16 [N,576], kv_indptr i32 [B+1],
//                          kv_indices i32 [*], tree_slots i32 [B*Q], custom_mask u8 [*],
//                          mask_indptr i32 [B+1], B, Q, H, sm_scale_log2 (= sm_scale*log2 e),
//                          n_splits, out bf16 [B*Q,H,512], lse f32 [B*Q,H], ws_o, ws_m, ws_l)
//   A block owns M99_ROWS consecutive (token, head) rows of one request (rows i*H + h) and one split
//   of the request's keys (ceil(kvlen / n_splits) rounded up to 16), walked 16 keys a step. n_splits
//   == 1 writes out/lse directly; otherwise verify_attn_bf16_mma99_merge (grid = B*Q*H, block = 128).
//   Keys, values, the tree mask and the slots read: as bf16_mma (attn_bf16_mma.cuh's header).
//
// Knobs (`--define bf16_mma99:M99_ROWS=32,M99_STAGES=3`; the launch sizes the block and shared memory
//   from the first two and passes them on to the compiler, kdtr/ops/verify_attn/cuda.py):
//   M99_ROWS 48 (default) or 32, a launch knob (the grid, so the split count, follows it): rows a
//   block, 16-row groups of 4 warps (64 rows, 512 threads at <= 128 registers, spills).
//   M99_STAGES 4 (default), 2 or 3: stages of the K/V ring, M99_STAGES - 1 tiles in flight.
//   M99_SKIP_RESCALE 1 (default) or 0 (a compile knob): skip O *= alpha where no row of the warp
//   moved its max (alpha = 1: the same bits).
//   Written in session 21, run on the CPU emulator but not yet on a GPU (compile knobs, off):
//   M99_SUM_SCATTER 1: each warp of a row group adds one quarter of the scores from the four
//   partials and shares the sum (26 shared-memory wavefronts a warp a step instead of 40).
//   M99_SKEW 1 (M99_STAGES >= 3): the odd row groups run a step's P.V at the start of the next step,
//   while the even ones compute S, so the softmax of some warps of a sub-partition overlaps the MMAs
//   of others; the ring keeps the previous tile's stage for them (M99_STAGES - 2 tiles in flight).
//   Every (row, key) gets the same arithmetic under every knob: the outputs differ only through the
//   split count the launch picks for the grid (the merge's rounding); with the split count forced
//   (SPLITS) every build gives the same bytes (tests/kernels/test_emulated_kernels.py).
//
// Warp w: row group rg = w / 4 (rows 16 rg .. 16 rg + 15), quarter qd = w % 4; the 4 warps of a row
//   group sit on the SM's 4 sub-partitions (warp w on w % 4). Per 16-key step:
//   S: partial scores of its 16 rows x 16 keys over dims [144 qd, 144 qd + 144) (9 k-steps, two
//   accumulator chains by k parity, added); Q's A fragments for those dims live in registers for
//   the whole block (36 a thread, loaded once), so Q takes no shared memory. The 4 partials go
//   through shared memory (a 128-thread named barrier per row group) and every warp adds them in
//   the same order, (q0 + q1) + (q2 + q3): the 4 warps hold bit-identical S, so the same softmax.
//   Softmax in registers; P goes from the accumulator layout to the A fragment (no shared memory).
//   O (16 rows x its 128 dims [128 qd, 128 qd + 128), 64 fp32 registers) += P (16 x 16) V (16 x
//   128), V fragments by ldmatrix.trans from the same K/V tile.
//   K/V tiles are gathered by cp.async 16 B into a ring of M99_STAGES stages: step `it` waits for
//   tile it, then starts tile it + M99_STAGES - 1 into the stage step it - 1 read (a __syncthreads
//   between). A tile's slot indices are fetched (cp.async) M99_STAGES - 1 steps before its copy
//   starts, in the commit group that its own copy waits behind, into a ring of 2 M99_STAGES - 2
//   buffers; the prologue loads the first 2 M99_STAGES - 2 tiles' slots. Row stride 584 bf16
//   (1,168 B) keeps ldmatrix conflict-free.
//
// Shared memory: sK [M99_STAGES][16][584] bf16, sX [4 RG warps][2 n-tiles][32 lanes] float4 (S
//   partials), sSlot [2 M99_STAGES - 2][16] i32: 74,752 + 12,288 + 384 = 87,424 B at the defaults.
//
// Numerical contract: bf16 inputs, fp32 accumulation on tensor cores (mma.sync m16n8k16 bf16); a
//   score is the fp32 sum (q0 + q1) + (q2 + q3) of four 144-dim partials, each the sum of its two
//   k-parity chains; scores in the log2 domain (s * sm_scale * log2 e), online softmax one step per
//   16 keys, p = 2^(s - m) on the MUFU (ex2.approx.ftz: exp2f's value wherever p >= 2^-126, 0 below);
//   the weights p are rounded to bf16 for the P.V product (as FlashAttention / SGLang's Triton
//   kernel do) while the row sum l adds the fp32 weights; out = bf16_rn(O / l) (the correctly
//   rounded quotient, by one reciprocal and a correction), lse = ln 2 * (m + log2 l). The same
//   (row, key) arithmetic under every knob.
#include "attn_common.cuh"

#ifndef M99_ROWS
#define M99_ROWS 48
#endif
#ifndef M99_STAGES
#define M99_STAGES 4
#endif
#ifndef M99_SKIP_RESCALE
#define M99_SKIP_RESCALE 1
#endif
#ifndef M99_SUM_SCATTER
#define M99_SUM_SCATTER 0
#endif
#ifndef M99_SKEW
#define M99_SKEW 0
#endif
#define M99_STR 584                 // bf16 per shared row of a K/V tile
#define M99_KEYS 16                 // keys a step
#define M99_THREADS(rows) (8 * (rows))
// Dynamic shared memory (the host's launch computes the same, kdtr/ops/verify_attn/cuda.py)
#define M99_SMEM_BYTES(rows, stages) \
    ((stages) * M99_KEYS * M99_STR * 2 + (rows) / 4 * (M99_KEYS / 8) * 32 * 16 + (2 * (stages) - 2) * M99_KEYS * 4)

#if M99_SUM_SCATTER
// The row group's scores, each warp adding one quarter: quarter k of the 16 x 16 tile is n-tile k / 2,
// rows g + 8 (k % 2), a float2 a lane. sQ [4 quarters][4 warps][32 lanes] float2 is the row group's
// part of sX (the same 4,096 B). Warp qd writes its partial of quarter k to sQ[k][qd]; after the
// barrier it adds column qd's four partials in the order (q0 + q1) + (q2 + q3) and writes the sum over
// its own partial, sQ[qd][qd]; after the second barrier every warp reads the four sums. The same
// bits as every warp adding all four partials, in 26 shared-memory wavefronts a warp where that takes
// 40 (the exchange was 480 of the 48-row step's ~1,300 wavefronts; kernels/NOTES.md). The next step's
// writes follow its __syncthreads, after every read of this one.
__device__ __forceinline__ void scores_sum_scatter(float (&s)[2][4], const float (&sp)[2][2][4], float2* sQ,
                                                   int qd, int lane, int rg) {
    float2 part[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int n = k >> 1, e = 2 * (k & 1);
        part[k] = make_float2(sp[0][n][e] + sp[1][n][e], sp[0][n][e + 1] + sp[1][n][e + 1]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) sQ[(k * 4 + qd) * 32 + lane] = part[k];
    named_barrier(1 + rg, 128);
    const float2* x = sQ + qd * 4 * 32 + lane;
    const float2 x0 = x[0], x1 = x[32], x2 = x[64], x3 = x[96];
    sQ[(qd * 4 + qd) * 32 + lane] = make_float2((x0.x + x1.x) + (x2.x + x3.x), (x0.y + x1.y) + (x2.y + x3.y));
    named_barrier(1 + rg, 128);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 v = sQ[(k * 4 + k) * 32 + lane];
        s[k >> 1][2 * (k & 1)] = v.x;
        s[k >> 1][2 * (k & 1) + 1] = v.y;
    }
}
#endif

template <int RG, int NSTAGE>
__device__ __forceinline__ void bf16_mma99_block(ATTN_BF16_PAGED_PARAMS) {
    constexpr int ROWS = 16 * RG, WARPS = 4 * RG, THREADS = 32 * WARPS;
    constexpr int KEYS = M99_KEYS, NT = KEYS / 8;
    // M99_SKEW: the odd row groups run P.V a step late, so a stage stays for them one step more
    constexpr int LEAD = NSTAGE - (M99_SKEW ? 1 : 0);      // the ring's depth for loads: LEAD - 1 in flight
    constexpr int SLOTS = 2 * LEAD - 2;                    // slot-index buffers
    static_assert(RG >= 1 && RG <= 3, "1 to 3 row groups (4 spills), 128 to 384 threads");
    static_assert(LEAD >= 2, "M99_SKEW needs M99_STAGES >= 3: a stage held one step more, one in flight");
    static_assert(SLOTS * KEYS <= THREADS, "the prologue loads SLOTS tiles' slots, one a thread");
    extern __shared__ __align__(16) u16 smem_h[];
    u16* sK = smem_h;                                      // [NSTAGE][KEYS][584]
    float4* sX = (float4*)(sK + NSTAGE * KEYS * M99_STR);  // [WARPS][NT][32 lanes]
    int* sSlot = (int*)(sX + WARPS * NT * 32);             // [SLOTS][KEYS] pool slots of a tile's keys

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = warp >> 2, qd = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    ATTN_PAGED_REQUEST(ROWS)
    const int mbase = mask_indptr[b];
    ATTN_KEY_SPLIT(kvlen, n_splits, z, KEYS)
    const int ntiles = (kend - kbeg + KEYS - 1) / KEYS;
    const size_t grow0 = (size_t)b * rows_req + row0;

    // where key j's slot index lives (valid keys only)
    auto slot_src = [&](int j) -> const int* {
        return j < P ? kv_indices + ibase + j : tree_slots + (size_t)b * Q + (j - P);
    };
    // tile `tile` of the split into stage tile % NSTAGE, from the slots in buffer tile % SLOTS: thread
    // tid copies chunks c, c + TPK, ... (c = tid % TPK) of key tid / TPK, at immediate offsets
    constexpr int TPK = THREADS / KEYS, CPT = (ATTN_D / 8 + TPK - 1) / TPK;     // 24 and 3 at 48 rows
    const int my_key = tid / TPK, my_c = tid - my_key * TPK;
    auto load_tile = [&](int tile) {
        const bool ok = kbeg + tile * KEYS + my_key < kend;
        const int slot = ok ? sSlot[(tile % SLOTS) * KEYS + my_key] : 0;
        u16* dst = sK + ((tile % NSTAGE) * KEYS + my_key) * M99_STR + my_c * 8;
        const u16* src = kv_buffer + (size_t)slot * ATTN_D + my_c * 8;
#pragma unroll
        for (int i = 0; i < CPT; ++i)
            if ((ATTN_D / 8) % TPK == 0 || my_c + i * TPK < ATTN_D / 8) cp_async16(dst + i * TPK * 8, src + i * TPK * 8, ok);
    };

    // prologue: the slots of tiles 0 .. SLOTS-1 (plain loads), Q's fragments, tiles 0 .. LEAD-2
    if (tid < SLOTS * KEYS) {
        const int j = kbeg + tid;
        sSlot[tid] = j < kend ? *slot_src(j) : 0;
    }
    const int rl0 = rg * 16 + g;                           // tile-local rows of this thread: rl0, rl0 + 8
    const bool rv0 = rl0 < nrows, rv1 = rl0 + 8 < nrows;
    u32 qf[9][4];                                          // A fragments of dims 144 qd + 16 ks ..
    {
        const u16* q0 = q + (grow0 + (rv0 ? rl0 : 0)) * ATTN_D + qd * 144 + 2 * t;
        const u16* q1 = q + (grow0 + (rv1 ? rl0 + 8 : 0)) * ATTN_D + qd * 144 + 2 * t;
#pragma unroll
        for (int ks = 0; ks < 9; ++ks) {
            qf[ks][0] = rv0 ? *(const u32*)(q0 + ks * 16) : 0u;
            qf[ks][1] = rv1 ? *(const u32*)(q1 + ks * 16) : 0u;
            qf[ks][2] = rv0 ? *(const u32*)(q0 + ks * 16 + 8) : 0u;
            qf[ks][3] = rv1 ? *(const u32*)(q1 + ks * 16 + 8) : 0u;
        }
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < LEAD - 1; ++s) {                   // group s: tile s (empty past the split)
        if (s < ntiles) load_tile(s);
        cp_async_commit();
    }

    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f; }
    float m_r[2] = {neg_inf(), neg_inf()};                 // rows rl0 and rl0 + 8
    float l_r[2] = {0.f, 0.f};                             // this thread's share of the row sums
    // the tree-mask rows of this thread's two rows' tokens, indexed by key
    const u8* mask0 = custom_mask + mbase + (size_t)((row0 + rl0) / H) * kvlen;
    const u8* mask1 = custom_mask + mbase + (size_t)((row0 + rl0 + 8) / H) * kvlen;
    const int kb_off = ((lane & 7) + ((lane >> 4) << 3)) * M99_STR + ((lane >> 3) & 1) * 8 + qd * 144;
    const int mi = lane >> 3;
    const int vb_off = ((mi & 1) * 8 + (lane & 7)) * M99_STR + qd * 128 + (mi >> 1) * 8;

    // O += P V from a tile's V (rows 0-15 of the stage, dims [128 qd, 128 qd + 128))
    auto pv = [&](const u16* Vt, const u32 (&pa)[4]) {
#pragma unroll
        for (int np = 0; np < 8; ++np) {
            u32 bv[4];
            ldmatrix_x4_trans(bv, Vt + vb_off + np * 16);
            mma_bf16_16816(o[2 * np], pa, bv[0], bv[1]);
            mma_bf16_16816(o[2 * np + 1], pa, bv[2], bv[3]);
        }
    };
#if M99_SKEW
    // The odd row groups add step it's P V at the start of step it + 1, while the even ones compute S:
    // the row groups' tensor work and softmax overlap instead of running in step. The same operations
    // on O in the same order (O += P_{it-1} V_{it-1}, then O *= alpha_it): the same bits.
    const bool late = rg & 1;
    auto stage = [&](int tile) { return sK + (tile % NSTAGE) * KEYS * M99_STR; };   // the ring stage of a tile
    u32 pa_late[4] = {0u, 0u, 0u, 0u};
#endif
    for (int it = 0; it < ntiles; ++it) {
        const int key0 = kbeg + it * KEYS;
        cp_async_wait<LEAD - 2>();                         // group it: tile it, slots of tile it + LEAD - 1
        __syncthreads();                                   // ... for everyone; step it-1 fully done
        {
            const int next = it + LEAD - 1;                // into the stage step it-1 read (skew: it-2)
            if (next < ntiles) load_tile(next);
            const int ahead = next + LEAD - 1;             // its slots into buffer it % SLOTS (tile it's)
            if (tid < KEYS && ahead < ntiles) {
                const int j = kbeg + ahead * KEYS + tid;
                cp_async4(sSlot + (ahead % SLOTS) * KEYS + tid, j < kend ? slot_src(j) : kv_indptr, j < kend);
            }
            cp_async_commit();
        }
        const u16* Kt = sK + (it % NSTAGE) * KEYS * M99_STR;
#if M99_SKEW
        if (late && it > 0) pv(stage(it - 1), pa_late);
#endif

        // partial S over this quarter's 144 dims: 16 rows x 16 keys
        float sp[2][NT][4];
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int n = 0; n < NT; ++n) { sp[x][n][0] = sp[x][n][1] = sp[x][n][2] = sp[x][n][3] = 0.f; }
#pragma unroll
        for (int ks = 0; ks < 9; ++ks) {
            u32 bk[4];                                     // B fragments of keys 0..7 and 8..15
            ldmatrix_x4(bk, Kt + kb_off + ks * 16);
            mma_bf16_16816(sp[ks & 1][0], qf[ks], bk[0], bk[1]);
            mma_bf16_16816(sp[ks & 1][1], qf[ks], bk[2], bk[3]);
        }
        float s[NT][4];
#if M99_SUM_SCATTER
        scores_sum_scatter(s, sp, (float2*)sX + rg * 16 * 32, qd, lane, rg);
#else
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = sp[0][n][e] + sp[1][n][e];
            sX[(warp * NT + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
        }
        named_barrier(1 + rg, 128);
        // the row group's four partials, added in one order by all four warps
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float4* xs = sX + (rg * 4 * NT + n) * 32 + lane;
            const float4 x0 = xs[0], x1 = xs[NT * 32], x2 = xs[2 * NT * 32], x3 = xs[3 * NT * 32];
            s[n][0] = (x0.x + x1.x) + (x2.x + x3.x);
            s[n][1] = (x0.y + x1.y) + (x2.y + x3.y);
            s[n][2] = (x0.z + x1.z) + (x2.z + x3.z);
            s[n][3] = (x0.w + x1.w) + (x2.w + x3.w);
        }
#endif

        // scale, mask, row max over the 16 keys. A tile of prefix keys inside the split needs no mask:
        // rows past the request (Q zero-filled) get finite scores and are never stored.
        float mx0 = neg_inf(), mx1 = neg_inf();
        if (key0 + KEYS <= P && key0 + KEYS <= kend) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] *= sm_scale_log2;
                mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
            }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = key0 + n * 8 + 2 * t + (e & 1);
                    const bool upper = e >= 2;
                    bool ok = (upper ? rv1 : rv0) && j < kend;
                    if (ok && j >= P) ok = (upper ? mask1 : mask0)[j] != 0;
                    s[n][e] = ok ? s[n][e] * sm_scale_log2 : neg_inf();
                    if (upper) mx1 = fmaxf(mx1, s[n][e]); else mx0 = fmaxf(mx0, s[n][e]);
                }
            }
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        // p = 2^(s - m) against an offset of 0 while a row has seen no key (its p are then all 0);
        // alpha = 2^(m_old - m): 0 from an empty start, 1 where the max stayed
        const float mn0 = fmaxf(m_r[0], mx0), mn1 = fmaxf(m_r[1], mx1);
        const float mo0 = mn0 == neg_inf() ? 0.f : mn0, mo1 = mn1 == neg_inf() ? 0.f : mn1;
        const float al0 = exp2_ftz(m_r[0] - mo0), al1 = exp2_ftz(m_r[1] - mo1);
        m_r[0] = mn0; m_r[1] = mn1;
        float ps0 = 0.f, ps1 = 0.f;
        u32 pf[NT][2];                                     // P as bf16 pairs, accumulator layout
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float p0 = exp2_ftz(s[n][0] - mo0), p1 = exp2_ftz(s[n][1] - mo0);
            const float p2 = exp2_ftz(s[n][2] - mo1), p3 = exp2_ftz(s[n][3] - mo1);
            ps0 += p0 + p1;
            ps1 += p2 + p3;
            pf[n][0] = pack_bf16x2(p0, p1);
            pf[n][1] = pack_bf16x2(p2, p3);
        }
        l_r[0] = l_r[0] * al0 + ps0;
        l_r[1] = l_r[1] * al1 + ps1;
        // O *= alpha, skipped (same bits) when no row of the warp moved its max
        if (!M99_SKIP_RESCALE || __any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
            for (int n = 0; n < 16; ++n) { o[n][0] *= al0; o[n][1] *= al0; o[n][2] *= al1; o[n][3] *= al1; }
        }

        // O += P V for 16 rows x this quarter's 128 dims (the two n-tiles of P form one k16 A fragment)
        const u32 pa[4] = {pf[0][0], pf[0][1], pf[1][0], pf[1][1]};
#if M99_SKEW
        if (late) {                                        // at the start of the next step
            pa_late[0] = pa[0]; pa_late[1] = pa[1]; pa_late[2] = pa[2]; pa_late[3] = pa[3];
            continue;
        }
#endif
        pv(Kt, pa);
    }
#if M99_SKEW
    if (late && ntiles > 0) pv(stage(ntiles - 1), pa_late);
#endif
    cp_async_wait<0>();

    // row sums: the quad holds one row's 16 keys; the four warps of a row group hold identical sums
    float l0 = l_r[0], l1 = l_r[1];
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }

    const size_t rows_total = (size_t)B * rows_req;
    const size_t gr0 = grow0 + rl0, gr1 = gr0 + 8;
    if (n_splits == 1) {
        const float inv0 = __frcp_rn(l0), inv1 = __frcp_rn(l1);
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = qd * 128 + n * 8 + 2 * t;
            if (rv0) *(u32*)(out + gr0 * ATTN_DV + col) = pack_bf16x2(div_rn_by(o[n][0], l0, inv0), div_rn_by(o[n][1], l0, inv0));
            if (rv1) *(u32*)(out + gr1 * ATTN_DV + col) = pack_bf16x2(div_rn_by(o[n][2], l1, inv1), div_rn_by(o[n][3], l1, inv1));
        }
        if (qd == 0 && t == 0) {
            if (rv0) lse[gr0] = 0.6931471805599453f * (m_r[0] + log2f(l0));
            if (rv1) lse[gr1] = 0.6931471805599453f * (m_r[1] + log2f(l1));
        }
    } else {
        float* w0 = ws_o + ((size_t)z * rows_total + gr0) * ATTN_DV;
        float* w1 = ws_o + ((size_t)z * rows_total + gr1) * ATTN_DV;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = qd * 128 + n * 8 + 2 * t;
            if (rv0) *(float2*)(w0 + col) = make_float2(o[n][0], o[n][1]);
            if (rv1) *(float2*)(w1 + col) = make_float2(o[n][2], o[n][3]);
        }
        if (qd == 0 && t == 0) {
            if (rv0) { ws_m[(size_t)z * rows_total + gr0] = m_r[0] * 0.6931471805599453f; ws_l[(size_t)z * rows_total + gr0] = l0; }
            if (rv1) { ws_m[(size_t)z * rows_total + gr1] = m_r[1] * 0.6931471805599453f; ws_l[(size_t)z * rows_total + gr1] = l1; }
        }
    }
}

extern "C" __global__ void __launch_bounds__(M99_THREADS(M99_ROWS), 1)
verify_attn_bf16_mma99(ATTN_BF16_PAGED_PARAMS) {
    if (dynamic_smem_bytes() < M99_SMEM_BYTES(M99_ROWS, M99_STAGES)) __trap();   // a launch sized for other knobs
    bf16_mma99_block<M99_ROWS / 16, M99_STAGES>(q, kv_buffer, kv_indptr, kv_indices, tree_slots, custom_mask,
                                               mask_indptr, B, Q, H, sm_scale_log2, n_splits, out, lse, ws_o,
                                               ws_m, ws_l);
}

ATTN_MERGE_ENTRY(verify_attn_bf16_mma99_merge, u16, StoreBF16)
