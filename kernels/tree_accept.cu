// tree_accept: the greedy walk down a draft tree with the target's predictions (ops.md §3).
//
// Launch: grid = ceil(B / WPB), block = (32, WPB): one warp per request, WPB warps per block;
//   dynamic shared memory = WPB * Q * 16 bytes (tokens, parents, target_ids, path per warp).
//   Entry: tree_accept(tokens i32 [B,Q], parents i32 [B,Q], target_ids i32 [B,Q], B, Q,
//                      accept_len i32 [B], accept_nodes i32 [B,Q], accept_tokens i32 [B,Q],
//                      bonus i32 [B])
//
// Contract (bit-exact with kdtr/ops/tree_accept.py): cur = 0, nxt = target_ids[0]; while a node
// c >= 1 has parents[c] == cur and tokens[c] == nxt, accept it (cur = c, nxt = target_ids[c]).
// Sibling tokens are distinct in a valid tree; if they were not, the reference's dict keeps the
// highest-numbered such child, and so does this kernel. Padding (-1 parents) never matches.
// Outputs: accept_len = accepted nodes incl. the root; accept_nodes / accept_tokens padded with -1;
// bonus = nxt at the stop. Every element is written.
//
// Each step, the warp tests 32 nodes per instruction and takes the highest match via a ballot.
// parents[c] < c (the op checks it) makes cur strictly increase, so a walk takes at most Q - 1
// steps; the loop bound also keeps a malformed tree from looping forever.

#define FULL_MASK 0xffffffffu

extern "C" __global__ void
tree_accept(const int* __restrict__ tokens, const int* __restrict__ parents,
            const int* __restrict__ target_ids, int B, int Q,
            int* __restrict__ accept_len, int* __restrict__ accept_nodes,
            int* __restrict__ accept_tokens, int* __restrict__ bonus) {
    extern __shared__ __align__(16) int smem_i[];
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;
    const int b = blockIdx.x * blockDim.y + warp;
    if (b >= B) return;                            // whole warps leave together
    int* s_tok = smem_i + (size_t)warp * Q * 4;
    int* s_par = s_tok + Q;
    int* s_tgt = s_par + Q;
    int* s_path = s_tgt + Q;
    const size_t row = (size_t)b * Q;
    for (int i = lane; i < Q; i += 32) {
        s_tok[i] = tokens[row + i];
        s_par[i] = parents[row + i];
        s_tgt[i] = target_ids[row + i];
    }
    __syncwarp();

    int cur = 0, len = 1;
    int nxt = s_tgt[0];
    if (lane == 0) s_path[0] = 0;
    for (int step = 1; step < Q; ++step) {
        int found = -1;
        for (int base = 0; base < Q; base += 32) {
            const int c = base + lane;
            const bool match = c >= 1 && c < Q && s_par[c] == cur && s_tok[c] == nxt;
            const unsigned m = __ballot_sync(FULL_MASK, match);
            if (m) found = base + 31 - __clz(m);   // highest matching node so far
        }
        if (found < 0) break;
        cur = found;
        nxt = s_tgt[cur];
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
