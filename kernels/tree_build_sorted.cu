// tree_build, kernel `sorted`: best-first DDTree draft tree, candidates kept sorted in one warp (docs/ops/tree_build.md).
//
// Launch: grid = B (one block per request), block = TB_THREADS (256; warp 0 pops, warps 1..7
//   stage the token ids meanwhile), dynamic shared memory =
//   the host's sorted_shared_bytes (tree_build.py), laid out as
//   * T, the log-probs as doubles, (L + 2) x W with W = Kc + 1, Kc = min(K, Q): T[d-1][r] =
//     (double)lp[d-1][r] for r < Kc, T[d-1][Kc] = -inf (the sibling of the last usable rank), rows
//     L and L + 1 all -inf (row L: the child of a depth-L node; row L + 1: that child's child row,
//     which a pop loads when the child is the next head of an empty list); first, so that its
//     address is a constant;
//   * the token ids [L][Kc] (i32), staged by warps 1..7 while warp 0 pops;
//   * the node records rec[Q] (16 B: score, packed candidate; rec[0] unused);
//   * the ancestor-or-self masks [Q][nw] (u32, nw = ceil(Q / 32) <= TB_NPL + 1), built by the epilogue.
//   Each part starts 16-byte aligned. Entry: tree_build_sorted, the arguments of tree_build_warp
//   (tree_build_warp.cu) less `staged`. TB_NPL (compile-time, 1..16): slots per lane, capacity
//   C = 32 * TB_NPL >= budget. Log-prob offsets are packed into 16 bits and parents into 10:
//   (L + 1) * W < 65536 and budget < 1024 (L <= 64 and budget <= 512 keep both).
//
// Numerical contract (bit-exact with the numpy reference, kdtr/ops/tree_build/reference.py): that
// of tree_build_warp.cu. Scores are doubles in the reference's operation order: first node T[0][0]; child
// of (s, d): s + T[d][0]; next sibling of (s, d, r): (s - T[d-1][r]) + T[d-1][r+1], the padding
// giving -inf where the reference pushes nothing. Order: higher score first (DSETP, so
// -0.0 == +0.0); exact ties between live candidates go to the smaller rank tuple
// (cand_less_walk). -inf marks an empty slot and is never popped (no NaN can occur while the heap
// is not empty: finite inputs, and -inf is only ever added to a finite score; the dead pops after
// it emptied may compute -inf - -inf, but they record nothing and `alive` stays false for good).
//
// Design: warp 0 keeps the candidates SORTED in registers, blocked: lane l holds slots
// l*TB_NPL .. l*TB_NPL + TB_NPL - 1 (score double + packed u32 each; empty = -inf). After n pops
// only slots < budget - n can still be popped (each pop takes slot 0, inserts only move slots
// down), so a fixed capacity C >= budget is exact and anything pushed past C is dropped. Every
// lane also holds the head H (slot 0) and the runner-up S (slot 1), so the pop's successors
// (sibling a, child b) are computed redundantly in all lanes, with no shuffle on that chain. One
// pop merges {a, b} into slots 1..C-1 of the list (sl_merge: five-way select per slot on the flags
// "beats first / beats second"; a lane needs the list one slot either side of its block, one
// shfl_up and one shfl_down of 3 words). Successors are NOT assumed to score below their parent:
// a child may land in slot 0.
//   * The pop (sl_pop): every lane holds the head's three log-probs (own, next rank, child row).
//     At the end of a pop the next head (runner-up or first) is chosen and its three log-probs are
//     loaded from its own candidate, one LDS latency on the head's chain; the next pop's window
//     (shfl_up / shfl_down) and the runner-up's broadcast are issued then too and complete under
//     the next pop's additions. Liveness tests are integer tests of the high word (sl_live), not
//     DSETPs; the node record is one 16-byte store by lane 0.
//   * CHECKPOINTS (sl_build): chunks of TB_CK pops (default 8). Before a chunk the loop state
//     (SlState) is copied in registers; the chunk runs the FAST pop (sl_pop<false>: plain compares;
//     its tie test, an exact == between a live successor and a slot the lane owns, the popped slot
//     0 left out, keeps the lane's first flagged pop: no vote, no barrier, no branch); then one
//     __any_sync. On a tie the checkpoint is restored, the pops before the warp's first flagged one
//     rerun fast, that one runs with the EXACT pop (sl_pop<true>: the merge redone with the
//     rank-tuple walks, on a warp-uniform branch after a __syncwarp), and the next chunk starts
//     after it. Claim (asserted on every chunk of every CPU model case,
//     tests/kernels/test_tree_build_sorted_sim.py): up to a chunk's first tie its fast pops are the exact
//     ones, since every compare the merge and the runner-up test make is between a successor and
//     some lane's own slot. The rerun's records overwrite the abandoned ones; a record it does not
//     rewrite lies past the final n, or is rewritten by the next chunk, before anything reads it.
//   * A warp-uniform loop: `budget` trips (a kernel argument) and the warp test made a shuffle
//     result, so the compiler needs no divergence guards (BRA.DIV) around the shuffles and the
//     unrolled body (TB_UNROLL pops, default 2) is one basic block. A sticky `alive` ends the pops
//     at the first -inf head (the heap is then empty): a dead pop (also the padding of the last
//     chunk, node > budget) writes no record, counts no node and walks the valid dummy candidate 0,
//     so its table reads stay in the L + 2 rows.
//   * Staging: all warps convert the log-probs into T ((d, r) = divmod(e, W) stepped per element,
//     the loads of a round all in flight), one __syncthreads; warps 1..7 then stage the token ids
//     while warp 0 pops. root_token[b] and start[b] are loaded first, off the epilogue's chain.
//   * EPILOGUE, straight from the records (no TreeSmem, paths or build_paths): one thread per
//     column i < Q walks i's parent links (<= depth dependent loads) to build its ancestor-or-self
//     mask in registers (nw <= TB_NPL + 1 words, selects, no local memory) and stores it to shared
//     memory; one __syncthreads; then every global store, none behind a barrier: the per-node
//     outputs (record, one dependent ids load), the request's Q * Q visibility bytes as aligned
//     32-bit words (each from 4 mask-bit loads; (i, j) advanced per trip, no division in the loop),
//     and the unaligned head and the tail (< 4 bytes each) as byte stores, so that no store touches
//     a neighbouring request's bytes (the numpy model of this index math:
//     test_epilogue_visibility_every_byte_once). num_nodes is stored by lane 0 as the loop ends.
// Knobs (compile-time): TB_CK pops per checkpoint (a multiple of TB_UNROLL); TB_FORCE_EXACT=1
// runs the exact pop only, no checkpoints (the GPU tests run it on every shape:
// KDTREE_TEST_DEFINES="sorted:TB_FORCE_EXACT=1"); TB_PROFILE=1 is a timing diagnostic with
// WRONG outputs: thread 0 of each block writes into scores[b][0..9] (as doubles, as many as Q
// holds) clock64 cycles of 0 the staging (to the first __syncthreads), 1 the pop loop less the
// redos, 2 the redos (restore, the fast rerun, one exact pop each), 3 the epilogue (from the loop's
// end, lane 0), 4 the whole block; 5 %globaltimer ns of the whole block; 6 the pops (n); 7 the
// checkpoints restored; 8 ns from after the staging to the end of the loop; 9 the pops rerun.
// Race freedom (compute-sanitizer racecheck): lane 0 alone writes the node records; the fast pop
// has no reader; the exact pop's only readers (the tie walks) run after a __syncwarp() on its
// warp-uniform tie branch, and read only records of nodes before the current one, which the
// redo or an earlier (exact) chunk wrote; a redo starts after the __any_sync and a __syncwarp; the
// epilogue reads the records after __syncthreads(), and the masks after a second.
// kernels/NOTES.md has the per-pop instruction count, the measured and the predicted times.
// tests/kernels/test_tree_build_sorted_sim.py models this loop lane by lane on the CPU.

