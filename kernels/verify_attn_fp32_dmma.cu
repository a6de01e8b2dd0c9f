// verify_attn, variant fp32, kernel `fp32_dmma`: MLA absorbed tree-verify attention, contiguous layout (docs/ops/verify_attn.md),
// warp-specialised: 4 warps compute the scores on the FP64 tensor cores (exact products), 8 warps
// run the softmax and P.V on the FP32 FMA units, handing 16-key sub-tiles over through mbarriers.
// The launch picks it where fp32_bf16x3's grid, split by its wave model, would fill under 3/4 of the
// SMs: too few keys to split (kernels/README.md).
// On the H200 the MMAs, the fp32 -> fp64 conversions and the FFMAs do not overlap (an SM runs them in
// the sum of their times, kernels/NOTES.md), so its speed comes from the structure (no split-K reduction of
// the scores through shared memory, two barriers a sub-tile instead of 19 a 64-key tile), not a
// second unit. Knobs (timing only, wrong results): FD_DIAG = 1 no score MMAs, 2 no P.V FMAs;
// FD_PROFILE = 1 clock64 stamps of warps 0, 7 and 8 into `out` (run without the merge).
//
// Launch (main): grid = (ceil(Q*H / FD_ROWS), B, n_splits), block = FD_THREADS (384), dynamic
//   shared memory FD_SMEM_BYTES (228,592 B: opt-in; one block per SM; the kernel traps with less).
//   verify_attn_fp32_dmma(q f32 [B,Q,H,576], kv f32 [B,S,576], prefix_len i32 [B],
//                         visibility u8 [B,Q,Q], B, Q, H, S, sm_scale, n_splits,
//                         out f32 [B,Q,H,512], lse f32 [B,Q,H], ws_o, ws_m, ws_l)
//   A block owns FD_ROWS (34) consecutive (token, head) rows of one request (request-major i*H + h)
//   and one split of that request's keys: chunk = ceil(kvlen / n_splits) rounded up to 16 keys,
//   kvlen = prefix_len[b] + Q; split z has keys [z*chunk, min(kvlen, (z+1)*chunk)) (possibly empty:
//   it writes m = -inf, l = 0). The split is walked in sub-tiles of 16 keys. n_splits == 1: the
//   block writes out/lse; otherwise the partials of attn_common.cuh and verify_attn_fp32_dmma_merge
//   (grid = B*Q*H, block = 128) finishes. The host (split_min_tiles = 4) picks 16 splits at
//   B=1 H=16 Q=17 P=2048: 8 row tiles x 16 = 128 blocks of <= 144 keys (9 sub-tiles).
//
// Warp roles (no __syncthreads after the prologue; hand-offs through mbarriers, release/acquire):
//   S warps 8..11 (one per SM sub-partition): copy each sub-tile's 16 kv rows with cp.async into a
//     3-slot ring (two sub-tiles ahead), then S^T[16 keys][40 rows] = K Q^T with
//     mma.sync.m16n8k4.f64 (A = K: a0 key g, a1 key g+8, k = t; B = Q^T: k = t, n = row g;
//     C: keys g / g+8, rows 2t, 2t+1 of each 8-row n tile; g = lane / 4, t = lane % 4). S warp w
//     sums dims [144w, 144w + 144): 9 groups of 16 dims, in group G k-step u lane t takes dim
//     16G + 4t + u (one LDS.128 feeds 4 k-steps). Its fp64 partial goes to sS[t & 1][w].
//   O warps 0..7: per sub-tile, the softmax (threads 0..135: row tid / 4, keys 4 (tid % 4) ..+3),
//     then O = alpha O + P V over the 16 keys; warp w owns rows 17 (w & 1) ..+16 and columns
//     128 (w >> 1) + 4 lane ..+3 (68 accumulators a thread, the whole 34 x 512 O in registers).
//   The S warps write sub-tile t's partial and arrive on FULL before they refill the ring (the
//     refill's ~700 cycles of cp.async issue stay off the O warps' path).
//   mbarriers (every thread of a side arrives after its own accesses: racecheck follows only direct
//     release / acquire pairs): FULL[2] (128 S threads: partials of sub-tile t in sS[t & 1], kv of t
//     landed), EMPTY_S[2] (256 O threads: sS[t & 1] read), EMPTY_KV[3] (256 O threads: ring slot
//     t % 3 free). Named barriers: 1 = the 4 S warps (every S thread's copies landed), 2 = the 8 O
//     warps (P and alpha of the sub-tile written).
//
// Numerical contract: no arithmetic below FP32, no TF32. q . k_j is accumulated in FP64 on the
//   tensor cores: every product of two fp32 values is exact in fp64; four partial sums over
//   dims [144w, 144w + 144) (the hardware's order inside each MMA) are added in w order in fp64,
//   then s_j = (float)(dot * (double)sm_scale), one rounding. Per 16-key sub-tile one online
//   softmax step in fp32: m_new = max(m_old, max_j s_j), p_j = expf(s_j - m_new), alpha =
//   expf(m_old - m_new) (1 while m_new is -inf), l = alpha l + ((p0 + p1) + (p2 + p3)) summed over
//   the 4 key quads by xor-1 then xor-2 shuffles; O = alpha O, then O += p_j v_j in one fmaf chain
//   in ascending j. out = O / l, lse = m + logf(l). Prefix keys are always visible, tree key j iff
//   visibility[b, i, j - prefix_len]. kv rows at or past prefix_len[b] + Q (NaN padding) and q rows
//   past the request's Q*H are never read: cp.async with a 0-byte source zero-fills them, and masked
//   keys get p = 0 exactly. Target: relative L2 <= 1e-6 against float64.
//
// Shared memory (FD_SMEM_BYTES = 228,592 B):
//   sS   [2][4 S warps][34 rows][16 keys] fp64 partial scores                      34,816
//   sQ   [34 rows][576] fp32, 16-byte chunk c of row r stored at chunk c ^ 4 (r & 1)   78,336
//        (an LDS.128 quarter-warp reads rows g, g+1 at chunks 4G + t: 8 distinct bank quads)
//   sKV  [3 slots][16 keys][576] fp32, the same swizzle                              110,592
//   sP   [2][34][16] fp32 softmax weights, sAlpha [2][36], sL [36]                    4,928
//   7 mbarriers                                                                           64
#include "attn_common.cuh"

