// bf16_wgmma2's prefetch of the next segment (WG2_LPT 2 with WG2_SEG_PREFETCH 1; the kernel includes
// it after wgmma2_gather.cuh): what WG1 gathers of the segment after this one while this one ends,
// and the prologue of a pass that the pass before has begun. In the kernel's terms ("Hand-offs"):
//   Tiles: pre_next = min(the next segment's tiles, 2) if this segment has two or more, else 0. SF
//     then frees stage s for tile j + 2 also where j + 2 >= T (the next segment's tile j + 2 - T),
//     so a stage is refilled only by the pass that ran its last tile; WG0 arrives SF for j = T - 1
//     after its last wgmma_wait, as WG1 syncs it after its own P·V_{T-1}. The phases are unchanged:
//     a prefetched tile's KFULL arrive is the next pass's, in the same order (J0 + j).
//   Q: WG1 gathers the next segment's after its PFULL wait of tile T - 1: WG0 arrives PFULL_{T-1}
//     after S_{T-1}, this segment's last reader of Q, completed.
//   WG1's cp.async groups stay in flight across the epilogue (no wait before BAR_FIN); the next
//     pass's prologue gathers the rest and waits for all groups but the newest (tile 1's, or an
//     empty one): Q and tile 0 have landed.
#pragma once

// The block's segment after one of request b (the segment schedule walks requests in order): request
// b + 1 from key 0, of its tiles at most `left` (the block's tiles after request b's last; none
// left, or this segment ends before request b does: `left` <= 0, all fields 0). Its prefix keys are
// [0, P), its keys run [0, kend). Every request has a tile (its Q >= 1 tree keys), so a block whose
// tiles go on past request b has a next segment, and the next pass's Q is the one gathered here.
struct NextSeg {
    int ibase, P, kend, T;    // kv_indices offset, prefix keys, keys run, 64-key tiles run
};

__device__ __forceinline__ NextSeg next_segment(const int* __restrict__ kv_indptr, int b, int Q, int left) {
    NextSeg nx = {0, 0, 0, 0};
    if (left > 0) {
        nx.ibase = kv_indptr[b + 1];
        const int kvlen = kv_indptr[b + 2] - nx.ibase + Q;
        nx.T = min(left, (kvlen + 63) / 64);
        nx.P = kvlen - Q;
        nx.kend = min(nx.T * 64, kvlen);
    }
    return nx;
}

// This thread's slots of tile i of the next segment nx (request b1, from key 0; 0 past nx.kend), as
// the kernel's slots_of gives them for its own segment.
__device__ __forceinline__ void next_segment_slots(const NextSeg& nx, int b1, int Q, int i, int rg,
                                                   const int* __restrict__ kv_indices,
                                                   const int* __restrict__ tree_slots, int (&sl)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int j = i * 64 + rg + 16 * k;
        sl[k] = j >= nx.kend ? 0 : j < nx.P ? kv_indices[nx.ibase + j] : tree_slots[(size_t)b1 * Q + (j - nx.P)];
    }
}

// The prologue of a pass whose first `pre` tiles (0-2) the pass before gathered, and Q unless q_pre
// is false (the block's first pass): what is left of Q and tiles 0 and 1, a cp.async group for each
// tile (the pass before's groups, oldest first: tile 0, Q, tile 1), then this thread's slots of tile
// 2 into sl. tile_slots(i, sl) and tile_valid(i) are the pass's (i >= T: the next segment's i - T);
// gather_q(rows) gathers this pass's Q.
template <class Slots, class Valid, class GatherQ>
__device__ __forceinline__ void prefetched_prologue(int pre, bool q_pre, int T, int J0, unsigned gdst,
                                                    const unsigned char* gsrc, Slots tile_slots,
                                                    Valid tile_valid, GatherQ gather_q, int (&sl)[4]) {
    if (!q_pre) gather_q(sl);                             // (in tile 0's group)
    if (pre == 0) {
        tile_slots(0, sl);
        if (T > 0) gather_rows(gdst + (J0 & 1) * WG_TILE, gsrc, sl, tile_valid(0));
        cp_async_commit();
    }
    if (pre <= 1) {
        tile_slots(1, sl);
        if (T > 1) gather_rows(gdst + ((J0 + 1) & 1) * WG_TILE, gsrc, sl, tile_valid(1));
        cp_async_commit();
    }
    tile_slots(2, sl);
}