#include "tree_build_common.cuh"

#ifndef TB_NPL
#define TB_NPL 2
#endif
#ifndef TB_UNROLL
#define TB_UNROLL 2     // pops per unrolled loop body
#endif
#ifndef TB_FORCE_EXACT
#define TB_FORCE_EXACT 0
#endif
#ifndef TB_PROFILE
#define TB_PROFILE 0
#endif
#ifndef TB_CK
#define TB_CK 8         // pops per checkpoint (a multiple of TB_UNROLL)
#endif
#define TB_NO_TIE 0x7fffffff
#define TB_STAGE 8      // elements per thread per staging round: their loads are all in flight at once

// A sorted-list candidate: off = (d - 1) * W + r (bits 0..15), parent node (bits 16..25), d - 1
// (bits 26..31). The next sibling is c + 1 (r + 1 < W, so no carry out of `off`). The child of a
// depth-64 node wraps d - 1 to 0, harmlessly: its score is -inf (row L of T) and -inf entries are
// never popped nor walked.
__device__ __forceinline__ u32 sl_pack(int off, int parent, int dm1) {
    return (u32)off | ((u32)parent << 16) | ((u32)dm1 << 26);
}
__device__ __forceinline__ int sl_off(u32 c) { return (int)(c & 0xffffu); }
__device__ __forceinline__ int sl_parent(u32 c) { return (int)((c >> 16) & 0x3ffu); }
__device__ __forceinline__ int sl_dm1(u32 c) { return (int)(c >> 26); }
// s > -inf, as an integer test on the high word (-inf is the only non-NaN double whose high word
// is 0xfff00000; a NaN, possible only in the dead pops after the heap emptied, tests live)
__device__ __forceinline__ bool sl_live(double s) { return __double2hiint(s) != (int)0xfff00000; }