#define FD_ROWS 34                               // rows per block: two O row halves of 17
#define FD_A (FD_ROWS / 2)                       // rows per O thread
#define FD_NT 5                                  // n8 tiles of rows in the S MMAs (rows 34..39 zero)
#define FD_KEYS 16                               // keys per sub-tile: one m16 tile
#define FD_SW 4                                  // S warps: split over 4 dim quarters
#define FD_OW 8                                  // O warps
#define FD_OT (FD_OW * 32)                       // O threads
#define FD_THREADS ((FD_SW + FD_OW) * 32)        // 384
#define FD_RING 3                                // kv ring slots (sub-tiles in flight + 1)
#define FD_CH (ATTN_D / 4)                       // 16-byte chunks per 576-float row
#define FD_G (ATTN_D / (16 * FD_SW))             // 16-dim groups per S warp (9)
#define FD_STAT 36                               // per-row stats, padded to a multiple of 4
#define FD_S_DOUBLES (FD_SW * FD_ROWS * FD_KEYS) // one sS buffer
#define FD_Q_FLOATS (FD_ROWS * ATTN_D)
#define FD_KV_FLOATS (FD_KEYS * ATTN_D)
#define FD_P_FLOATS (FD_ROWS * FD_KEYS)
#define FD_SMEM_BYTES (2 * FD_S_DOUBLES * 8 + \
                       (FD_Q_FLOATS + FD_RING * FD_KV_FLOATS + 2 * FD_P_FLOATS + 3 * FD_STAT) * 4 + 64)
#define FD_MAXZ 16                               // merge: splits loaded per batch
#ifndef FD_PROFILE
#define FD_PROFILE 0                             // timing only: clock64 stamps of warps 0, 7, 8 into `out`
#endif
#if FD_PROFILE   // out as int64 [block][warp 0 | 7 | 8][sub-tile 0..8, 9 = start / end][event 6]; run without the merge
#define FD_STAMP(t, e)                                                                                   \
    do {                                                                                                 \
        const int wsel_ = warp == 0 ? 0 : warp == 7 ? 1 : warp == 8 ? 2 : -1;                          \
        if (lane == 0 && wsel_ >= 0 && (t) < 10) {                                                       \
            const int blk_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);            \
            ((long long*)out)[((blk_ * 3 + wsel_) * 10 + (t)) * 6 + (e)] = clock64();                   \
        }                                                                                                \
    } while (0)
#else
#define FD_STAMP(t, e) do {} while (0)
#endif
#ifndef FD_DIAG
#define FD_DIAG 0                                // timing only: 1 no score MMAs, 2 no P.V FMAs
#endif

