// verify_attn, variant bf16_paged, kernel `bf16_mma`: SGLang's target-verify layout, page size 1
// (docs/ops/verify_attn.md), on mma.sync: the launch picks it on GPUs other than sm_90 (there verify_attn_bf16_wgmma2.cu
// runs; kernels/README.md).
//
// Launch (main): grid = (ceil(Q*H / 64), B, n_splits), block = 256 (8 warps), dynamic shared
//   memory FB_SMEM_BYTES (166,144 B: opt-in above 48 KB; one block per SM).
//   verify_attn_bf16_mma(q bf16 [B*Q,H,576], kv_buffer bf16 [N,576], kv_indptr i32 [B+1],
//                        kv_indices i32 [*], tree_slots i32 [B*Q], custom_mask u8 [*],
//                        mask_indptr i32 [B+1], B, Q, H, sm_scale_log2 (= sm_scale*log2 e),
//                        n_splits, out bf16 [B*Q,H,512], lse f32 [B*Q,H], ws_o, ws_m, ws_l)
//   A block owns 64 consecutive (token, head) rows of one request (rows i*H + h, contiguous in q
//   and out) and one split of the request's keys (ceil(kvlen / n_splits) rounded up to 32,
//   kvlen = P_b + Q, computed on the device). n_splits == 1 writes out/lse directly; otherwise
//   partials (attn_common.cuh) and verify_attn_bf16_mma_merge (grid = B*Q*H, block = 128) finish.
//
// Keys: key j < P_b is kv_buffer[kv_indices[kv_indptr[b] + j]], key P_b + t is
//   kv_buffer[tree_slots[b*Q + t]]; values are the first 512 entries of the same row. Prefix keys
//   are always visible and their custom_mask columns are never read; tree key t is visible to row
//   (token i, head h) iff custom_mask[mask_indptr[b] + i*(P_b+Q) + P_b + t]. Only slots of the
//   request are read (unused pool slots are NaN); keys past the split end are zero-filled.
//
// Numerical contract: bf16 inputs, fp32 accumulation on tensor cores (mma.sync m16n8k16 bf16);
//   scores in the log2 domain (s * sm_scale * log2 e), online softmax with exp2f; the weights p are
//   rounded to bf16 for the P.V product (as FlashAttention / SGLang's Triton kernel do) while the
//   row sum l adds the fp32 weights; out = bf16_rn(O / l), lse = ln 2 * (m + log2 l).
//
// Per 32-key step, warp w (rg = w % 4 owns rows 16rg..16rg+15, half = w / 4):
//   S: partial scores of its 16 rows x all 32 keys over dims [288 half, 288 half + 288) (18 k-steps
//   x 4 n-tiles, two accumulator sets by k parity: 8 independent mma chains), added to the partner
//   warp's (other half) through shared memory and a 64-thread named barrier, so both warps of a
//   pair hold the same full S. Softmax in registers; P goes straight from the accumulator layout to
//   the A fragments (no shared-memory round trip). O (16 rows x 256 dims of its half, 128 fp32
//   registers) += P (16 x 32) V (32 x 256), V fragments by ldmatrix.trans (2 x 32 mma).
//   K/V tiles are gathered with cp.async 16 B into a two-stage ring; the slot indices of the tile
//   after next are themselves fetched by cp.async one step ahead, so no thread ever waits on an
//   index load. Row stride 584 bf16 (1168 B) keeps ldmatrix conflict-free.
#include "attn_common.cuh"

#define FB_ROWS 64
#define FB_KEYS 32
#define FB_THREADS 256
#define FB_STR 584                 // bf16 per shared row of Q / K
#define FB_XCH_FLOATS (8 * 16 * 32)  // S partials: 8 warps x 16 values x 32 lanes
#define FB_SMEM_BYTES ((FB_ROWS * FB_STR + 2 * FB_KEYS * FB_STR) * 2 + FB_XCH_FLOATS * 4 + 2 * FB_KEYS * 4)
#define LN2_F 0.6931471805599453f

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