// The popped nodes as the sorted loop writes them: one 16-byte record per node (score, packed
// candidate; one store per pop). The tie walks read parents and ranks from them; the epilogue
// writes the outputs straight from them.
struct SortedNodes {
    const uint4* rec;
    int W;
    __device__ int parent_of(int i) const { return sl_parent(rec[i].z); }
    __device__ int rank_of(int i) const { const u32 c = rec[i].z; return sl_off(c) - sl_dm1(c) * W; }
};

// Rank-tuple order of two live candidates (the tie rule).
__device__ __forceinline__ bool sl_tuple_less(const SortedNodes& nodes, u32 a, u32 b) {
    const int da = sl_dm1(a), db = sl_dm1(b), W = nodes.W;
    return cand_less_walk(nodes, pack_cand(sl_parent(a), sl_off(a) - da * W, da + 1),
                          pack_cand(sl_parent(b), sl_off(b) - db * W, db + 1));
}

// One pop's merge of {first, second} (first beats second) into the list: fA[k] / fB[k] = "E[k]
// beats first / second" (exact compares, or `won`'s bits where the scores are equal; slot 0, the
// popped head, counts as beating both), and slot s = E[j + 1] takes
//   fA[s+1] ? old[s+1] : fA[s] ? first : fB[s] ? old[s] : fB[s-1] ? second : old[s-1]
// (both flags are true on a prefix of the list).
__device__ __forceinline__ void sl_merge(double (&cs)[TB_NPL], u32 (&cd)[TB_NPL],
                                         const double (&es)[TB_NPL + 2], const u32 (&ed)[TB_NPL + 2],
                                         double fs, u32 fd, double s2, u32 d2, u32 won,
                                         bool g0_k0, bool g0_k1) {
    bool fa[TB_NPL + 2], fb[TB_NPL + 2];
#pragma unroll
    for (int k = 0; k < TB_NPL + 2; ++k) {
        fa[k] = es[k] > fs || ((won >> k) & 1u);
        fb[k] = es[k] > s2 || ((won >> (TB_NPL + 2 + k)) & 1u);
    }
    fa[1] = fa[1] || g0_k1;
    fb[1] = fb[1] || g0_k1;
    fb[0] = fb[0] || g0_k0;
#pragma unroll
    for (int j = 0; j < TB_NPL; ++j) {
        double v = fb[j] ? s2 : es[j];
        u32 c = fb[j] ? d2 : ed[j];
        v = fb[j + 1] ? es[j + 1] : v;
        c = fb[j + 1] ? ed[j + 1] : c;
        v = fa[j + 1] ? fs : v;
        c = fa[j + 1] ? fd : c;
        cs[j] = fa[j + 2] ? es[j + 2] : v;
        cd[j] = fa[j + 2] ? ed[j + 2] : c;
    }
}

// The window of a lane: the list one slot either side of its block (shfl_up / own / shfl_down; a
// lane whose source is out of range reads its own value, as SHFL does).
__device__ __forceinline__ void sl_window(const double (&cs)[TB_NPL], const u32 (&cd)[TB_NPL],
                                          double (&es)[TB_NPL + 2], u32 (&ed)[TB_NPL + 2]) {
    es[0] = __shfl_up_sync(FULL_MASK, cs[TB_NPL - 1], 1);
    ed[0] = __shfl_up_sync(FULL_MASK, cd[TB_NPL - 1], 1);
#pragma unroll
    for (int j = 0; j < TB_NPL; ++j) { es[j + 1] = cs[j]; ed[j + 1] = cd[j]; }
    es[TB_NPL + 1] = __shfl_down_sync(FULL_MASK, cs[0], 1);
    ed[TB_NPL + 1] = __shfl_down_sync(FULL_MASK, cd[0], 1);
}