#if FD_NT * 8 < FD_ROWS || FD_ROWS % 2 != 0 || 4 * FD_ROWS > FD_OT || FD_STAT < FD_ROWS
#error "row tiling: 34 rows need 5 n8 tiles, 2 O row halves and 136 softmax threads"
#endif
#if defined(FD_EXPECT_SMEM) && FD_EXPECT_SMEM != FD_SMEM_BYTES
#error "FD_SMEM_BYTES differs from the host's registry entry (kdtr/ops/verify_attn/cuda.py)"
#endif
#if defined(FD_EXPECT_THREADS) && FD_EXPECT_THREADS != FD_THREADS
#error "FD_THREADS differs from the host's registry entry (kdtr/ops/verify_attn/cuda.py)"
#endif

// float offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][576] tile
__device__ __forceinline__ int fd_at(int row, int chunk) {
    return row * ATTN_D + 4 * (chunk ^ ((row & 1) << 2));
}

__device__ __forceinline__ float f4_at(const float4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

extern "C" __global__ void __launch_bounds__(FD_THREADS, 1)
verify_attn_fp32_dmma(ATTN_DENSE_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    if (dynamic_smem_bytes() < FD_SMEM_BYTES) __trap();         // host and kernel disagree
    double* sS = (double*)smem_raw;
    float* sQ = (float*)(sS + 2 * FD_S_DOUBLES);
    float* sKV = sQ + FD_Q_FLOATS;
    float* sP = sKV + FD_RING * FD_KV_FLOATS;
    float* sAlpha = sP + 2 * FD_P_FLOATS;
    float* sL = sAlpha + 2 * FD_STAT;
    const unsigned mb = smem_addr(sL + FD_STAT);                 // FULL 0,1 | EMPTY_S 2,3 | EMPTY_KV 4..6
    const unsigned mb_full = mb, mb_empty_s = mb + 16, mb_empty_kv = mb + 32;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    ATTN_DENSE_REQUEST(FD_ROWS, FD_KEYS)
    const int nsub = (kend - kbeg + FD_KEYS - 1) / FD_KEYS;
    const size_t grow0 = (size_t)b * rows_req + row0;
    const size_t rows_total = (size_t)B * rows_req;
    const float* kvb = kv + (size_t)b * S * ATTN_D;
    const bool s_warp = warp >= FD_OW;                           // warp-uniform role
    const int st = tid - FD_OT;                                  // S thread index 0..127

    // kv rows of sub-tile s into ring slot s % 3 (S threads; commit by the caller)
    auto issue_kv = [&](int s) {
        float* dst = sKV + (s % FD_RING) * FD_KV_FLOATS;
        const int key0 = kbeg + s * FD_KEYS;
#pragma unroll
        for (int i = 0; i < FD_KEYS * FD_CH / (32 * FD_SW); ++i) {
            const int e = st + 32 * FD_SW * i, r = e / FD_CH, c = e - r * FD_CH;
            const int j = key0 + r;
            const bool ok = j < kend;
            cp_async16(dst + fd_at(r, c), kvb + (size_t)(ok ? j : 0) * ATTN_D + 4 * c, ok);
        }
    };

    {   // prologue: the Q tile (every thread; rows past nrows zero), sub-tiles 0 and 1 (S threads)
        const float* qb = q + grow0 * ATTN_D;
        for (int e = tid; e < FD_ROWS * FD_CH; e += FD_THREADS) {
            const int r = e / FD_CH, c = e - r * FD_CH;
            const bool ok = r < nrows;
            cp_async16(sQ + fd_at(r, c), qb + (size_t)(ok ? r : 0) * ATTN_D + 4 * c, ok);
        }
        cp_async_commit();
        if (s_warp) {
            if (nsub > 0) issue_kv(0);
            cp_async_commit();
            if (nsub > 1) issue_kv(1);
            cp_async_commit();
            cp_async_wait<2>();                                  // this thread's Q copies
        } else {
            cp_async_wait<0>();
        }
        if (tid == 0) {
            // every thread of a side arrives after its own accesses (no hand-off through another
            // thread's arrive: racecheck follows only direct release / acquire pairs)
            mbar_init(mb_full, 32 * FD_SW); mbar_init(mb_full + 8, 32 * FD_SW);
            mbar_init(mb_empty_s, FD_OT); mbar_init(mb_empty_s + 8, FD_OT);
            for (int i = 0; i < FD_RING; ++i) mbar_init(mb_empty_kv + 8 * i, FD_OT);
        }
        __syncthreads();                                         // Q visible, mbarriers initialised
    FD_STAMP(9, 0);
    }

    if (s_warp) {
        // ---------------- S warps: scores of each sub-tile, fp64 partial over dims [144w, 144w+144)
        const int sw = warp - FD_OW, g = lane >> 2, t4 = lane & 3;
        const int swz = (g & 1) << 2;                            // rows / keys g, g + 8, 8n + g: parity of g
        const bool row4 = 32 + g < FD_ROWS;                      // n tile 4: rows 32 + g exist
#pragma unroll 1
        for (int t = 0; t < nsub; ++t) {
            FD_STAMP(t, 0);
            cp_async_wait<1>();                                  // sub-tile t (only t + 1 may be pending)
            named_barrier(1, 32 * FD_SW);                        // ... for every S thread
            FD_STAMP(t, 1);
            const float* ks = sKV + (t % FD_RING) * FD_KV_FLOATS;
            double acc[FD_NT][4];
#pragma unroll
            for (int n = 0; n < FD_NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0;
#if FD_DIAG != 1
#pragma unroll 3
            for (int jg = 0; jg < FD_G; ++jg) {
                const int off = 4 * ((4 * (FD_G * sw + jg) + t4) ^ swz);
                const float4 ka = *(const float4*)(ks + g * ATTN_D + off);
                const float4 kb = *(const float4*)(ks + (g + 8) * ATTN_D + off);
                float4 qv[FD_NT];
#pragma unroll
                for (int n = 0; n < FD_NT - 1; ++n) qv[n] = *(const float4*)(sQ + (8 * n + g) * ATTN_D + off);
                qv[FD_NT - 1] = row4 ? *(const float4*)(sQ + (8 * (FD_NT - 1) + g) * ATTN_D + off)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const double a0 = (double)f4_at(ka, u), a1 = (double)f4_at(kb, u);
#pragma unroll
                    for (int n = 0; n < FD_NT; ++n) dmma_16x8x4(acc[n], a0, a1, (double)f4_at(qv[n], u));
                }
            }
#endif
            FD_STAMP(t, 2);
            // the partial to sS[t & 1] once the O warps have read sub-tile t - 2's
            if (t >= 2) mbar_wait(mb_empty_s + 8 * (t & 1), ((t >> 1) - 1) & 1);
            FD_STAMP(t, 3);
            double* ss = sS + (t & 1) * FD_S_DOUBLES + sw * FD_ROWS * FD_KEYS;
#pragma unroll
            for (int n = 0; n < FD_NT; ++n) {
                const int r = 8 * n + 2 * t4;
                if (r < FD_ROWS) {
                    ss[r * FD_KEYS + g] = acc[n][0];
                    ss[r * FD_KEYS + g + 8] = acc[n][2];
                }
                if (r + 1 < FD_ROWS) {
                    ss[(r + 1) * FD_KEYS + g] = acc[n][1];
                    ss[(r + 1) * FD_KEYS + g + 8] = acc[n][3];
                }
            }
            mbar_arrive(mb_full + 8 * (t & 1));
            FD_STAMP(t, 4);
            // then the refill (off the O warps' path: ~700 cycles of cp.async issue): sub-tile t + 2
            // goes to the slot of t - 1, free once the O warps are done with it
            if (t + 2 < nsub) {
                if (t >= 1) mbar_wait(mb_empty_kv + 8 * ((t - 1) % FD_RING), ((t - 1) / FD_RING) & 1);
                issue_kv(t + 2);
            }
            cp_async_commit();
            FD_STAMP(t, 5);
        }
        FD_STAMP(9, 1);
        cp_async_wait<0>();                                      // only empty groups are left
        return;
    }

    // ---------------- O warps: softmax, then O = alpha O + P V
    const int prow = (warp & 1) * FD_A;                          // this thread's 17 rows
    const int pch = 32 * (warp >> 1) + lane;                     // and its chunk: columns 4 pch ..+3
    const bool s_role = warp * 8 < FD_ROWS;                      // warp-uniform: warps 0..4 run softmax
    const int srow_raw = tid >> 2, skq = 4 * (tid & 3);
    const bool srow_in = srow_raw < FD_ROWS;
    const int srow = srow_in ? srow_raw : FD_ROWS - 1;           // lanes past row 33 read row 33, write nothing
    const bool srow_ok = srow_in && srow < nrows;
    const u8* vrow = visibility + ((long long)b * Q * Q + (long long)(srow_ok ? (row0 + srow) / H : 0) * Q - P);
    const double scale = (double)sm_scale;
    float m_run = neg_inf(), l_run = 0.f;
    float o[FD_A][4];
#pragma unroll
    for (int r = 0; r < FD_A; ++r) o[r][0] = o[r][1] = o[r][2] = o[r][3] = 0.f;

#pragma unroll 1
    for (int t = 0; t < nsub; ++t) {
        FD_STAMP(t, 0);
        const int buf = t & 1;
        mbar_wait(mb_full + 8 * buf, (t >> 1) & 1);              // partials of t (and its kv rows)
        FD_STAMP(t, 1);
        float* pb = sP + buf * FD_P_FLOATS;
        float* ab = sAlpha + buf * FD_STAT;
        if (s_role) {
            const double* ss = sS + buf * FD_S_DOUBLES + srow * FD_KEYS + skq;
            double d[4];
            {
                const double2 lo = *(const double2*)ss, hi = *(const double2*)(ss + 2);
                d[0] = lo.x; d[1] = lo.y; d[2] = hi.x; d[3] = hi.y;
            }
#pragma unroll
            for (int w = 1; w < FD_SW; ++w) {
                const double2 lo = *(const double2*)(ss + w * FD_ROWS * FD_KEYS);
                const double2 hi = *(const double2*)(ss + w * FD_ROWS * FD_KEYS + 2);
                d[0] += lo.x; d[1] += lo.y; d[2] += hi.x; d[3] += hi.y;
            }
            const int j0 = kbeg + t * FD_KEYS + skq;
            float s[4], mx = neg_inf();
            bool ok[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int j = j0 + k;
                bool a = srow_ok && j < kend;
                if (a && j >= P) a = vrow[j] != 0;
                ok[k] = a;
                s[k] = a ? (float)(d[k] * scale) : neg_inf();
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
            if (srow_in) {
                *(float4*)(pb + srow * FD_KEYS + skq) = make_float4(p[0], p[1], p[2], p[3]);
                if (skq == 0) ab[srow] = alpha;
            }
        }
        FD_STAMP(t, 2);
        mbar_arrive(mb_empty_s + 8 * buf);                       // this thread's reads of sS[buf] done
        named_barrier(2, FD_OT);                                 // P, alpha of t written
        FD_STAMP(t, 3);

        const float* pr = pb + prow * FD_KEYS;
#pragma unroll
        for (int r = 0; r < FD_A; ++r) {
            const float a = ab[prow + r];
            o[r][0] *= a; o[r][1] *= a; o[r][2] *= a; o[r][3] *= a;
        }
        const float* vs = sKV + (t % FD_RING) * FD_KV_FLOATS;
#if FD_DIAG != 2
#pragma unroll
        for (int s4 = 0; s4 < FD_KEYS / 4; ++s4) {
            float4 v4[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) v4[j] = *(const float4*)(vs + fd_at(4 * s4 + j, pch));
            ATTN_PV_4KEYS(o, v4, pr, FD_KEYS, 4 * s4, FD_A)
        }
#endif
        FD_STAMP(t, 4);
        mbar_arrive(mb_empty_kv + 8 * (t % FD_RING));            // this thread is done with slot t % 3
        FD_STAMP(t, 5);
    }

    // ---------------- epilogue: O rows (normalised when the keys are not split), then the stats
    if (s_role && srow_in && skq == 0) sL[srow] = l_run;
    named_barrier(2, FD_OT);
    FD_STAMP(9, 1);
    const bool direct = n_splits == 1;
    float* base = (direct ? out : ws_o + (size_t)z * rows_total * ATTN_DV) + (grow0 + prow) * ATTN_DV + 4 * pch;
#pragma unroll
    for (int r = 0; r < FD_A; ++r) {
        if (prow + r < nrows) {
            float4 v = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
            if (direct) {
                const float l = sL[prow + r];
                v = make_float4(v.x / l, v.y / l, v.z / l, v.w / l);
            }
            *(float4*)(base + (size_t)r * ATTN_DV) = v;
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

// grid = B*Q*H rows, block = MERGE_THREADS (128): attn_common.cuh's merge_row_batched (16 splits'
// o rows in flight at once: one round trip at the timing shape).
ATTN_MERGE_BATCHED_ENTRY(verify_attn_fp32_dmma_merge, FD_MAXZ)