extern "C" __global__ void __launch_bounds__(FB_THREADS, 1)
verify_attn_bf16_mma(ATTN_BF16_PAGED_PARAMS) {
    extern __shared__ __align__(16) u16 smem_h[];
    u16* sQ = smem_h;                                     // [64][584]
    u16* sK = sQ + FB_ROWS * FB_STR;                      // [2][32][584]
    float4* sX = (float4*)(sK + 2 * FB_KEYS * FB_STR);    // [8 warps][4][32 lanes] float4
    int* sSlot = (int*)(sX + FB_XCH_FLOATS / 4);          // [2][32] pool slots of a tile's keys

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = warp & 3, half = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    ATTN_PAGED_REQUEST(FB_ROWS)
    const int mbase = mask_indptr[b];
    const int per_split = (kvlen + n_splits - 1) / n_splits;
    const int chunk = (per_split + FB_KEYS - 1) / FB_KEYS * FB_KEYS;
    const int kbeg = z * chunk;
    const int kend = min(kbeg + chunk, kvlen);
    const int ntiles = kend > kbeg ? (kend - kbeg + FB_KEYS - 1) / FB_KEYS : 0;
    const size_t grow0 = (size_t)b * rows_req + row0;

    // where key j's slot index lives (valid keys only)
    auto slot_src = [&](int j) -> const int* {
        return j < P ? kv_indices + ibase + j : tree_slots + (size_t)b * Q + (j - P);
    };
    auto load_tile = [&](int buf, int key0) {       // 32 keys x 72 chunks = 9 per thread
#pragma unroll
        for (int i = 0; i < (FB_KEYS * (ATTN_D / 8)) / FB_THREADS; ++i) {
            const int e = tid + i * FB_THREADS;
            const int kk = e / (ATTN_D / 8), c = e - kk * (ATTN_D / 8);
            const bool ok = key0 + kk < kend;
            const int slot = ok ? sSlot[buf * FB_KEYS + kk] : 0;
            cp_async16(sK + (buf * FB_KEYS + kk) * FB_STR + c * 8, kv_buffer + (size_t)slot * ATTN_D + c * 8, ok);
        }
    };

    // prologue: Q, slots of tiles 0 (plain loads) and 1 (cp.async), K tile 0
    for (int e = tid; e < FB_ROWS * (ATTN_D / 8); e += FB_THREADS) {
        const int r = e / (ATTN_D / 8), c = e - r * (ATTN_D / 8);
        const bool ok = r < nrows;
        cp_async16(sQ + r * FB_STR + c * 8, q + (grow0 + (ok ? r : 0)) * ATTN_D + c * 8, ok);
    }
    if (tid < FB_KEYS) {
        const int j = kbeg + tid;
        sSlot[tid] = j < kend ? *slot_src(j) : 0;
    }
    __syncthreads();
    if (ntiles > 0) load_tile(0, kbeg);
    if (tid < FB_KEYS) {
        const int j = kbeg + FB_KEYS + tid;
        cp_async4(sSlot + FB_KEYS + tid, j < kend ? slot_src(j) : kv_indptr, j < kend);
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
        const int key0 = kbeg + it * FB_KEYS;
        cp_async_wait<0>();                               // tile `it` and the slots of `it + 1` landed
        __syncthreads();                                  // ... for everyone; step it-1 fully done
        if (it + 1 < ntiles) {
            load_tile((it + 1) & 1, key0 + FB_KEYS);
            if (tid < FB_KEYS) {                          // slots of tile it + 2 into the free slot buffer
                const int j = key0 + 2 * FB_KEYS + tid;
                cp_async4(sSlot + (it & 1) * FB_KEYS + tid, j < kend ? slot_src(j) : kv_indptr, j < kend);
            }
        }
        cp_async_commit();
        const u16* Kt = sK + (it & 1) * FB_KEYS * FB_STR;

        // partial S over this half's 288 dims: 16 rows x 32 keys
        float sp[2][4][4];
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int n = 0; n < 4; ++n) { sp[x][n][0] = sp[x][n][1] = sp[x][n][2] = sp[x][n][3] = 0.f; }
        const u16* kb = Kt + ((lane & 7) + ((lane >> 4) << 3)) * FB_STR + ((lane >> 3) & 1) * 8 + half * 288;
#pragma unroll
        for (int ks = 0; ks < 18; ++ks) {
            u32 a[4], b0[4], b1[4];
            ldmatrix_x4(a, qa + ks * 16);
            ldmatrix_x4(b0, kb + ks * 16);
            ldmatrix_x4(b1, kb + 16 * FB_STR + ks * 16);
            mma_bf16_16816(sp[ks & 1][0], a, b0[0], b0[1]);
            mma_bf16_16816(sp[ks & 1][1], a, b0[2], b0[3]);
            mma_bf16_16816(sp[ks & 1][2], a, b1[0], b1[1]);
            mma_bf16_16816(sp[ks & 1][3], a, b1[2], b1[3]);
        }
        float s[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = sp[0][n][e] + sp[1][n][e];
        // exchange with the partner warp: both end up with the same full S (fp add commutes)
#pragma unroll
        for (int n = 0; n < 4; ++n) sX[(warp * 4 + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
        named_barrier(1 + rg, 64);
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const float4 x = sX[(((warp ^ 4)) * 4 + n) * 32 + lane];
            s[n][0] += x.x; s[n][1] += x.y; s[n][2] += x.z; s[n][3] += x.w;
        }

        // scale, mask, row max over the 32 keys
        float mx0 = neg_inf(), mx1 = neg_inf();
#pragma unroll
        for (int n = 0; n < 4; ++n) {
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
        u32 pf[4][2];                                     // P as bf16 pairs, accumulator layout
#pragma unroll
        for (int n = 0; n < 4; ++n) {
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
        for (int ks = 0; ks < FB_KEYS / 16; ++ks) {
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

    // row sums: the quad holds one row's 32 keys; both warps of a pair hold identical sums
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

ATTN_MERGE_ENTRY(verify_attn_bf16_mma_merge, u16, StoreBF16)