// The loop state of warp 0 between two pops (what a checkpoint saves): the lane's list slots, the
// head with its three log-probs and the runner-up with its three (the same in every lane), the
// sticky `alive` and the node count. The window (es, ed) is not saved: it is a function of the
// slots (sl_window), recomputed on a restore.
struct SlState {
    double cs[TB_NPL];
    u32 cd[TB_NPL];
    double hs, l0, l1, lc;                                // head (slot 0) and its log-probs
    double ss;                                            // runner-up (slot 1)
    u32 hd, sd;
    bool alive;
    int n;
};

// One pop, node number `node` (warp-uniform). Writes rec[node] (lane 0) when alive; a pop past
// `budget` or after the heap emptied is dead. EXACT = false (fast): the merge with plain compares
// only; its tie test (an exact == between a live successor and a slot the lane owns, the popped
// slot 0 left out) keeps the first pop this lane flagged in `tie_node` (a min, off the chain: no
// vote, no barrier, no branch). EXACT = true: after the plain merge, one __any_sync of the tie test
// (window and runner-up), and on a tie anywhere in the warp the merge is redone with the rank-tuple
// walks after a __syncwarp (lane 0's records before the walks; warp-uniform branch).
template <bool EXACT>
__device__ __forceinline__ void sl_pop(SlState& st, double (&es)[TB_NPL + 2], u32 (&ed)[TB_NPL + 2],
                                       int node, int budget, const double* __restrict__ T, int W,
                                       uint4* rec, const SortedNodes& nodes, bool g0_k0, bool g0_k1,
                                       int lane, int& tie_node) {
    st.alive = st.alive && sl_live(st.hs) && node <= budget;
    const bool alive = st.alive;
    const u32 hq = alive ? st.hd : 0u;                    // a dead pop walks candidate 0
    const int off = sl_off(hq), dm1 = sl_dm1(hq);
    const int rowc = (dm1 + 1) * W;
    // the node record (score, candidate): lane 0 alone writes it, one 16-byte store
    if (lane == 0 && alive)
        rec[node] = make_uint4((u32)__double2loint(st.hs), (u32)__double2hiint(st.hs), st.hd, 0u);
    st.n = alive ? node : st.n;

    // successors (a sibling or child past the table's edge reads -inf: nothing pushed)
    const double sib = (st.hs - st.l0) + st.l1;
    const double chi = st.hs + st.lc;
    const u32 sibd = hq + 1u;
    const u32 chid = sl_pack(rowc, node, dm1 + 1);
    const bool cfirst = chi >= sib;                       // exact tie: the child's tuple is smaller
    const double fs = cfirst ? chi : sib, s2 = cfirst ? sib : chi;
    const u32 fd = cfirst ? chid : sibd, d2 = cfirst ? sibd : chid;
    const bool flive = sl_live(fs), live2 = sl_live(s2);

    bool s_wins = st.ss > fs;                             // the runner-up beats first: next head
    sl_merge(st.cs, st.cd, es, ed, fs, fd, s2, d2, 0u, g0_k0, g0_k1);
    if (!EXACT) {
        // exact ties (== on doubles, so -0.0 == +0.0) of a live successor with a slot the lane
        // owns, slot 0 (popped; its flags are forced) left out. Every slot is some lane's own,
        // and the runner-up is slot 1, so the warp's OR covers every compare the merge and
        // s_wins make (the neighbours in E[0] / E[TB_NPL + 1] are owned by the lanes either side).
        bool eqa = false, eqb = false;
#pragma unroll
        for (int k = 1; k <= TB_NPL; ++k) {
            const bool own = k != 1 || !g0_k1;
            eqa = eqa || (own && es[k] == fs);
            eqb = eqb || (own && es[k] == s2);
        }
        const bool tie = alive && ((flive && eqa) || (live2 && eqb));
        tie_node = min(tie_node, tie ? node : TB_NO_TIE);   // the first flagged pop (nodes increase)
    } else {
        bool eqa = false, eqb = false;
#pragma unroll
        for (int k = 0; k < TB_NPL + 2; ++k) {
            if (k >= 1) eqa = eqa || es[k] == fs;
            if (k <= TB_NPL) eqb = eqb || es[k] == s2;
        }
        const bool eqs = st.ss == fs;
        const bool tie = alive && ((flive && (eqa || eqs)) || (live2 && eqb));
        if (__any_sync(FULL_MASK, tie)) {
            __syncwarp();                                 // lane 0's records before the walks
            u32 won = 0u;                                 // bit k: E[k] beats first, TB_NPL+2+k: second
            if (tie) {
                u32 ties = 0u;
#pragma unroll
                for (int k = 0; k < TB_NPL + 2; ++k) {
                    if (k >= 1 && flive && es[k] == fs) ties |= 1u << k;
                    if (k <= TB_NPL && live2 && es[k] == s2) ties |= 1u << (TB_NPL + 2 + k);
                }
                if (flive && eqs) ties |= 1u << (2 * TB_NPL + 4);
                while (ties) {
                    const int i = __ffs((int)ties) - 1;
                    ties &= ties - 1;
                    const int k = i < TB_NPL + 2 ? i : i - (TB_NPL + 2);
                    u32 e = st.sd;
#pragma unroll
                    for (int kk = 0; kk < TB_NPL + 2; ++kk) e = (k == kk && i < 2 * TB_NPL + 4) ? ed[kk] : e;
                    const u32 x = i < TB_NPL + 2 || i == 2 * TB_NPL + 4 ? fd : d2;
                    if (sl_tuple_less(nodes, e, x)) won |= 1u << i;
                }
            }
            s_wins = s_wins || ((won >> (2 * TB_NPL + 4)) & 1u);
            sl_merge(st.cs, st.cd, es, ed, fs, fd, s2, d2, won, g0_k0, g0_k1);
            __syncwarp();
        }
    }
    // the next head (slot 0 = fA[1] ? S : first, the same in every lane), then its three
    // log-probs loaded from its own candidate: one LDS latency on the head's chain, no prefetch
    // of three candidates' triples and no selects among them. The load uses hd, not the
    // alive-gated hq: every candidate ever made (live pops, or dead pops from candidate 0) reads
    // inside the L + 2 rows.
    st.hs = s_wins ? st.ss : fs;
    st.hd = s_wins ? st.sd : fd;
    st.l0 = T[sl_off(st.hd)];
    st.l1 = T[sl_off(st.hd) + 1];
    st.lc = T[(sl_dm1(st.hd) + 1) * W];
    // the next runner-up, broadcast: first needed a pop from now
    const int s_lane = TB_NPL == 1 ? 1 : 0;
    st.ss = __shfl_sync(FULL_MASK, st.cs[TB_NPL == 1 ? 0 : 1], s_lane);
    st.sd = __shfl_sync(FULL_MASK, st.cd[TB_NPL == 1 ? 0 : 1], s_lane);
    // the next pop's window: its shuffles run under that pop's additions
    sl_window(st.cs, st.cd, es, ed);
}

