// tree_accept: the greedy walk down a draft tree with the target's predictions (docs/ops/tree_accept.md).
//
// Launch: grid = ceil(B / WPB), block = (32, WPB): one warp per request, WPB warps per block;
//   dynamic shared memory = WPB * Q * 4 * TA_SMEM_WORDS bytes per warp: tokens and the accepted
//   path (+ parents and targets when TA_CHUNKS == 0).
//   Entry: tree_accept_walk(tokens i32 [B,Q], parents i32 [B,Q], target_ids i32 [B,Q], B, Q,
//                      accept_len i32 [B], accept_nodes i32 [B,Q], accept_tokens i32 [B,Q],
//                      bonus i32 [B])
//   Compile-time TA_CHUNKS (the host picks ceil(Q / 32) up to 8): node c
//   lives in lane c % 32, register c / 32, so a step of the walk is TA_CHUNKS ballots on registers
//   and one shuffle, no memory access on the walk's dependent chain. TA_CHUNKS = 0 (Q > 256): the
//   tree in shared memory, two loads and a ballot per 32 nodes per step.
//
// Contract (bit-exact with kdtr/ops/tree_accept/reference.py): cur = 0, nxt = target_ids[0]; while a node
// c >= 1 has parents[c] == cur and tokens[c] == nxt, accept it (cur = c, nxt = target_ids[c]).
// Sibling tokens are distinct in a valid tree (the op refuses others); were they not, this kernel
// takes the highest-numbered such child, as the reference's dict does. Padding (-1 parents) never
// matches. Outputs: accept_len = accepted nodes incl. the root; accept_nodes / accept_tokens padded
// with -1; bonus = nxt at the stop. Every element is written.
//
// parents[c] < c (the op checks it) makes cur strictly increase, so a walk takes at most Q - 1
// steps; the loop bound also keeps a malformed tree from looping forever.

#define FULL_MASK 0xffffffffu
#ifndef TA_CHUNKS
#define TA_CHUNKS 1
#endif
#define TA_SMEM_WORDS (TA_CHUNKS > 0 ? 2 : 4)   // ints per node in shared memory: tokens, path (+ parents, targets)

// The tree of one request as the walk sees it. TA_CHUNKS > 0: node c in lane c % 32, register
// c / 32 (Q <= 32 * TA_CHUNKS). TA_CHUNKS == 0: in shared memory, for trees too big for registers.
struct Tree {
#if TA_CHUNKS > 0
    int par[TA_CHUNKS], tok[TA_CHUNKS], tgt[TA_CHUNKS];
#else
    const int *par, *tok, *tgt;
#endif
    int Q, lane;

    // The highest node c >= 1 with parents[c] == cur and tokens[c] == nxt, or -1.
    __device__ __forceinline__ int child(int cur, int nxt) const {
        int found = -1;
#if TA_CHUNKS > 0
#pragma unroll
        for (int j = 0; j < TA_CHUNKS; ++j) {
            const unsigned m = __ballot_sync(FULL_MASK, par[j] == cur && tok[j] == nxt);
            if (m) found = 32 * j + 31 - __clz(m);
        }
#else
        for (int base = 0; base < Q; base += 32) {
            const int c = base + lane;
            const unsigned m = __ballot_sync(FULL_MASK, c < Q && par[c] == cur && tok[c] == nxt);
            if (m) found = base + 31 - __clz(m);
        }
#endif
        return found;
    }

    // target_ids[node], in every lane.
    __device__ __forceinline__ int target(int node) const {
#if TA_CHUNKS > 0
        int own = tgt[0];
#pragma unroll
        for (int j = 1; j < TA_CHUNKS; ++j) own = (node >> 5) == j ? tgt[j] : own;
        return __shfl_sync(FULL_MASK, own, node & 31);
#else
        return tgt[node];
#endif
    }
};

extern "C" __global__ void
tree_accept_walk(const int* __restrict__ tokens, const int* __restrict__ parents,
                 const int* __restrict__ target_ids, int B, int Q,
                 int* __restrict__ accept_len, int* __restrict__ accept_nodes,
                 int* __restrict__ accept_tokens, int* __restrict__ bonus) {
    extern __shared__ __align__(16) int smem_i[];
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;
    const int b = blockIdx.x * blockDim.y + warp;
    if (b >= B) return;                            // whole warps leave together
    int* s_tok = smem_i + (size_t)warp * Q * TA_SMEM_WORDS;
    int* s_path = s_tok + Q;
    const size_t row = (size_t)b * Q;

    Tree tree;
    tree.Q = Q;
    tree.lane = lane;
#if TA_CHUNKS > 0
#pragma unroll
    for (int j = 0; j < TA_CHUNKS; ++j) {
        const int c = lane + 32 * j;
        const bool in = c < Q;
        tree.par[j] = in && c >= 1 ? __ldg(parents + row + c) : -1;   // root and padding never match
        tree.tok[j] = in ? __ldg(tokens + row + c) : 0;
        tree.tgt[j] = in ? __ldg(target_ids + row + c) : 0;
        if (in) s_tok[c] = tree.tok[j];
    }
#else
    int* s_par = s_path + Q;
    int* s_tgt = s_par + Q;
    for (int i = lane; i < Q; i += 32) {
        s_tok[i] = tokens[row + i];
        s_par[i] = i >= 1 ? parents[row + i] : -1;
        s_tgt[i] = target_ids[row + i];
    }
    tree.par = s_par;
    tree.tok = s_tok;
    tree.tgt = s_tgt;
#endif
    __syncwarp();

    int cur = 0, len = 1;
    int nxt = tree.target(0);
    if (lane == 0) s_path[0] = 0;
    for (int step = 1; step < Q; ++step) {
        const int found = tree.child(cur, nxt);
        if (found < 0) break;
        cur = found;
        nxt = tree.target(cur);
        if (lane == 0) s_path[len] = cur;
        ++len;
    }
    __syncwarp();
    for (int i = lane; i < Q; i += 32) {
        const int node = i < len ? s_path[i] : -1;
        accept_nodes[row + i] = node;
        accept_tokens[row + i] = i < len ? s_tok[node] : -1;
    }
    if (lane == 0) {
        accept_len[b] = len;
        bonus[b] = nxt;
    }
}
