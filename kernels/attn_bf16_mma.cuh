// The block of verify_attn/bf16_paged on mma.sync, its tiles compile-time: ROWS (token, head) rows
// a block (16 per row group, RG = ROWS / 16 row groups, a power of two, 2 RG warps) and KEYS keys a
// step (16 or 32). bf16_mma instantiates it at 64 rows x 32 keys (166,144 B), and compiles for sm_80
// and sm_90 to the very SASS of the hand-written kernel it replaced (the one verified on the H200).
// The 99 KB GPUs' kernel, bf16_mma99, was this block at 48 x 16 until its own design replaced it
// (Q in registers, four warps a row group, a deeper K/V ring: verify_attn_bf16_mma99.cu). Its
// header states its launch; the numbers below are those of any instantiation.
//
// Launch (main): grid = (ceil(Q*H / ROWS), B, n_splits), block = 64 RG threads, dynamic shared
//   memory BF16_MMA_SMEM_BYTES(ROWS, KEYS) (opt-in above 48 KB).
//   (q bf16 [B*Q,H,576], kv_buffer bf16 [N,576], kv_indptr i32 [B+1], kv_indices i32 [*],
//    tree_slots i32 [B*Q], custom_mask u8 [*], mask_indptr i32 [B+1], B, Q, H,
//    sm_scale_log2 (= sm_scale*log2 e), n_splits, out bf16 [B*Q,H,512], lse f32 [B*Q,H], ws_o, ws_m, ws_l)
//   A block owns ROWS consecutive (token, head) rows of one request (rows i*H + h, contiguous in q
//   and out) and one split of the request's keys (ceil(kvlen / n_splits) rounded up to KEYS,
//   kvlen = P_b + Q, computed on the device). n_splits == 1 writes out/lse directly; otherwise
//   partials (attn_common.cuh) and the kernel's _merge entry (grid = B*Q*H, block = 128) finish.
//
// Keys: key j < P_b is kv_buffer[kv_indices[kv_indptr[b] + j]], key P_b + t is
//   kv_buffer[tree_slots[b*Q + t]]; values are the first 512 entries of the same row. Prefix keys
//   are always visible and their custom_mask columns are never read; tree key t is visible to row
//   (token i, head h) iff custom_mask[mask_indptr[b] + i*(P_b+Q) + P_b + t]. Only slots of the
//   request are read (unused pool slots are NaN); keys past the split end are zero-filled.
//
// Numerical contract (every instantiation): bf16 inputs, fp32 accumulation on tensor cores
//   (mma.sync m16n8k16 bf16); a score is the same fp32 sum in every instantiation (two k-parity
//   chains over a warp's 288 dims, added, then the partner warp's 288 added); scores in the log2
//   domain (s * sm_scale * log2 e), online softmax with exp2f, one step per KEYS keys (so the key
//   tile decides where the running max is rebased, the only difference between tile sizes); the
//   weights p are rounded to bf16 for the P.V product (as FlashAttention / SGLang's Triton kernel
//   do) while the row sum l adds the fp32 weights; out = bf16_rn(O / l), lse = ln 2 * (m + log2 l).
//
// Per KEYS-key step, warp w (rg = w % RG owns rows 16rg..16rg+15, half = w / RG):
//   S: partial scores of its 16 rows x all KEYS keys over dims [288 half, 288 half + 288) (18
//   k-steps x KEYS/8 n-tiles, two accumulator sets by k parity), added to the partner warp's (other
//   half, w +- RG) through shared memory and a 64-thread named barrier, so both warps of a pair hold
//   the same full S. Softmax in registers; P goes straight from the accumulator layout to the A
//   fragments (no shared-memory round trip). O (16 rows x 256 dims of its half, 128 fp32
//   registers) += P (16 x KEYS) V (KEYS x 256), V fragments by ldmatrix.trans.
//   K/V tiles are gathered with cp.async 16 B into a two-stage ring; the slot indices of the tile
//   after next are themselves fetched by cp.async one step ahead, so no thread ever waits on an
//   index load. Row stride 584 bf16 (1168 B) keeps ldmatrix conflict-free.
//
// Shared memory: sQ [ROWS][584] bf16, sK [2][KEYS][584] bf16, sX [2 RG warps][KEYS/8][32 lanes]
//   float4 (S partials), sSlot [2][KEYS] i32.
#pragma once
#include "attn_common.cuh"