// Profile counters of the loop (TB_PROFILE; otherwise unused and optimised away).
struct SlProfile {
    long long replay_cycles;                              // clock64 cycles inside the redos
    int restores;                                         // checkpoints restored
    int replayed;                                         // pops rerun by the redos
};

// The whole pop loop of warp 0 (the header's CHECKPOINTS), from the initial state (only the head
// (1,) in the list): writes the node records rec[1..n] (lane 0) and returns n, the same in every
// lane. Called by the full warp. TB_FORCE_EXACT: the exact pop throughout, no checkpoints.
__device__ __forceinline__ int sl_build(const double* __restrict__ T, int W, int budget, uint4* rec, int lane,
                                        SlProfile& prof) {
    const double NEG_INF = __longlong_as_double((long long)0xfff0000000000000ull);
    const SortedNodes nodes{rec, W};
    // E[k] = global slot lane * TB_NPL + k - 1: E[0] the left neighbour, E[1..TB_NPL] own,
    // E[TB_NPL + 1] the right neighbour. Slot 0 (the head being popped) beats everything, and its
    // value is never read. Lane 0's E[0] and lane 31's E[TB_NPL + 1] are its own slots (shuffles
    // out of range): lane 0 never reads its E[0] (slot 0 beats first); slot C read as garbage
    // spoils at most slots >= C - m after m pops, and only slots < budget - m can still be popped
    // (C >= budget), so no select is spent on them.
    const bool g0_k1 = lane == 0;                         // E[1] is slot 0
    const bool g0_k0 = TB_NPL == 1 && lane == 1;          // E[0] is slot 0
    SlState st;
#pragma unroll
    for (int j = 0; j < TB_NPL; ++j) { st.cs[j] = NEG_INF; st.cd[j] = 0u; }
    st.hs = budget > 0 ? T[0] : NEG_INF;
    st.hd = sl_pack(0, 0, 0);
    st.l0 = T[0]; st.l1 = T[1]; st.lc = T[W];
    st.ss = NEG_INF; st.sd = 0u;
    st.alive = true;
    st.n = 0;
    if (lane == 0) { st.cs[0] = st.hs; st.cd[0] = st.hd; }
    double es[TB_NPL + 2];                                // the window, shuffled at the end of each pop
    u32 ed[TB_NPL + 2];
    sl_window(st.cs, st.cd, es, ed);
    int tie_node = TB_NO_TIE;                             // this lane's first flagged pop of the chunk
#if TB_FORCE_EXACT
#pragma unroll TB_UNROLL
    for (int node = 1; node <= budget; ++node)
        sl_pop<true>(st, es, ed, node, budget, T, W, rec, nodes, g0_k0, g0_k1, lane, tie_node);
#else
    for (int node0 = 1; node0 <= budget;) {
        const SlState ck = st;                            // the checkpoint
#pragma unroll TB_UNROLL
        for (int u = 0; u < TB_CK; ++u)
            sl_pop<false>(st, es, ed, node0 + u, budget, T, W, rec, nodes, g0_k0, g0_k1, lane, tie_node);
        int next0 = node0 + TB_CK;
        if (__any_sync(FULL_MASK, tie_node != TB_NO_TIE)) {   // rare: redo from the first flagged pop
#if TB_PROFILE
            const long long t0 = clock64();
#endif
            // the pops before the first flagged one are exact (the chunk claim, pop by pop): rerun
            // them fast from the checkpoint, the flagged one exactly, and start the next chunk after it
            const int first = __reduce_min_sync(FULL_MASK, tie_node);
            __syncwarp();                                 // the abandoned records before the exact pop's walks
            st = ck;
            sl_window(st.cs, st.cd, es, ed);
            int unused = TB_NO_TIE;
#pragma unroll 1
            for (int node = node0; node < first; ++node)
                sl_pop<false>(st, es, ed, node, budget, T, W, rec, nodes, g0_k0, g0_k1, lane, unused);
            sl_pop<true>(st, es, ed, first, budget, T, W, rec, nodes, g0_k0, g0_k1, lane, unused);
            next0 = first + 1;
            tie_node = TB_NO_TIE;
#if TB_PROFILE
            prof.replay_cycles += clock64() - t0;
            prof.restores += 1;
            prof.replayed += first - node0 + 1;
#endif
        }
        node0 = next0;
    }
#endif
    return st.n;
}

