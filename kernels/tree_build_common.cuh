// Shared pieces of the tree_build kernels (tree_build_warp.cu, tree_build_smem.cu, tree_build_sorted.cu):
// candidate keys and descriptors, the shared-memory carve-up and staging, rank-tuple comparisons and
// the output writer. The numerical contract is in tree_build_warp.cu's header.
#pragma once

#define TB_THREADS 256
#define FULL_MASK 0xffffffffu

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// Order-preserving map of a double to u64 (larger double -> larger key); -0.0 is folded into +0.0
// first so that the two compare equal, as they do in the reference's heap.
__device__ __forceinline__ u64 score_key(double s) {
    u64 bits = (u64)__double_as_longlong(s + 0.0);
    return (bits >> 63) ? ~bits : (bits | 0x8000000000000000ull);
}

// A candidate: parent node (u16), rank (bits 16..47), depth (bits 48..63).
__device__ __forceinline__ u64 pack_cand(int parent, int rank, int depth) {
    return (u64)(u32)parent | ((u64)(u32)rank << 16) | ((u64)(u32)depth << 48);
}
__device__ __forceinline__ int cand_parent(u64 c) { return (int)(c & 0xffffu); }
__device__ __forceinline__ int cand_rank(u64 c) { return (int)((c >> 16) & 0xffffffffu); }
__device__ __forceinline__ int cand_depth(u64 c) { return (int)(c >> 48); }

struct TreeSmem {
    double* cand_score;   // [cap]
    u64* cand;            // [cap]
    double* node_score;   // [Q]
    int* node_parent;     // [Q]
    int* node_depth;      // [Q]
    int* node_rank;       // [Q]
    int* node_token;      // [Q]
    u16* path;            // [Q][L+1]: node index of the ancestor at each depth, self at own depth
    float* lp;            // [L][Kc] when staged
    int* ids;             // [L][Kc] when staged
    __device__ int parent_of(int i) const { return node_parent[i]; }
    __device__ int rank_of(int i) const { return node_rank[i]; }
};

__device__ __forceinline__ size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Carves the dynamic shared memory; returns the bytes used (the host mirrors this sum).
__device__ size_t carve(char* base, int L, int Kc, int Q, int staged, TreeSmem& s) {
    size_t off = 0;
    int cap = Q;  // >= budget
    s.cand_score = (double*)(base + off); off += (size_t)cap * 8;
    s.cand = (u64*)(base + off); off += (size_t)cap * 8;
    s.node_score = (double*)(base + off); off += (size_t)Q * 8;
    s.node_parent = (int*)(base + off); off += (size_t)Q * 4;
    s.node_depth = (int*)(base + off); off += (size_t)Q * 4;
    s.node_rank = (int*)(base + off); off += (size_t)Q * 4;
    s.node_token = (int*)(base + off); off += (size_t)Q * 4;
    s.path = (u16*)(base + off); off += align_up((size_t)Q * (L + 1) * 2, 16);
    if (staged) {
        s.lp = (float*)(base + off); off += align_up((size_t)L * Kc * 4, 16);
        s.ids = (int*)(base + off); off += align_up((size_t)L * Kc * 4, 16);
    } else {
        s.lp = 0; s.ids = 0;
    }
    return off;
}

// Is candidate a's rank tuple lexicographically smaller than candidate b's (shorter prefix first)?
// The tuple of a candidate (parent p, rank r, depth d) is the ranks of p's ancestors at depths
// 1..d-1 followed by r.
__device__ bool cand_lex_less(const TreeSmem& s, int stride, u64 a, u64 b) {
    int pa = cand_parent(a), pb = cand_parent(b);
    int da = cand_depth(a), db = cand_depth(b);
    int dmin = da < db ? da : db;
    for (int t = 1; t <= dmin; ++t) {
        int ea = (t == da) ? cand_rank(a) : s.node_rank[s.path[pa * stride + t]];
        int eb = (t == db) ? cand_rank(b) : s.node_rank[s.path[pb * stride + t]];
        if (ea != eb) return ea < eb;
    }
    return da < db;
}

// Rank-tuple order of two live candidates through parent links (no paths needed): bring both to
// the same depth, climb until they are siblings, compare ranks. A live candidate is never a prefix
// of another (a node's children are pushed only once it is popped), so the first difference
// decides; the depth test is kept for completeness. `Nodes` gives parent_of(i) and rank_of(i) of
// the popped nodes i >= 1 (TreeSmem; the sorted kernel's packed records).
struct Walk { int node, parent, rank, depth; };
template <class Nodes>
__device__ __forceinline__ void walk_up(const Nodes& s, Walk& w) {
    w.node = w.parent;
    w.parent = s.parent_of(w.node);
    w.rank = s.rank_of(w.node);
    w.depth -= 1;
}
template <class Nodes>
__device__ bool cand_less_walk(const Nodes& s, u64 a, u64 b) {
    Walk x{-1, cand_parent(a), cand_rank(a), cand_depth(a)};
    Walk y{-1, cand_parent(b), cand_rank(b), cand_depth(b)};
    while (x.depth > y.depth) walk_up(s, x);
    while (y.depth > x.depth) walk_up(s, y);
    if (x.node >= 0 && x.node == y.node) return cand_depth(a) < cand_depth(b);
    while (x.parent != y.parent) { walk_up(s, x); walk_up(s, y); }
    if (x.rank != y.rank) return x.rank < y.rank;
    return cand_depth(a) < cand_depth(b);
}

