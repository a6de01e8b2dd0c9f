// bf16_wgmma2's key gather (verify_attn_bf16_wgmma2.cu includes it after its tile macros: WG_NCB,
// WG_BLOCK, and the knob WG2_KV_HINT): how WG1 moves one 64-key tile of 576 bf16 columns from the
// paged pool into a swizzled stage of the K ring with cp.async, and a request's Q rows into Q's.
#pragma once

// Row-fixed gather of WG1. Thread wt of a warpgroup owns rows rg + 16 k (k = 0..3, rg = wt >> 3)
// of a 64-key tile and 16-byte chunk cc = wt & 7 of each of their 128-byte column blocks: a warp
// instruction reads 4 whole 128-byte lines (4 rows x 8 lanes). Since r & 7 == rg & 7 for all four
// rows, the swizzled destination of (k, block) is dst + 2048 k + 8192 block with dst = the stage base
// + rg * 128 + ((cc ^ (rg & 7)) << 4), and the source is src + slot_k * 1152 + 128 block with
// src = kv_buffer + 16 cc: one cp.async per chunk at immediate offsets from one pointer per row, no
// index math per chunk. All 9 blocks of the four rows; rows with 16 k >= nvalid_rg = (valid keys
// in the tile) - rg, keys past the split end, are zero-filled and read nothing. (No rope-first
// order: K-full covers the whole tile, and S reads the rope block last.)
// WG2_KV_HINT 1 marks the keys' lines evict-first in L2 (each is read once, so the partials and the
// slots keep their lines; FlashMLA's TMA loads carry the same hint), 2 also asks L2 to fetch 256 B a
// miss (no better than 1 on the H100: results/h100/s17/bench-hints.json).
__device__ __forceinline__ void gather_rows(unsigned dst, const unsigned char* src, const int (&slot)[4],
                                            int nvalid_rg) {
#if WG2_KV_HINT
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned char* row = src + (size_t)slot[k] * (ATTN_D * 2);
        const int sz = 16 * k < nvalid_rg ? 16 : 0;
#pragma unroll
        for (int blk = 0; blk < WG_NCB; ++blk)
#if WG2_KV_HINT == 2
            asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n"
                         :: "r"(dst + k * 2048 + blk * WG_BLOCK), "l"(row + blk * 128), "r"(sz), "l"(policy)
                         : "memory");
#elif WG2_KV_HINT
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n"
                         :: "r"(dst + k * 2048 + blk * WG_BLOCK), "l"(row + blk * 128), "r"(sz), "l"(policy)
                         : "memory");
#else
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                         :: "r"(dst + k * 2048 + blk * WG_BLOCK), "l"(row + blk * 128), "r"(sz) : "memory");
#endif
    }
}

// WG1's part of a request's Q rows into the Q buffer (Q's rows are its "slots": src is the row tile's
// first row in q, plus 16 cc bytes); rows past nrows read row 0 and are zero-filled.
__device__ __forceinline__ void gather_q_rows(unsigned dst, const unsigned char* src, int nrows, int rg,
                                              int (&rows)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) rows[k] = rg + 16 * k < nrows ? rg + 16 * k : 0;
    gather_rows(dst, src, rows, nrows - rg);
}