#if TB_PROFILE
__device__ __forceinline__ long long tb_globaltimer() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

// Visibility (i, j): bit j of node i's ancestor-or-self mask (nw words per node).
__device__ __forceinline__ u32 vis_bit(const u32* amask, int nw, int i, int j) {
    return (amask[i * nw + (j >> 5)] >> (j & 31)) & 1u;
}
// Visibility byte f (0 <= f < Q * Q) of a request's flat [Q][Q] block: (i, j) = divmod(f, Q).
__device__ __forceinline__ u32 vis_byte(const u32* amask, int nw, int Q, int f) {
    const int i = f / Q;
    return vis_bit(amask, nw, i, f - i * Q);
}

// The outputs of one request the epilogue writes (row0 = b * Q).
struct TreeOut {
    int *tokens, *parents, *depths, *positions, *ranks;
    double* scores;
    size_t row0;
    int root, start, W, Kc, nw;
};

// Columns [lo, hi) of one request, thread t of nt each: node i <= nn's ancestor-or-self mask, built in
// registers by walking its parent links (<= depth dependent loads) and stored as nw words; a column
// past nn (padding) gets an empty mask. Reads only final records (i's and its ancestors').
__device__ __forceinline__ void write_masks(const TreeOut& o, const uint4* rec, u32* amask, int lo, int hi, int nn,
                                            int t, int nt) {
    for (int i = lo + t; i < hi; i += nt) {
        u32 m[TB_NPL + 1];
#pragma unroll
        for (int k = 0; k <= TB_NPL; ++k) m[k] = 0u;
        for (int x = i; x <= nn;) {                       // i, then its ancestors up to the root
#pragma unroll
            for (int k = 0; k <= TB_NPL; ++k) m[k] |= (x >> 5) == k ? 1u << (x & 31) : 0u;
            if (x == 0) break;
            x = sl_parent(rec[x].z);
        }
#pragma unroll
        for (int k = 0; k <= TB_NPL; ++k)
            if (k < o.nw) amask[i * o.nw + k] = m[k];
    }
}