// Ancestry paths of nodes 0..nn (all threads, one per node): path[i][t] = i's ancestor at depth t.
// The caller puts a __syncthreads() between this and the readers.
__device__ void build_paths(const TreeSmem& s, int nn, int stride) {
    for (int i = threadIdx.x; i <= nn; i += TB_THREADS) {
        int x = i;
        for (int t = s.node_depth[i]; t >= 0; --t) {
            s.path[(size_t)i * stride + t] = (u16)x;
            x = s.node_parent[x];
        }
    }
}

// Every output element of request b from the finished node arrays and paths (all threads).
__device__ void write_outputs(const TreeSmem& s, int b, int Q, int stride, int nn, int st,
                              int* __restrict__ tokens, int* __restrict__ parents, int* __restrict__ depths,
                              int* __restrict__ positions, int* __restrict__ ranks, double* __restrict__ scores,
                              u8* __restrict__ visibility, int* __restrict__ num_nodes) {
    const int tid = threadIdx.x;
    const size_t row0 = (size_t)b * Q;
    for (int i = tid; i < Q; i += TB_THREADS) {
        const bool live = i <= nn;
        tokens[row0 + i] = live ? s.node_token[i] : -1;
        parents[row0 + i] = live ? s.node_parent[i] : -1;
        depths[row0 + i] = live ? s.node_depth[i] : -1;
        positions[row0 + i] = live ? st + s.node_depth[i] : -1;
        ranks[row0 + i] = live ? s.node_rank[i] : -1;
        scores[row0 + i] = live ? s.node_score[i] : -__longlong_as_double(0x7ff0000000000000ll);
    }
    if (tid == 0) num_nodes[b] = nn;
    u8* vis = visibility + (size_t)b * Q * Q;
    const int live_q = nn + 1;
    for (int i = tid / 32; i < Q; i += TB_THREADS / 32) {       // one warp per row
        const int di = i < live_q ? s.node_depth[i] : -1;
        const u16* pi = s.path + (size_t)i * stride;
        for (int j = tid % 32; j < Q; j += 32) {
            u8 v = 0;
            if (i < live_q && j < live_q) {
                const int dj = s.node_depth[j];
                v = (dj <= di && pi[dj] == j) ? 1 : 0;
            }
            vis[(size_t)i * Q + j] = v;
        }
    }
}

// Stages request b's top-K table into shared memory when `staged` (s.lp, s.ids: [L][Kc]) and
// writes the root's node record (and its path entry when the kernel keeps paths during the loop).
template <bool ROOT_PATH>
__device__ __forceinline__ void stage_request(const TreeSmem& s, const float* __restrict__ g_lp,
                                              const int* __restrict__ g_ids, const int* __restrict__ root_token,
                                              int b, int L, int K, int Kc, int staged) {
    const int tid = threadIdx.x;
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
        if (ROOT_PATH) s.path[0] = 0;
    }
}

// The parameters of the kernels that keep candidates in a TreeSmem (warp, smem), in the host's order.
#define TREE_BUILD_STAGED_PARAMS                                                                        \
    const float* __restrict__ topk_logp, const int* __restrict__ topk_ids,                             \
    const int* __restrict__ root_token, const int* __restrict__ start, int B, int L, int K, int budget, \
    int staged, int* __restrict__ tokens, int* __restrict__ parents, int* __restrict__ depths,         \
    int* __restrict__ positions, int* __restrict__ ranks, double* __restrict__ scores,                 \
    u8* __restrict__ visibility, int* __restrict__ num_nodes

// Their block's request (b = blockIdx.x; a block past B returns): its sizes, its TreeSmem carved from
// smem_raw, and where its top-K table is read from (shared memory when staged, else global, row
// stride ld). A macro: spelled out in place it compiles to the SASS the kernels were verified with.
#define TREE_BUILD_STAGED_REQUEST()                                                                    \
    const int b = blockIdx.x;                                                                           \
    if (b >= B) return;                                                                                 \
    const int Q = budget + 1;                                                                           \
    const int Kc = K < Q ? K : Q;                                                                       \
    const int stride = L + 1;                                                                           \
    const int tid = threadIdx.x;                                                                        \
    TreeSmem s;                                                                                         \
    carve(smem_raw, L, Kc, Q, staged, s);                                                               \
    const float* g_lp = topk_logp + (size_t)b * L * K;                                                  \
    const int* g_ids = topk_ids + (size_t)b * L * K;                                                    \
    const float* lp = staged ? s.lp : g_lp;                                                             \
    const int* ids = staged ? s.ids : g_ids;                                                            \
    const int ld = staged ? Kc : K;
