// tree_build, kernel `warp`: best-first DDTree draft tree from per-depth top-K log-probs (docs/ops/tree_build.md).
//
// Launch: grid = B (one block per request), block = TB_THREADS (256), dynamic shared memory =
//   what carve() below lays out (the host computes the same sum; Kc = min(K, Q), the columns that
//   can ever be read: a popped node's rank is < budget, so r + 1 <= budget < Q).
//   Entry tree_build_warp: candidates in registers, TB_NPL per lane (compile-time define, the host
//   picks the power of two with capacity 32 * TB_NPL >= budget + 1: a pop that pushes nothing
//   leaves a hole, one that pushes two appends a slot), budget <= 512. Arguments:
//   (topk_logp f32 [B,L,K], topk_ids i32 [B,L,K], root_token i32 [B], start i32 [B], B, L, K,
//    budget, staged, tokens, parents, depths, positions, ranks i32 [B,Q], scores f64 [B,Q],
//    visibility u8 [B,Q,Q], num_nodes i32 [B])
//   `staged` = 1: the first Kc columns of topk_logp/topk_ids are copied to shared memory (the host
//   sets it when they fit); 0: they are read from global memory (large K * L).
//
// Numerical contract (bit-exact with the numpy reference, kdtr/ops/tree_build/reference.py):
//   * path scores are doubles computed in the reference's operation order from the fp32 log-probs:
//     first node lp[0][0]; child of (s, d): s + lp[d][0]; next sibling of (s, d, r):
//     (s - lp[d-1][r]) + lp[d-1][r+1]. No FMA contraction can apply (no products).
//   * selection: the highest score; exact ties (== on doubles, so -0.0 == +0.0) go to the
//     lexicographically smaller rank tuple, a shorter prefix first ((0,0) < (1,), (0,) < (0,0)).
//   * nodes are numbered in pop order; every output element is written (padding: -1, -inf, 0).
//
// Design: warp 0 runs the lazy heap as an unsorted candidate set (a pop adds at most one live
// candidate, so capacity = budget suffices). Each pop: every lane finds its best slot, the warp the
// maximum key with two __reduce_max_sync over the order-preserving 64-bit image of the score; exact
// ties (rare) are settled by comparing rank tuples through the parent links. In tree_build_warp
// every lane also reads the log-probs its local best would need if it won, while the reduction
// runs, so the winner's successors are ready the moment it is known. Node ancestry paths (u16,
// stride L+1) give O(1) visibility tests; all 256 threads stage the inputs and write the outputs.
// Times: kernels/NOTES.md.

#include "tree_build_common.cuh"

#ifndef TB_NPL
#define TB_NPL 1
#endif

// Writes (score, desc) into candidate slot `slot` (lane slot % 32, register slot / 32).
__device__ __forceinline__ void set_slot(double (&cs)[TB_NPL], u64 (&cd)[TB_NPL], int lane, int slot,
                                         double score, u64 desc) {
    const bool mine = lane == (slot & 31);
    const int sj = slot >> 5;
#pragma unroll
    for (int j = 0; j < TB_NPL; ++j) {         // selects, not an indexed store (which goes to local memory)
        const bool hit = mine && j == sj;
        cs[j] = hit ? score : cs[j];
        cd[j] = hit ? desc : cd[j];
    }
}