// The per-node outputs of columns [lo, hi) straight from the records (column 0 the root; past nn
// padding), thread t of nt each.
__device__ __forceinline__ void write_outputs(const TreeOut& o, const uint4* rec, const int* ids, int lo, int hi,
                                              int nn, int t, int nt) {
    for (int i = lo + t; i < hi; i += nt) {
        int tok = -1, par = -1, dep = -1, pos = -1, rk = -1;
        double sc = __longlong_as_double((long long)0xfff0000000000000ull);
        if (i == 0) {
            tok = o.root; dep = 0; pos = o.start; sc = 0.0;
        } else if (i <= nn) {
            const uint4 r = rec[i];
            const int dm1 = sl_dm1(r.z);
            rk = sl_off(r.z) - dm1 * o.W;
            par = sl_parent(r.z);
            dep = dm1 + 1;
            pos = o.start + dep;
            sc = __hiloint2double((int)r.y, (int)r.x);
            tok = ids[dm1 * o.Kc + rk];
        }
        o.tokens[o.row0 + i] = tok;
        o.parents[o.row0 + i] = par;
        o.depths[o.row0 + i] = dep;
        o.positions[o.row0 + i] = pos;
        o.ranks[o.row0 + i] = rk;
        o.scores[o.row0 + i] = sc;
    }
}

// The request's visibility block is Q * Q bytes at `vis`, stored as aligned 32-bit words: `head`
// leading bytes up to the first 4-byte boundary, then nwords whole words, then a tail (< 4 bytes),
// so that no store touches another request's bytes. Byte f = (i, j) is bit j of row i's mask. Word
// k by thread t of nt (k = t, t + nt, ...): (i, j) of its first byte from one division, then
// advanced by 4 nt bytes a trip (di rows, dj columns).
__device__ __forceinline__ void vis_words(u32* vw, const u32* amask, int nw, int Q, int head, int nwords, int t,
                                          int nt) {
    const int f0 = head + 4 * t;
    int i = f0 / Q, j = f0 - i * Q;
    const int di = (4 * nt) / Q, dj = (4 * nt) - di * Q;
    for (int k = t; k < nwords; k += nt) {
        u32 w = 0u;
        int ii = i, jj = j;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            w |= vis_bit(amask, nw, ii, jj) << (8 * e);
            ++jj;
            if (jj == Q) { jj = 0; ++ii; }
        }
        vw[k] = w;
        i += di;
        j += dj;
        if (j >= Q) { j -= Q; ++i; }
    }
}

// The head bytes (threads 0..head-1) and the tail bytes (threads 4..) of the visibility block.
__device__ __forceinline__ void vis_edges(u8* vis, const u32* amask, int nw, int Q, int head, int nwords, int t) {
    const int tail0 = head + 4 * nwords;                  // bytes tail0 .. Q * Q - 1: the tail (< 4)
    if (t < head) vis[t] = (u8)vis_byte(amask, nw, Q, t);
    if (t >= 4 && t < 4 + Q * Q - tail0) vis[tail0 + t - 4] = (u8)vis_byte(amask, nw, Q, tail0 + t - 4);
}