#define FB_STR 584                 // bf16 per shared row of Q / K
#define LN2_F 0.6931471805599453f

// Dynamic shared memory of an instantiation (the host's registry entry holds the same number).
#define BF16_MMA_SMEM_BYTES(rows, keys) \
    (((rows) * FB_STR + 2 * (keys) * FB_STR) * 2 + 2 * ((rows) / 16) * ((keys) / 8) * 32 * 16 + 2 * (keys) * 4)
#define BF16_MMA_THREADS(rows) (64 * ((rows) / 16))
// ATTN_BF16_PAGED_PARAMS' names, for an entry that forwards them to bf16_mma_block
#define BF16_MMA_ARGS q, kv_buffer, kv_indptr, kv_indices, tree_slots, custom_mask, mask_indptr, B, Q, H, \
    sm_scale_log2, n_splits, out, lse, ws_o, ws_m, ws_l

template <int ROWS, int KEYS>
__device__ __forceinline__ void bf16_mma_block(ATTN_BF16_PAGED_PARAMS) {
    constexpr int RG = ROWS / 16;                  // row groups; warps 0..RG-1 and RG..2RG-1 pair up
    constexpr int THREADS = 64 * RG;
    constexpr int NT = KEYS / 8;                   // n8 key tiles of a step
    static_assert(ROWS % 16 == 0 && ROWS <= 64 && (RG & (RG - 1)) == 0, "rows in 1, 2 or 4 m16 groups");
    static_assert(KEYS == 16 || KEYS == 32, "keys in one or two k16 steps");
    static_assert((KEYS * (ATTN_D / 8)) % THREADS == 0, "a K tile's 16-byte chunks spread evenly");
    static_assert(KEYS <= THREADS, "one thread per key loads the slot indices");
    extern __shared__ __align__(16) u16 smem_h[];
    u16* sQ = smem_h;                                     // [ROWS][584]
    u16* sK = sQ + ROWS * FB_STR;                         // [2][KEYS][584]
    float4* sX = (float4*)(sK + 2 * KEYS * FB_STR);       // [2RG warps][NT][32 lanes] float4
    int* sSlot = (int*)(sX + 2 * RG * NT * 32);           // [2][KEYS] pool slots of a tile's keys

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = warp & (RG - 1), half = warp >> (RG == 4 ? 2 : RG / 2);
    const int partner = warp ^ RG;                        // the other half's warp
    const int g = lane >> 2, t = lane & 3;
    ATTN_PAGED_REQUEST(ROWS)
    const int mbase = mask_indptr[b];
    const int per_split = (kvlen + n_splits - 1) / n_splits;
    const int chunk = (per_split + KEYS - 1) / KEYS * KEYS;
    const int kbeg = z * chunk;
    const int kend = min(kbeg + chunk, kvlen);
    const int ntiles = kend > kbeg ? (kend - kbeg + KEYS - 1) / KEYS : 0;
    const size_t grow0 = (size_t)b * rows_req + row0;

    // where key j's slot index lives (valid keys only)
    auto slot_src = [&](int j) -> const int* {
        return j < P ? kv_indices + ibase + j : tree_slots + (size_t)b * Q + (j - P);
    };
    auto load_tile = [&](int buf, int key0) {       // KEYS keys x 72 chunks, evenly over the threads
#pragma unroll
        for (int i = 0; i < (KEYS * (ATTN_D / 8)) / THREADS; ++i) {
            const int e = tid + i * THREADS;
            const int kk = e / (ATTN_D / 8), c = e - kk * (ATTN_D / 8);
            const bool ok = key0 + kk < kend;
            const int slot = ok ? sSlot[buf * KEYS + kk] : 0;
            cp_async16(sK + (buf * KEYS + kk) * FB_STR + c * 8, kv_buffer + (size_t)slot * ATTN_D + c * 8, ok);
        }
    };

    // prologue: Q, slots of tiles 0 (plain loads) and 1 (cp.async), K tile 0
    for (int e = tid; e < ROWS * (ATTN_D / 8); e += THREADS) {
        const int r = e / (ATTN_D / 8), c = e - r * (ATTN_D / 8);
        const bool ok = r < nrows;
        cp_async16(sQ + r * FB_STR + c * 8, q + (grow0 + (ok ? r : 0)) * ATTN_D + c * 8, ok);
    }
    if (tid < KEYS) {
        const int j = kbeg + tid;
        sSlot[tid] = j < kend ? *slot_src(j) : 0;
    }
    __syncthreads();
    if (ntiles > 0) load_tile(0, kbeg);
    if (tid < KEYS) {
        const int j = kbeg + KEYS + tid;
        cp_async4(sSlot + KEYS + tid, j < kend ? slot_src(j) : kv_indptr, j < kend);
    }
    cp_async_commit();

    float o[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f; }
    float m_r[2] = {neg_inf(), neg_inf()};               // rows g and g + 8 of the warp's 16
    float l_r[2] = {0.f, 0.f};                           // this thread's share of the row sums
    const int rl0 = rg * 16 + g;                          // tile-local rows of this thread
    const int tok0 = (row0 + rl0) / H, tok1 = (row0 + rl0 + 8) / H;
    const bool rv0 = rl0 < nrows, rv1 = rl0 + 8 < nrows;
    const u16* qa = sQ + (rg * 16 + (lane & 15)) * FB_STR + (lane >> 4) * 8 + half * 288;
    const int mi = lane >> 3;

    for (int it = 0; it < ntiles; ++it) {
        const int key0 = kbeg + it * KEYS;
        cp_async_wait<0>();                               // tile `it` and the slots of `it + 1` landed
        __syncthreads();                                  // ... for everyone; step it-1 fully done
        if (it + 1 < ntiles) {
            load_tile((it + 1) & 1, key0 + KEYS);
            if (tid < KEYS) {                             // slots of tile it + 2 into the free slot buffer
                const int j = key0 + 2 * KEYS + tid;
                cp_async4(sSlot + (it & 1) * KEYS + tid, j < kend ? slot_src(j) : kv_indptr, j < kend);
            }
        }
        cp_async_commit();
        const u16* Kt = sK + (it & 1) * KEYS * FB_STR;

        // partial S over this half's 288 dims: 16 rows x KEYS keys
        float sp[2][NT][4];
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int n = 0; n < NT; ++n) { sp[x][n][0] = sp[x][n][1] = sp[x][n][2] = sp[x][n][3] = 0.f; }
        const u16* kb = Kt + ((lane & 7) + ((lane >> 4) << 3)) * FB_STR + ((lane >> 3) & 1) * 8 + half * 288;
#pragma unroll
        for (int ks = 0; ks < 18; ++ks) {
            // spelled out per key half, not looped: a loop changed ptxas's allocation of the
            // 32-key kernel (its SASS is the one verified on the H200)
            u32 a[4], b0[4], b1[4];                       // B fragments of keys 0..15 and 16..31
            ldmatrix_x4(a, qa + ks * 16);
            ldmatrix_x4(b0, kb + ks * 16);
            if constexpr (KEYS == 32) ldmatrix_x4(b1, kb + 16 * FB_STR + ks * 16);
            mma_bf16_16816(sp[ks & 1][0], a, b0[0], b0[1]);
            mma_bf16_16816(sp[ks & 1][1], a, b0[2], b0[3]);
            if constexpr (KEYS == 32) {
                mma_bf16_16816(sp[ks & 1][2], a, b1[0], b1[1]);
                mma_bf16_16816(sp[ks & 1][3], a, b1[2], b1[3]);
            }
        }
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = sp[0][n][e] + sp[1][n][e];
        // exchange with the partner warp: both end up with the same full S (fp add commutes)
#pragma unroll
        for (int n = 0; n < NT; ++n) sX[(warp * NT + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
        named_barrier(1 + rg, 64);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float4 x = sX[(partner * NT + n) * 32 + lane];
            s[n][0] += x.x; s[n][1] += x.y; s[n][2] += x.z; s[n][3] += x.w;
        }

        // scale, mask, row max over the KEYS keys
        float mx0 = neg_inf(), mx1 = neg_inf();
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = key0 + n * 8 + 2 * t + (e & 1);
                const bool upper = e >= 2;
                bool ok = (upper ? rv1 : rv0) && j < kend;
                if (ok && j >= P)
                    ok = custom_mask[(size_t)mbase + (size_t)(upper ? tok1 : tok0) * kvlen + j] != 0;
                s[n][e] = ok ? s[n][e] * sm_scale_log2 : neg_inf();
                if (upper) mx1 = fmaxf(mx1, s[n][e]); else mx0 = fmaxf(mx0, s[n][e]);
            }
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float mn0 = fmaxf(m_r[0], mx0), mn1 = fmaxf(m_r[1], mx1);
        const float al0 = (mn0 == neg_inf()) ? 1.f : exp2f(m_r[0] - mn0);
        const float al1 = (mn1 == neg_inf()) ? 1.f : exp2f(m_r[1] - mn1);
        m_r[0] = mn0; m_r[1] = mn1;
        float ps0 = 0.f, ps1 = 0.f;
        u32 pf[NT][2];                                    // P as bf16 pairs, accumulator layout
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float p0 = mn0 == neg_inf() ? 0.f : exp2f(s[n][0] - mn0);
            const float p1 = mn0 == neg_inf() ? 0.f : exp2f(s[n][1] - mn0);
            const float p2 = mn1 == neg_inf() ? 0.f : exp2f(s[n][2] - mn1);
            const float p3 = mn1 == neg_inf() ? 0.f : exp2f(s[n][3] - mn1);
            ps0 += p0 + p1;
            ps1 += p2 + p3;
            pf[n][0] = pack_bf16x2(p0, p1);
            pf[n][1] = pack_bf16x2(p2, p3);
        }
        l_r[0] = l_r[0] * al0 + ps0;
        l_r[1] = l_r[1] * al1 + ps1;