extern "C" __global__ void __launch_bounds__(TB_THREADS)
tree_build_warp(TREE_BUILD_STAGED_PARAMS) {
    extern __shared__ __align__(16) char smem_raw[];
    __shared__ int s_num_nodes;
    TREE_BUILD_STAGED_REQUEST()
    stage_request<false>(s, g_lp, g_ids, root_token, b, L, K, Kc, staged);
    __syncthreads();

    if (tid < 32) {
        const int lane = tid;
        double cs[TB_NPL];
        u64 cd[TB_NPL];
#pragma unroll
        for (int j = 0; j < TB_NPL; ++j) { cs[j] = 0.0; cd[j] = 0; }
        int count = 0;                                 // slots in use (holes included), same in every lane
        int live = 0;                                  // candidates in them
        if (budget > 0) {
            if (lane == 0) { cs[0] = (double)lp[0]; cd[0] = pack_cand(0, 0, 1); }
            count = live = 1;
        }
        int n = 0;
        while (n < budget && live > 0) {
            // 1. this lane's best slot (kept in scalars: no dynamic register indexing)
            bool have = false;
            double bs = 0.0;
            u64 bd = 0;
            int bj = 0;
#pragma unroll
            for (int j = 0; j < TB_NPL; ++j) {
                if (j * 32 + lane < count && cd[j] != 0ull) {
                    if (!have || cs[j] > bs || (cs[j] == bs && cand_less_walk(s, cd[j], bd))) {
                        have = true; bs = cs[j]; bd = cd[j]; bj = j;
                    }
                }
            }
            // 2. what this lane's best would need if it won (overlaps the reduction below)
            const int r = cand_rank(bd), d = cand_depth(bd), p = cand_parent(bd);
            double sib = 0.0, child = 0.0;
            int tok = 0;
            if (have) {
                const float* row = lp + (size_t)(d - 1) * ld;
                tok = ids[(size_t)(d - 1) * ld + r];
                if (r + 1 < K) sib = (bs - (double)row[r]) + (double)row[r + 1];
                if (d < L) child = bs + (double)lp[(size_t)d * ld];
            }
            // 3. the warp's best: high word of the key first; the low word and the rank tuples
            //    only when several lanes share it
            const u64 bk = have ? score_key(bs) : 0ull;
            const u32 hi = (u32)(bk >> 32);
            const u32 max_hi = __reduce_max_sync(FULL_MASK, hi);
            u32 tied = __ballot_sync(FULL_MASK, have && hi == max_hi);
            if (__popc(tied) > 1) {
                const u32 lo = (have && hi == max_hi) ? (u32)bk : 0u;
                const u32 max_lo = __reduce_max_sync(FULL_MASK, lo);
                tied = __ballot_sync(FULL_MASK, have && hi == max_hi && (u32)bk == max_lo);
            }
            int wl = __ffs(tied) - 1;
            if (__popc(tied) > 1) {                    // exact score tie across lanes
                u64 wd = __shfl_sync(FULL_MASK, bd, wl);
                u32 rest = tied & (tied - 1);
                while (rest) {
                    const int other = __ffs(rest) - 1;
                    rest &= rest - 1;
                    const u64 od = __shfl_sync(FULL_MASK, bd, other);
                    if (cand_less_walk(s, od, wd)) { wl = other; wd = od; }
                }
            }
            // 4. pop the winner as node n + 1: the winning lane writes the node and its own slot;
            //    the others only need (has_sib, has_child, depth) and, for an appended child, its score
            const int node = n + 1;
            const bool more = node < budget;
            const bool win = lane == wl;
            const bool my_sib = more && (r + 1 < K);
            const bool my_child = more && (d < L);
            const int flags = __shfl_sync(FULL_MASK, (my_sib ? 1 : 0) | (my_child ? 2 : 0) | (d << 2), wl);
            const double w_child = __shfl_sync(FULL_MASK, child, wl);
            const bool has_sib = flags & 1, has_child = flags & 2;
            const int wd = flags >> 2;
            if (win) {
                s.node_score[node] = bs;
                s.node_parent[node] = p;
                s.node_depth[node] = d;
                s.node_rank[node] = r;
                s.node_token[node] = tok;
                const double ns = has_sib ? sib : (has_child ? child : 0.0);
                const u64 nd = has_sib ? pack_cand(p, r + 1, d) : (has_child ? pack_cand(node, 0, d + 1) : 0ull);
#pragma unroll
                for (int j = 0; j < TB_NPL; ++j) {      // selects, not an indexed store
                    cs[j] = j == bj ? ns : cs[j];
                    cd[j] = j == bj ? nd : cd[j];
                }
            }
            if (has_sib && has_child) {                // the child takes a new slot
                set_slot(cs, cd, lane, count, w_child, pack_cand(node, 0, wd + 1));
                ++count;
            }
            live += (has_sib ? 1 : 0) + (has_child ? 1 : 0) - 1;
            n = node;
            __syncwarp();                              // node arrays visible to every lane
        }
        if (lane == 0) s_num_nodes = n;
    }
    __syncthreads();
    const int nn = s_num_nodes;
    build_paths(s, nn, stride);
    __syncthreads();
    write_outputs(s, b, Q, stride, nn, start[b], tokens, parents, depths, positions, ranks, scores,
                  visibility, num_nodes);
}