extern "C" __global__ void __launch_bounds__(TB_THREADS, 1)
tree_build_sorted(const float* __restrict__ topk_logp, const int* __restrict__ topk_ids,
                  const int* __restrict__ root_token, const int* __restrict__ start,
                  int B, int L, int K, int budget,
                  int* __restrict__ tokens, int* __restrict__ parents, int* __restrict__ depths,
                  int* __restrict__ positions, int* __restrict__ ranks, double* __restrict__ scores,
                  u8* __restrict__ visibility, int* __restrict__ num_nodes) {
    extern __shared__ __align__(16) char smem_raw[];
    __shared__ int s_num_nodes;
#if TB_PROFILE
    const long long p_c0 = clock64(), p_g0 = tb_globaltimer();
    long long p_c1 = 0, p_c3 = 0, p_g1 = 0, p_g3 = 0;
#endif
    SlProfile prof{0, 0, 0};
    const int b = blockIdx.x;
    if (b >= B) return;
    const int Q = budget + 1;
    const int Kc = K < Q ? K : Q;
    const int W = Kc + 1;
    const int nw = (Q + 31) >> 5;                         // ancestor-mask words per node (<= TB_NPL + 1)
    const int tid = threadIdx.x;
    const double NEG_INF = __longlong_as_double((long long)0xfff0000000000000ull);
    double* T = (double*)smem_raw;                        // first: its address is a constant
    int* ids = (int*)(smem_raw + align_up((size_t)(L + 2) * W * 8, 16));     // [L][Kc]
    uint4* rec = (uint4*)((char*)ids + align_up((size_t)L * Kc * 4, 16));   // [Q] node records
    u32* amask = (u32*)(rec + Q);                         // [Q][nw] ancestor-or-self bit masks
    // the epilogue's two global scalars, loaded now: their latency hides under the staging
    const TreeOut o{tokens, parents, depths, positions, ranks, scores, (size_t)b * Q, root_token[b], start[b],
                    W, Kc, nw};

    const float* g_lp = topk_logp + (size_t)b * L * K;
    const int* g_ids = topk_ids + (size_t)b * L * K;
    const int t_size = (L + 2) * W;                       // rows L, L + 1: -inf
    {
        // element e = e0 + u * TB_THREADS is (d, r) = divmod(e, W): one division, then stepped
        int d = tid / W, r = tid - d * W;
        const int dd = TB_THREADS / W, dr = TB_THREADS - dd * W;
        for (int e0 = tid; e0 < t_size; e0 += TB_STAGE * TB_THREADS) {   // all loads, then all stores
            double v[TB_STAGE];
#pragma unroll
            for (int u = 0; u < TB_STAGE; ++u) {
                v[u] = (e0 + u * TB_THREADS < t_size && d < L && r < Kc) ? (double)g_lp[(size_t)d * K + r] : NEG_INF;
                d += dd;
                r += dr;
                if (r >= W) { r -= W; ++d; }
            }
#pragma unroll
            for (int u = 0; u < TB_STAGE; ++u)
                if (e0 + u * TB_THREADS < t_size) T[e0 + u * TB_THREADS] = v[u];
        }
    }
    __syncthreads();
#if TB_PROFILE
    if (tid == 0) { p_c1 = clock64(); p_g1 = tb_globaltimer(); }
#endif

    u8* vis = visibility + (size_t)b * Q * Q;
    const int QQ = Q * Q;
    int head = (int)((4u - (u32)((size_t)vis & 3u)) & 3u);
    head = head < QQ ? head : QQ;
    const int nwords = (QQ - head) >> 2;
    u32* vw = (u32*)(vis + head);

    // the warp index as a shuffle result: provably warp-uniform, so the pop loop's shuffles need
    // no divergence guards
    if (__shfl_sync(FULL_MASK, tid / 32, 0) == 0) {
        const int lane = tid;
        const int n = sl_build(T, W, budget, rec, lane, prof);
#if TB_PROFILE
        if (lane == 0) { p_c3 = clock64(); p_g3 = tb_globaltimer(); }
#endif
        if (lane == 0) { s_num_nodes = n; num_nodes[b] = n; }
    } else {                                              // warps 1..7, during the pops: token ids
        for (int e0 = tid - 32; e0 < L * Kc; e0 += TB_STAGE * (TB_THREADS - 32)) {
            int v[TB_STAGE];
#pragma unroll
            for (int u = 0; u < TB_STAGE; ++u) {
                const int e = e0 + u * (TB_THREADS - 32), d = e / Kc;
                v[u] = e < L * Kc ? g_ids[(size_t)d * K + (e - d * Kc)] : 0;
            }
#pragma unroll
            for (int u = 0; u < TB_STAGE; ++u)
                if (e0 + u * (TB_THREADS - 32) < L * Kc) ids[e0 + u * (TB_THREADS - 32)] = v[u];
        }
    }
    __syncthreads();
    // Epilogue: the masks first, one barrier, then every global store (none waits behind a barrier)
    const int nn = s_num_nodes;
    write_masks(o, rec, amask, 0, Q, nn, tid, TB_THREADS);
    __syncthreads();
    write_outputs(o, rec, ids, 0, Q, nn, tid, TB_THREADS);
    vis_words(vw, amask, nw, Q, head, nwords, tid, TB_THREADS);
    vis_edges(vis, amask, nw, Q, head, nwords, tid);
#if TB_PROFILE
    // timing diagnostic (wrong outputs): thread 0 overwrites scores[b][0..9] with the fields listed
    // at the top of this file, as doubles
    __syncthreads();                                      // after every thread's score writes
    if (tid == 0) {
        const long long c4 = clock64(), g4 = tb_globaltimer();
        const double v[10] = {(double)(p_c1 - p_c0), (double)(p_c3 - p_c1 - prof.replay_cycles),
                              (double)prof.replay_cycles, (double)(c4 - p_c3), (double)(c4 - p_c0),
                              (double)(g4 - p_g0), (double)nn, (double)prof.restores,
                              (double)(p_g3 - p_g1), (double)prof.replayed};
#pragma unroll
        for (int j = 0; j < 10; ++j)
            if (j < Q) scores[(size_t)b * Q + j] = v[j];
    }
#endif
}
