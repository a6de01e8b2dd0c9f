// tree_build, winner-local variant: best-first DDTree draft tree (ops.md §1), the pop loop cut down
// to one warp reduction and the winner's own update per pop.
//
// Launch: grid = B (one block per request), block = TB_THREADS (256), dynamic shared memory = the
//   same carve() layout as tree_build.cu (tree_build_common.cuh; the host computes the same sum).
//   Entry: tree_build_wl(topk_logp f32 [B,L,K], topk_ids i32 [B,L,K], root_token i32 [B],
//     start i32 [B], B, L, K, budget, staged, tokens, parents, depths, positions, ranks i32 [B,Q],
//     scores f64 [B,Q], visibility u8 [B,Q,Q], num_nodes i32 [B]) -- tree_build.cu's arguments.
//   Compile-time TW_NPL: candidate slots per lane (a power of two, 32 * TW_NPL >= budget).
//
// Numerical contract: identical to tree_build.cu (bit-exact with the numpy reference): fp64 path
//   scores in the reference's operation order from the fp32 log-probs; the highest score pops,
//   exact ties to the lexicographically smaller rank tuple (shorter prefix first); nodes numbered
//   in pop order; every output element written.
//
// Design: warp 0 holds the live candidates, TW_NPL register slots per lane, and each lane keeps
// its local best (score, order key, successors) cached. A pop: one __reduce_max_sync over the
// high words of the 64-bit order keys and a ballot find the winning lane (low words and rank
// tuples only on exact ties); the winner alone writes the node and replaces its slot by the next
// sibling (or the first child) and puts the first child into one of its own free slots, then
// refreshes its cached best. No other lane changes, so nothing is broadcast on the common path.
// When the winner has no free slot (known before the pop through a ballot), the child goes to the
// lowest lane with one (capacity 32 * TW_NPL >= budget >= live candidates, so one exists).
//
// Status: bit-exact on an H200 (the GPU tests) but 2x SLOWER than tree_build_warp (54.0 vs 27.7 us
// at B=64, budget 64, L=15; 108 vs 75 us at budget 128): a pop costs its dependent instruction
// count, and the slot tournament plus two extra ballots doubled it although one shuffle went. Not
// selected by the launch (tb_wl in kdtr/ops/tree_build.py); kept as a measured negative result.
#include "tree_build_common.cuh"

#ifndef TW_NPL
#define TW_NPL 4
#endif

struct LaneBest {
    bool have;
    double score;
    u64 desc;
    int slot;
    int nfree;
};

// The lane's best candidate over its slots (a tournament, exact ties by rank tuple).
__device__ __forceinline__ LaneBest lane_best(const TreeSmem& s, const double (&cs)[TW_NPL],
                                              const u64 (&cd)[TW_NPL]) {
    bool hv[TW_NPL];
    double sc[TW_NPL];
    u64 ds[TW_NPL];
    int sl[TW_NPL];
    int nfree = 0;
#pragma unroll
    for (int j = 0; j < TW_NPL; ++j) {
        hv[j] = cd[j] != 0ull;
        sc[j] = cs[j];
        ds[j] = cd[j];
        sl[j] = j;
        nfree += hv[j] ? 0 : 1;
    }
#pragma unroll
    for (int w = 1; w < TW_NPL; w <<= 1) {
#pragma unroll
        for (int j = 0; j + w < TW_NPL; j += 2 * w) {
            const int k = j + w;
            bool take = false;                           // does k beat j?
            if (hv[k]) {
                take = !hv[j] || sc[k] > sc[j] || (sc[k] == sc[j] && cand_less_walk(s, ds[k], ds[j]));
            }
            if (take) { hv[j] = true; sc[j] = sc[k]; ds[j] = ds[k]; sl[j] = sl[k]; }
        }
    }
    return LaneBest{hv[0], sc[0], ds[0], sl[0], nfree};
}