#pragma unroll
        for (int n = 0; n < 32; ++n) { o[n][0] *= al0; o[n][1] *= al0; o[n][2] *= al1; o[n][3] *= al1; }

        // O += P V for 16 rows x 256 dims (P from registers: two n-tiles form one k16 A fragment)
        const u16* vb = Kt + ((mi & 1) * 8 + (lane & 7)) * FB_STR + half * 256 + (mi >> 1) * 8;
#pragma unroll
        for (int ks = 0; ks < KEYS / 16; ++ks) {
            const u32 a[4] = {pf[2 * ks][0], pf[2 * ks][1], pf[2 * ks + 1][0], pf[2 * ks + 1][1]};
#pragma unroll
            for (int np = 0; np < 16; ++np) {
                u32 bb[4];
                ldmatrix_x4_trans(bb, vb + ks * 16 * FB_STR + np * 16);
                mma_bf16_16816(o[2 * np], a, bb[0], bb[1]);
                mma_bf16_16816(o[2 * np + 1], a, bb[2], bb[3]);
            }
        }
    }
    cp_async_wait<0>();

    // row sums: the quad holds one row's KEYS keys; both warps of a pair hold identical sums
    float l0 = l_r[0], l1 = l_r[1];
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }

    const size_t rows_total = (size_t)B * rows_req;
    const size_t gr0 = grow0 + rl0, gr1 = gr0 + 8;
    if (n_splits == 1) {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            const int col = half * 256 + n * 8 + 2 * t;
            if (rv0) *(u32*)(out + gr0 * ATTN_DV + col) = pack_bf16x2(o[n][0] / l0, o[n][1] / l0);
            if (rv1) *(u32*)(out + gr1 * ATTN_DV + col) = pack_bf16x2(o[n][2] / l1, o[n][3] / l1);
        }
        if (half == 0 && t == 0) {
            if (rv0) lse[gr0] = LN2_F * (m_r[0] + log2f(l0));
            if (rv1) lse[gr1] = LN2_F * (m_r[1] + log2f(l1));
        }
    } else {
        float* w0 = ws_o + ((size_t)z * rows_total + gr0) * ATTN_DV;
        float* w1 = ws_o + ((size_t)z * rows_total + gr1) * ATTN_DV;
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            const int col = half * 256 + n * 8 + 2 * t;
            if (rv0) *(float2*)(w0 + col) = make_float2(o[n][0], o[n][1]);
            if (rv1) *(float2*)(w1 + col) = make_float2(o[n][2], o[n][3]);
        }
        if (half == 0 && t == 0) {
            if (rv0) { ws_m[(size_t)z * rows_total + gr0] = m_r[0] * LN2_F; ws_l[(size_t)z * rows_total + gr0] = l0; }
            if (rv1) { ws_m[(size_t)z * rows_total + gr1] = m_r[1] * LN2_F; ws_l[(size_t)z * rows_total + gr1] = l1; }
        }
    }
}
