// bf16_wgmma2's staged epilogue (WG2_STAGED_STORE 1; verify_attn_bf16_wgmma2.cu includes it after
// its tile macros: WG_ROWS, WG_THREADS, LN2_F). The tile leaves through shared memory: each
// thread's fragments into `stage` (the K ring, free: every wgmma that read it and every cp.async into
// it completed before BAR_FIN and the sync below), rows padded by 16 B (bf16) / 32 B (fp32) so that
// a warp's 8 rows hit distinct banks; then whole rows out, a warp storing 512 contiguous bytes with
// 16-byte stores (instead of 8 rows x 16 or 32 bytes a store instruction). The same values as the kernel's direct stores, bit for bit: out = bf16_rn(O / l) and
// lse of rows grow0 + r where the block ran its request whole (`direct`), else the fp32 partial rows
// prow + r (O, m in natural-log units, l). Thread (wg, t) holds tile rows r0, r1 and columns
// wg * 256 + 2 t + 8 i (o[4 i .. 4 i + 3], i < 32).
#pragma once

#define WG2_OUT_PITCH (1024 + 16)             // bytes a staged bf16 row (padded: no bank conflicts)
#define WG2_PART_PITCH (2048 + 32)            // ... a staged fp32 partial row

__device__ __forceinline__ void store_tile_staged(const float (&o)[128], float l0, float l1, float m0, float m1,
                                                  bool direct, int r0, int r1, int nrows, int wg, int t,
                                                  size_t grow0, size_t prow, u16* __restrict__ out,
                                                  float* __restrict__ lse, float* __restrict__ ws_o,
                                                  float* __restrict__ ws_m, float* __restrict__ ws_l,
                                                  unsigned char* stage) {
    const size_t gr0 = grow0 + r0, gr1 = grow0 + r1;
    const bool rv0 = r0 < nrows, rv1 = r1 < nrows;
    const int colbase = wg * 256 + 2 * t;
    __syncthreads();
    if (direct) {
        const float inv0 = __frcp_rn(l0), inv1 = __frcp_rn(l1);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int col = colbase + 8 * i;
            *(u32*)(stage + r0 * WG2_OUT_PITCH + 2 * col) =
                pack_bf16x2(div_rn_by(o[4 * i], l0, inv0), div_rn_by(o[4 * i + 1], l0, inv0));
            *(u32*)(stage + r1 * WG2_OUT_PITCH + 2 * col) =
                pack_bf16x2(div_rn_by(o[4 * i + 2], l1, inv1), div_rn_by(o[4 * i + 3], l1, inv1));
        }
        if (wg == 0 && t == 0) {
            if (rv0) lse[gr0] = LN2_F * (m0 + log2f(l0));
            if (rv1) lse[gr1] = LN2_F * (m1 + log2f(l1));
        }
        __syncthreads();
#pragma unroll 4
        for (int c = threadIdx.x; c < WG_ROWS * 64; c += WG_THREADS) {         // 64 16-byte chunks a row
            const int row = c >> 6, k = c & 63;
            if (row < nrows)
                *(uint4*)(out + (grow0 + row) * ATTN_DV + 8 * k) = *(const uint4*)(stage + row * WG2_OUT_PITCH + 16 * k);
        }
    } else {
        const size_t pr0 = prow + r0, pr1 = prow + r1;    // partial rows
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int col = colbase + 8 * i;
            *(float2*)(stage + r0 * WG2_PART_PITCH + 4 * col) = make_float2(o[4 * i], o[4 * i + 1]);
            *(float2*)(stage + r1 * WG2_PART_PITCH + 4 * col) = make_float2(o[4 * i + 2], o[4 * i + 3]);
        }
        if (wg == 0 && t == 0) {
            if (rv0) { ws_m[pr0] = m0 * LN2_F; ws_l[pr0] = l0; }
            if (rv1) { ws_m[pr1] = m1 * LN2_F; ws_l[pr1] = l1; }
        }
        __syncthreads();
#pragma unroll 4
        for (int c = threadIdx.x; c < WG_ROWS * 128; c += WG_THREADS) {        // 128 16-byte chunks a row
            const int row = c >> 7, k = c & 127;
            if (row < nrows)
                *(float4*)(ws_o + (prow + row) * ATTN_DV + 4 * k) = *(const float4*)(stage + row * WG2_PART_PITCH + 16 * k);
        }
    }
}