extern "C" __global__ void __launch_bounds__(TB_THREADS)
tree_build_wl(const float* __restrict__ topk_logp, const int* __restrict__ topk_ids,
              const int* __restrict__ root_token, const int* __restrict__ start,
              int B, int L, int K, int budget, int staged,
              int* __restrict__ tokens, int* __restrict__ parents, int* __restrict__ depths,
              int* __restrict__ positions, int* __restrict__ ranks, double* __restrict__ scores,
              u8* __restrict__ visibility, int* __restrict__ num_nodes) {
    extern __shared__ __align__(16) char smem_raw[];
    __shared__ int s_num_nodes;
    const int b = blockIdx.x;
    if (b >= B) return;
    const int Q = budget + 1;
    const int Kc = K < Q ? K : Q;
    const int stride = L + 1;
    const int tid = threadIdx.x;
    TreeSmem s;
    carve(smem_raw, L, Kc, Q, staged, s);

    const float* g_lp = topk_logp + (size_t)b * L * K;
    const int* g_ids = topk_ids + (size_t)b * L * K;
    const float* lp = staged ? s.lp : g_lp;
    const int* ids = staged ? s.ids : g_ids;
    const int ld = staged ? Kc : K;
    if (staged) {
        for (int e = tid; e < L * Kc; e += TB_THREADS) {
            int d = e / Kc, r = e - d * Kc;
            s.lp[e] = g_lp[(size_t)d * K + r];
            s.ids[e] = g_ids[(size_t)d * K + r];
        }
    }
    if (tid == 0) {
        s.node_score[0] = 0.0;
        s.node_parent[0] = -1;
        s.node_depth[0] = 0;
        s.node_rank[0] = -1;
        s.node_token[0] = root_token[b];
    }
    __syncthreads();

    if (tid < 32) {
        const int lane = tid;
        double cs[TW_NPL];
        u64 cd[TW_NPL];
#pragma unroll
        for (int j = 0; j < TW_NPL; ++j) { cs[j] = 0.0; cd[j] = 0ull; }
        if (budget > 0 && lane == 0) { cs[0] = (double)lp[0]; cd[0] = pack_cand(0, 0, 1); }
        LaneBest best = lane_best(s, cs, cd);
        u64 key = best.have ? score_key(best.score) : 0ull;
        int n = 0;
        while (n < budget) {
            const int node = n + 1;
            const bool more = node < budget;
            // what my best pushes if it wins (the loads overlap the reduction)
            const int r = cand_rank(best.desc), d = cand_depth(best.desc), p = cand_parent(best.desc);
            double sib = 0.0, child = 0.0;
            int tok = 0;
            if (best.have) {
                const float* row = lp + (size_t)(d - 1) * ld;
                tok = ids[(size_t)(d - 1) * ld + r];
                if (r + 1 < K) sib = (best.score - (double)row[r]) + (double)row[r + 1];
                if (d < L) child = best.score + (double)lp[(size_t)d * ld];
            }
            const bool my_sib = best.have && more && r + 1 < K;
            const bool my_child = best.have && more && d < L;
            const u32 free_lanes = __ballot_sync(FULL_MASK, best.nfree > 0);
            const u32 ovf_lanes = __ballot_sync(FULL_MASK, my_sib && my_child && best.nfree == 0);

            // the warp's best: high word of the key, then low word and rank tuple on exact ties
            const u32 hi = (u32)(key >> 32);
            const u32 max_hi = __reduce_max_sync(FULL_MASK, hi);
            u32 tied = __ballot_sync(FULL_MASK, best.have && hi == max_hi);
            if (tied == 0u) break;                       // no candidate left
            if (tied & (tied - 1u)) {
                const u32 lo = (best.have && hi == max_hi) ? (u32)key : 0u;
                const u32 max_lo = __reduce_max_sync(FULL_MASK, lo);
                tied = __ballot_sync(FULL_MASK, best.have && hi == max_hi && (u32)key == max_lo);
            }
            int wl = __ffs(tied) - 1;
            if (tied & (tied - 1u)) {                    // exact score tie across lanes
                u64 wd = __shfl_sync(FULL_MASK, best.desc, wl);
                u32 rest = tied & (tied - 1u);
                while (rest) {
                    const int other = __ffs(rest) - 1;
                    rest &= rest - 1u;
                    const u64 od = __shfl_sync(FULL_MASK, best.desc, other);
                    if (cand_less_walk(s, od, wd)) { wl = other; wd = od; }
                }
            }

            // pop the winner as node `node`; only the winner (and on overflow one helper) changes
            const bool win = lane == wl;
            if (win) {
                s.node_score[node] = best.score;
                s.node_parent[node] = p;
                s.node_depth[node] = d;
                s.node_rank[node] = r;
                s.node_token[node] = tok;
                const double ns = my_sib ? sib : child;
                const u64 nd = my_sib ? pack_cand(p, r + 1, d) : (my_child ? pack_cand(node, 0, d + 1) : 0ull);
                bool place_child = my_sib && my_child && best.nfree > 0;
#pragma unroll
                for (int j = 0; j < TW_NPL; ++j) {       // selects, not indexed stores
                    const bool at_best = j == best.slot;
                    const bool at_free = !at_best && place_child && cd[j] == 0ull;
                    cs[j] = at_best ? ns : (at_free ? child : cs[j]);
                    cd[j] = at_best ? nd : (at_free ? pack_cand(node, 0, d + 1) : cd[j]);
                    place_child = place_child && !at_free;
                }
            }
            int helper = -1;
            if ((ovf_lanes >> wl) & 1u) {                // the winner is full: hand its child over
                helper = __ffs(free_lanes) - 1;
                const double c_score = __shfl_sync(FULL_MASK, child, wl);
                const int c_depth = __shfl_sync(FULL_MASK, d, wl) + 1;
                if (lane == helper) {
                    bool place = true;
#pragma unroll
                    for (int j = 0; j < TW_NPL; ++j) {
                        const bool at = place && cd[j] == 0ull;
                        cs[j] = at ? c_score : cs[j];
                        cd[j] = at ? pack_cand(node, 0, c_depth) : cd[j];
                        place = place && !at;
                    }
                }
            }
            n = node;
            __syncwarp();                                // node arrays visible to every lane
            if (win || lane == helper) {
                best = lane_best(s, cs, cd);
                key = best.have ? score_key(best.score) : 0ull;
            }
        }
        if (lane == 0) s_num_nodes = n;
    }
    __syncthreads();
    const int nn = s_num_nodes;
    for (int i = tid; i <= nn; i += TB_THREADS) {       // ancestry paths, one thread per node
        int x = i;
        for (int t = s.node_depth[i]; t >= 0; --t) {
            s.path[(size_t)i * stride + t] = (u16)x;
            x = s.node_parent[x];
        }
    }
    __syncthreads();
    write_outputs(s, b, Q, stride, nn, start[b], tokens, parents, depths, positions, ranks, scores,
                  visibility, num_nodes);
}
