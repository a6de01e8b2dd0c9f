// tree_build, kernel `smem`: best-first DDTree draft tree from per-depth top-K log-probs (docs/ops/tree_build.md).
//
// Launch: grid = B (one block per request), block = TB_THREADS (256), dynamic shared memory =
//   what carve() below lays out (the host computes the same sum; Kc = min(K, Q), the columns that
//   can ever be read: a popped node's rank is < budget, so r + 1 <= budget < Q).
//   Entry tree_build_smem: candidates in shared memory; any budget whose tree fits shared memory.
//   Arguments:
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

extern "C" __global__ void __launch_bounds__(TB_THREADS)
tree_build_smem(TREE_BUILD_STAGED_PARAMS) {
    extern __shared__ __align__(16) char smem_raw[];
    TREE_BUILD_STAGED_REQUEST()
    stage_request<true>(s, g_lp, g_ids, root_token, b, L, K, Kc, staged);
    __shared__ int s_num_nodes;
    __syncthreads();

    if (tid < 32) {
        const int lane = tid;
        int count = 0;                 // live candidates, identical in every lane
        if (budget > 0) {
            if (lane == 0) {
                s.cand_score[0] = (double)lp[0];
                s.cand[0] = pack_cand(0, 0, 1);
            }
            count = 1;
        }
        __syncwarp();
        int n = 0;                     // nodes popped so far
        while (n < budget && count > 0) {
            // 1. each lane's best slot
            int best = -1;
            u64 best_key = 0;
            for (int slot = lane; slot < count; slot += 32) {
                u64 k = score_key(s.cand_score[slot]);
                if (best < 0 || k > best_key ||
                    (k == best_key && cand_lex_less(s, stride, s.cand[slot], s.cand[best]))) {
                    best = slot;
                    best_key = k;
                }
            }
            // 2. the warp's best key: high word, then low word among lanes holding that high word
            u32 hi = best >= 0 ? (u32)(best_key >> 32) : 0u;
            u32 max_hi = __reduce_max_sync(FULL_MASK, hi);
            u32 lo = (best >= 0 && hi == max_hi) ? (u32)best_key : 0u;
            u32 max_lo = __reduce_max_sync(FULL_MASK, lo);
            u32 tied = __ballot_sync(FULL_MASK, best >= 0 && hi == max_hi && (u32)best_key == max_lo);
            int win = __shfl_sync(FULL_MASK, best, __ffs(tied) - 1);
            if (__popc(tied) > 1) {    // exact score tie across lanes: smallest rank tuple wins
                u32 rest = tied & (tied - 1);
                while (rest) {
                    int other_lane = __ffs(rest) - 1;
                    rest &= rest - 1;
                    int other = __shfl_sync(FULL_MASK, best, other_lane);
                    if (cand_lex_less(s, stride, s.cand[other], s.cand[win])) win = other;
                }
            }
            // 3. pop it: node n + 1
            const double sc = s.cand_score[win];
            const u64 c = s.cand[win];
            const int p = cand_parent(c), r = cand_rank(c), d = cand_depth(c);
            const int node = n + 1;
            const float* row = lp + (size_t)(d - 1) * ld;
            __syncwarp();              // every lane has read slot `win` before lane 0 rewrites it
            if (lane == 0) {
                s.node_score[node] = sc;
                s.node_parent[node] = p;
                s.node_depth[node] = d;
                s.node_rank[node] = r;
                s.node_token[node] = ids[(size_t)(d - 1) * ld + r];
            }
            for (int t = lane; t < d; t += 32) s.path[node * stride + t] = s.path[p * stride + t];
            if (lane == 0) s.path[node * stride + d] = (u16)node;
            n = node;
            // 4. push its next sibling and first child (only if another pop follows)
            const bool more = n < budget;
            const bool has_sib = more && (r + 1 < K);
            const bool has_child = more && (d < L);
            if (lane == 0) {
                if (has_sib) {
                    s.cand_score[win] = (sc - (double)row[r]) + (double)row[r + 1];
                    s.cand[win] = pack_cand(p, r + 1, d);
                    if (has_child) {
                        s.cand_score[count] = sc + (double)lp[(size_t)d * ld];
                        s.cand[count] = pack_cand(node, 0, d + 1);
                    }
                } else if (has_child) {
                    s.cand_score[win] = sc + (double)lp[(size_t)d * ld];
                    s.cand[win] = pack_cand(node, 0, d + 1);
                } else if (count > 0) {
                    s.cand_score[win] = s.cand_score[count - 1];
                    s.cand[win] = s.cand[count - 1];
                }
            }
            if (has_sib && has_child) count += 1;
            else if (!has_sib && !has_child) count -= 1;
            __syncwarp();
        }
        if (lane == 0) s_num_nodes = n;
    }
    __syncthreads();

    write_outputs(s, b, Q, stride, s_num_nodes, start[b], tokens, parents, depths, positions, ranks,
                  scores, visibility, num_nodes);
}
