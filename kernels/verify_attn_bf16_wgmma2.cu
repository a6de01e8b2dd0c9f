// verify_attn, variant bf16_paged, kernel `bf16_wgmma2`: Hopper warpgroup MMAs (FlashMLA-style; docs/ops/verify_attn.md).
// Target: sm_90a only (wgmma). Built for any other arch (sm_90, sm_120) it is an empty stub that the
// host never launches there: the host picks it only on an sm_90 device, compiled for sm_90a (the
// portable mma.sync kernel, verify_attn_bf16_mma.cu, serves other GPUs).
//
// A block owns 64 consecutive (token, head) rows of one request and one chunk of its keys. Keys,
// values and the mask as in verify_attn_bf16_mma.cu: prefix keys always visible and their mask
// columns never read; keys past the chunk end zero-filled and masked; only the request's own pool
// slots are read. Rows past the request's rows are computed on zero queries and never stored.
//
// Launch (main): block = 256 (two warpgroups), dynamic shared memory WG2_SMEM_BYTES (223,768 B:
//   opt-in, one block per SM).
//   verify_attn_bf16_wgmma2(q bf16 [B*Q,H,576], kv_buffer bf16 [N,576], kv_indptr i32 [B+1],
//                           kv_indices i32 [*], tree_slots i32 [B*Q], custom_mask u8 [*],
//                           mask_indptr i32 [B+1], B, Q, H, sm_scale_log2 (= sm_scale*log2 e),
//                           n_splits, out bf16 [B*Q,H,512], lse f32 [B*Q,H], ws_o, ws_m, ws_l,
//                           lpt_chunk, lpt_sms, lpt_meta i32 [2B])
//   The uniform grid (n_splits > 0; one request, SPLITS forced, or WG2_LPT 0): grid = (ceil(Q*H /
//   64), B, n_splits), split z of a request ceil(kvlen / n_splits) keys rounded up to 64 (n_splits:
//   splits_for in kdtr/ops/verify_attn/cuda.py); n_splits == 1 writes out/lse, otherwise partials
//   [split][B*Q*H rows] (attn_common.cuh) that verify_attn_bf16_wgmma2_merge (grid = B*Q*H, block
//   = 128) finishes. The balanced schedule (n_splits == 0, 2 to LPT_MAX_BATCH requests): grid =
//   (ceil(Q*H / 64), jobs >= the schedule's, 1); block (x, y) runs job y of attn_schedule.cuh's
//   longest-first order (request b, chunk z of n_b; lpt_chunk the least chunk in keys, lpt_sms the
//   SMs of the fair share, 0: lpt_chunk as given). A request of one chunk writes out/lse, otherwise
//   partials at slot y ([slot][Q*H rows]); block (0, 0) writes lpt_meta, and
//   verify_attn_bf16_wgmma2_merge_lpt (grid = (Q*H, B), block = 128) merges the split requests.
//   The segment schedule (WG2_LPT 2, n_splits == 0): grid = (ceil(Q*H / 64), G, 1), G about one
//   block an SM (segment_blocks in cuda.py); block (x, y) takes an equal share of the batch's key
//   tiles (seg_range) and runs it as (request, key range) segments in turn, each a pass of
//   prologue, loop and epilogue with the mbarrier phases carried on (J0); partial slot y + b,
//   lpt_meta and the merge as the balanced schedule's. With WG2_PDL both wait for the grid before
//   them (programmatic dependents for one request): nothing global is read before
//   griddepcontrol.wait (session 16's SASS; session 17's graph replays that rewrite q before each).
//
// Numerical contract: bf16 inputs, fp32 accumulation on tensor cores (wgmma m64nNk16 bf16); scores
//   in the log2 domain: the row max m over the raw fp32 dot products, scaled once,
//   p = ex2.approx.ftz(fma(s, sm_scale_log2, -m)) (exp2f's value wherever p >= 2^-126; smaller p,
//   under half an ulp of l >= 1, become 0); the row sum l adds the fp32 p while P·V uses p rounded to
//   bf16 (as FlashAttention / FlashMLA / SGLang do); out = bf16_rn(O / l) with O / l correctly
//   rounded (div_rn_by: one reciprocal a row), lse = ln 2 * (m + log2 l).
//   No knob changes a result bit.
//
// Design (kernels/NOTES.md has the measurements behind it, and the order's and the gather's A/Bs):
//   1. P_j lives in the rope block (column block 8, dims 512-575) of K stage j & 1: S_j, its only
//      other reader, completed before P_j is written, so P rides the K ring (its write-after-read is
//      the stage refill's, which WG1 issues only after its own P·V_j completed).
//   2. alpha is double-buffered by tile parity (sAlpha[2][64]). WG1's read of alpha_j precedes, in its
//      program order, its arrive on K-full for tile j + 1, which WG0 waits on before it writes
//      alpha_{j+2}: every cross-warpgroup hand-off of ordinary shared-memory data goes through an
//      mbarrier (release arrive, acquire wait), which racecheck tracks.
//   3. Order: once P_j is written, WG1 issues its P·V_j, then publishes tile j + 1 (its part landed)
//      while P·V_j runs; WG0 waits for its P·V_j right after issuing it, frees stage j & 1 (named
//      barrier SF), then waits for tile j + 1; WG1, after its own P·V_j and SF, issues tile j + 2's
//      gather (wgmma2_gather.cuh), one tile in flight while S runs.
//
// Knobs (compile-time; the launch reads WG2_LPT and WG2_PDL, and sets WG2_KV_HINT by the call's size;
// what each gains and costs where: kernels/NOTES.md, sessions 16-20):
//   WG2_LPT (default 0, the uniform grid): 1 the balanced schedule, 2 the segment schedule (J0, the
//     tiles of earlier segments, is the constant 0 in the 0 and 1 builds). WG2_SEG_PREFETCH 1 (with
//     WG2_LPT 2; not yet run on a GPU): WG1 loads the next segment's Q and first tiles early.
//   WG2_PDL (default 1): main and merge wait for the grid before them (griddepcontrol), which the
//     launch makes programmatic dependents for one request (PDL_MAX_BATCH in kdtr/ops/verify_attn/cuda.py).
//   WG2_STAGED_STORE 1: the epilogue stores whole rows through shared memory (the same bytes).
//   WG2_KV_HINT 1: the key gather's cp.async carry an L2 evict-first policy (2: and a 256 B L2
//     prefetch); the launch builds 1 for calls of at most KV_HINT_MAX_BYTES (256 MB) of keys.
//   WG2_PDL=0,WG2_KV_HINT=0 is the kernel of f651642 SASS for SASS.
//
// Roles: WG0 (math): S = Q K^T (36 wgmma m64n64k16), mask, online softmax, P -> bf16 into the stage's
//   block 8, alpha into sAlpha[j & 1]; O[:, 0:256) += P V with P from registers. WG1 (loads + right
//   half): Q once and every K tile by the row-fixed gather (Q's rows are its "slots");
//   O[:, 256:512) += P V with P from shared memory.
// Shared memory (1024-aligned): Q [9][64][128 B]; K ring 2 x [9][64][128 B] (V = blocks 0-7, P_j in
//   block 8 after S_j); alpha [2][64] f32; l, m [64] f32; 512 B unused (kept so that every offset, and
//   so the code, is that of the GPU-verified build); mbarriers.
// Hand-offs (tile j, stage s = j & 1, T tiles in this block's split; with WG2_LPT 2, j counts on over
// the block's segments: J0 + j, so every phase below is of the block's whole tile sequence):
//   MB_KFULL[s] (mbarrier, 128 = WG1's threads, each after its cp.async of the tile completed and a
//     proxy fence): phase k <-> tile 2k + s. WG0 waits parity (j >> 1) & 1 before S_j.
//   MB_PFULL (mbarrier, 128 = WG0's threads, after P_j and alpha_j are written and proxy-fenced):
//     phase j. WG1 waits parity j & 1 before its P·V_j.
//   BAR_SF0 / BAR_SF1 (named, 256: WG0 arrives, WG1 syncs) when j + 2 < T + pre_next: WG0's P·V_j
//     completed, stage s may take tile j + 2; WG1 refills after its own P·V_j too. pre_next is 0
//     but with WG2_SEG_PREFETCH (wgmma2_prefetch.cuh: the next segment's tiles and Q, and why).
//   BAR_FIN (named, 256: WG0 arrives, WG1 syncs): final l and m.
//   No side runs two phases ahead: WG0 arrives PFULL_{j+1} after waiting KFULL for tile j + 1, which
//   WG1 arrives after waiting PFULL_j; WG1 arrives KFULL for tile j + 2 after PFULL_{j+1} (iteration
//   j + 1), which WG0 arrives after waiting KFULL for tiles j and j + 1 (a prefetched tile's KFULL
//   arrive is the next pass's, in the same order). Every arrive has one matching wait or sync: the
//   conditions (j + 1 < T, j + 2 < T + pre_next) are the same on both sides; T = 0 runs no loop
//   iteration.
#include "attn_common.cuh"
#include "attn_schedule.cuh"
#include "wgmma_sm90.cuh"

#define WG_ROWS 64
#define WG_KEYS 64
#define WG_THREADS 256
#define WG_NCB 9                              // 64-wide column blocks of a 576 row
#define WG_BLOCK (64 * 128)                   // bytes of one [64 rows][64 bf16] swizzled block
#define WG_TILE (WG_NCB * WG_BLOCK)           // 73,728 B: 64 rows x 576 bf16
#define WG_OFF_Q 0
#define WG_OFF_K (WG_TILE)
#define WG_OFF_ALPHA (3 * WG_TILE)            // [2][64] f32
#define WG_OFF_L (WG_OFF_ALPHA + 512)
#define WG_OFF_M (WG_OFF_L + 256)
#define WG_OFF_MBAR (WG_OFF_M + 256 + 512)    // KFULL[2], PFULL; 512 B unused before it (header)
#define WG_USED (WG_OFF_MBAR + 24)            // 222,744 B
#define WG2_SMEM_BYTES (WG_USED + 1024)       // + alignment slack for the 1024 B swizzle atoms
#define LN2_F 0.6931471805599453f

// Compile-time knobs: the header's "Knobs" says what each does (kernels/NOTES.md what it measured).
#ifndef WG2_LPT
#define WG2_LPT 0
#endif
#ifndef WG2_PDL
#define WG2_PDL 1
#endif
#ifndef WG2_STAGED_STORE
#define WG2_STAGED_STORE 0
#endif
#ifndef WG2_SEG_PREFETCH
#define WG2_SEG_PREFETCH 0
#endif
#define SEG_PF (WG2_LPT == 2 && WG2_SEG_PREFETCH)   // the next segment's Q and first tiles loaded early
#if WG2_STAGED_STORE && WG2_LPT == 2
#error "WG2_STAGED_STORE stages through the K ring, which the next segment of WG2_LPT 2 refills"
#endif
#ifndef WG2_KV_HINT
#define WG2_KV_HINT 0
#endif

#define WG2_OUT_PITCH (1024 + 16)             // bytes a staged bf16 row (padded: no bank conflicts)
#define WG2_PART_PITCH (2048 + 32)            // ... a staged fp32 partial row

#define BAR_SF0 5       // WG0 done with K stage 0 (its P.V completed): WG0 arrives, WG1 syncs
#define BAR_SF1 6       // ... stage 1
#define BAR_FIN 8       // final l and m: WG0 arrives, WG1 syncs

// O *= alpha per row (two rows per thread)
template <int N>
__device__ __forceinline__ void rescale(float (&o)[N], float al0, float al1) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        o[4 * i] *= al0; o[4 * i + 1] *= al0; o[4 * i + 2] *= al1; o[4 * i + 3] *= al1;
    }
}

#include "wgmma2_gather.cuh"   // gather_rows: WG1's row-fixed tile gather
#if SEG_PF
#include "wgmma2_prefetch.cuh" // WG1's gathers of the next segment
#endif

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
verify_attn_bf16_wgmma2(ATTN_BF16_PAGED_PARAMS, int lpt_chunk, int lpt_sms, int* __restrict__ lpt_meta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw_addr = smem_addr(smem_raw);
    const unsigned pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
    unsigned char* smem = smem_raw + pad;
    const unsigned sbase = raw_addr + pad;               // shared-window address of the aligned base
    float* sAlpha = (float*)(smem + WG_OFF_ALPHA);        // [2][64]
    float* sL = (float*)(smem + WG_OFF_L);
    float* sM = (float*)(smem + WG_OFF_M);
    const unsigned mb_kfull = sbase + WG_OFF_MBAR;        // + 8 * stage
    const unsigned mb_pfull = sbase + WG_OFF_MBAR + 16;
    if (threadIdx.x == 0) {
        mbar_init(mb_kfull, 128);                         // WG1
        mbar_init(mb_kfull + 8, 128);
        mbar_init(mb_pfull, 128);
    }
    __syncthreads();                                      // the barriers exist before any arrive
#if WG2_PDL
    grid_dep_wait();                                      // the grid before this one (its writes) done
    grid_dep_launch();
#endif

    const int tid = threadIdx.x;
    const int wg = tid >> 7, wt = tid & 127;
    const int lane = tid & 31, wq = (tid >> 5) & 3;       // warp within the warpgroup
    const int g = lane >> 2, t = lane & 3;
#if WG2_LPT
    // this block's request b and its keys [kbeg, kend); `direct`: it writes out / lse, else the
    // partial rows prow0 + (tile row) of the workspace
    const int rows_req = Q * H;
    const int row0 = blockIdx.x * WG_ROWS;
    const int nrows = min(WG_ROWS, rows_req - row0);
#if WG2_LPT == 2
    // the segment schedule: this block's tiles [seg_t, seg_t1) of the batch, from request seg_b on
    int seg_b = 0, seg_cum = 0, seg_t = 0, seg_t1 = 1, J0 = 0;
#if SEG_PF
    int seg_pre = 0;    // this pass's tiles the pass before gathered (0-2; and Q)
#endif
    if (n_splits == 0) {
        const SegRange range = seg_range(blockIdx.y, gridDim.y, kv_indptr, B, Q, lpt_meta,
                                         blockIdx.x == 0 && blockIdx.y == 0, (int*)(smem + WG_OFF_K + WG_TILE));
        if (range.b < 0) return;                          // past the last block with tiles
        seg_b = range.b;
        seg_cum = range.cum;
        seg_t = range.t0;
        seg_t1 = range.t1;
    }
    for (;;) {                                            // a segment a pass (one for the uniform grid)
#else
    constexpr int J0 = 0;                                 // tiles this block ran before this pass
#endif
    int b, ibase, kvlen, kbeg, chunk;
    bool direct;
    size_t prow0;
    if (n_splits > 0) {                                   // the uniform grid: split blockIdx.z of n_splits
        b = blockIdx.y;
        ibase = kv_indptr[b];
        kvlen = kv_indptr[b + 1] - ibase + Q;
        chunk = ((kvlen + n_splits - 1) / n_splits + WG_KEYS - 1) / WG_KEYS * WG_KEYS;
        kbeg = (int)blockIdx.z * chunk;
        direct = n_splits == 1;
        prow0 = ((size_t)blockIdx.z * B + b) * rows_req + row0;
    } else {
#if WG2_LPT == 2                                          // segment (seg_b, tiles [seg_t, its end))
        b = seg_b;
        ibase = kv_indptr[b];
        kvlen = kv_indptr[b + 1] - ibase + Q;
        const int seg_end = min(seg_t1, seg_cum + (kvlen + WG_KEYS - 1) / WG_KEYS);
        kbeg = (seg_t - seg_cum) * WG_KEYS;
        chunk = (seg_end - seg_t) * WG_KEYS;
        direct = seg_t == seg_cum && seg_end == seg_cum + (kvlen + WG_KEYS - 1) / WG_KEYS;
        prow0 = ((size_t)blockIdx.y + b) * rows_req + row0;
#else                                                     // the balanced schedule: job blockIdx.y
        const LptJob job = lpt_job(blockIdx.y, kv_indptr, B, Q, gridDim.x, lpt_chunk, lpt_sms, lpt_meta,
                                   blockIdx.x == 0 && blockIdx.y == 0, (int*)(smem + WG_OFF_K + WG_TILE));
        if (job.b < 0) return;                            // past the last job (the whole block)
        b = job.b;
        ibase = job.ibase;
        kvlen = job.kvlen;
        chunk = job.chunk;
        kbeg = job.z * chunk;
        direct = job.n == 1;
        prow0 = (size_t)blockIdx.y * rows_req + row0;
#endif
    }
    const int P = kvlen - Q;
#else
    constexpr int J0 = 0;
    ATTN_PAGED_REQUEST(WG_ROWS)
    const int per_split = (kvlen + n_splits - 1) / n_splits;
    const int chunk = (per_split + WG_KEYS - 1) / WG_KEYS * WG_KEYS;
    const int kbeg = z * chunk;
#endif
    const int kend = min(kbeg + chunk, kvlen);
    const int T = kend > kbeg ? (kend - kbeg + WG_KEYS - 1) / WG_KEYS : 0;
#if SEG_PF
    const NextSeg nx = next_segment(kv_indptr, b, Q, n_splits == 0 ? seg_t1 - (seg_cum + (kvlen + WG_KEYS - 1) / WG_KEYS) : 0);
    const bool q_next = nx.T > 0, q_pre = J0 > 0;         // Q: this pass's by the pass before, but the first
    const int pre_next = T >= 2 ? min(nx.T, 2) : 0, pre = seg_pre;
#else
    constexpr bool q_next = false, q_pre = false;
    constexpr int pre_next = 0, pre = 0;
#endif
    const size_t grow0 = (size_t)b * rows_req + row0;
    const int r0 = wq * 16 + g, r1 = r0 + 8;              // this thread's two tile rows

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m0 = neg_inf(), m1 = neg_inf();                 // running max (log2 units), WG0
    float l0 = 0.f, l1 = 0.f;                             // this thread's share of the row sums, WG0

    // K gather: slot of key j (0 past the split end: a valid address, zero-filled by the copy)
    auto slot_of = [&](int j) -> int {
        if (j >= kend) return 0;
        return j < P ? kv_indices[ibase + j] : tree_slots[(size_t)b * Q + (j - P)];
    };
    const int rg = wt >> 3, cc = wt & 7;                  // gather_rows: rows rg + 16 k, chunk cc
    const unsigned growoff = rg * 128 + ((cc ^ (rg & 7)) << 4);   // row rg, chunk cc in a swizzled tile
    const unsigned gdst = sbase + WG_OFF_K + growoff;
    const unsigned char* gsrc = (const unsigned char*)kv_buffer + cc * 16;
    auto slots_of = [&](int key0, int (&sl)[4]) {
#pragma unroll
        for (int k = 0; k < 4; ++k) sl[k] = slot_of(key0 + rg + 16 * k);
    };
#if SEG_PF
    auto tile_slots = [&](int i, int (&sl)[4]) {          // tile i of the pass; i >= T: the next segment's
        if (i < T) slots_of(kbeg + i * WG_KEYS, sl);
        else next_segment_slots(nx, b + 1, Q, i - T, rg, kv_indices, tree_slots, sl);
    };
    auto tile_valid = [&](int i) { return i < T ? kend - kbeg - i * WG_KEYS - rg : nx.kend - (i - T) * WG_KEYS - rg; };
    auto gather_q = [&](int rb, int (&rows)[4]) {         // request rb's Q into the Q buffer
        gather_q_rows(sbase + WG_OFF_Q + growoff, (const unsigned char*)(q + ((size_t)rb * rows_req + row0) * ATTN_D) + cc * 16,
                      nrows, rg, rows);
    };
#endif

    if (wg == 1) {
        // ---------------------------------------------------------------- WG1: loads + right half
        // after the caller waited for this thread's chunks of the tile in `stage`: make them visible
        auto publish = [&](int stage) {
            fence_proxy_async();
            mbar_arrive(mb_kfull + 8 * stage);
        };
        // tile j + 1 to WG0, once this thread's part of it landed (its cp.async group is the last)
        auto publish_next = [&](int j) {
            if (j + 1 < T) {
                cp_async_wait<0>();
                publish(((J0 + j) & 1) ^ 1);
            }
        };
        int sl[4];                                        // this thread's rows of Q, then of the next tile
#if SEG_PF
        prefetched_prologue(pre, q_pre, T, J0, gdst, gsrc, tile_slots, tile_valid,
                            [&](int (&rows)[4]) { gather_q(b, rows); }, sl);
#else
        // prologue: Q, tiles 0 and 1, this thread's slots of tile 2
        gather_q_rows(sbase + WG_OFF_Q + growoff, (const unsigned char*)(q + grow0 * ATTN_D) + cc * 16, nrows, rg, sl);
        slots_of(kbeg, sl);
        if (T > 0) gather_rows(gdst + (J0 & 1) * WG_TILE, gsrc, sl, kend - kbeg - rg);
        cp_async_commit();
        slots_of(kbeg + WG_KEYS, sl);
        if (T > 1) gather_rows(gdst + ((J0 + 1) & 1) * WG_TILE, gsrc, sl, kend - kbeg - WG_KEYS - rg);
        cp_async_commit();
        slots_of(kbeg + 2 * WG_KEYS, sl);
#endif
        cp_async_wait<1>();                               // Q and tile 0 landed (this thread's part)
        if (T > 0) publish(J0 & 1);

        for (int j = 0; j < T; ++j) {
            const int s = (J0 + j) & 1;                   // the tile's stage (J0: tiles of earlier segments)
            mbar_wait(mb_pfull, (J0 + j) & 1);            // P_j (stage s, block 8) and alpha_j written
#if SEG_PF
            if (q_next && j == T - 1) {                   // S_j, the segment's last Q reader, completed
                int rows[4];
                gather_q(b + 1, rows);
                cp_async_commit();
            }
#endif
            rescale(o, sAlpha[s * 64 + r0], sAlpha[s * 64 + r1]);
            const u64 dP = desc_sw128(sbase + WG_OFF_K + s * WG_TILE + 8 * WG_BLOCK, 16, 1024);
            const u64 dV = desc_sw128(sbase + WG_OFF_K + s * WG_TILE + 4 * WG_BLOCK, WG_BLOCK, 1024);
            fence_operands(o);                            // the rescale lands before the fence
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) wgmma_ss_n256_t(o, dP + 2 * ks, dV + 128 * ks, 1);
            wgmma_commit();
            publish_next(j);                              // while this P.V_j runs
            wgmma_wait<0>();                              // this warpgroup's P.V_j (and its read of P_j)
            fence_operands(o);
            if (j + 2 < T + pre_next) {                   // refill stage s with tile j+2 (maybe the next segment's)
                bar_sync(s ? BAR_SF1 : BAR_SF0, 256);     // WG0's P.V_j completed
#if SEG_PF
                gather_rows(gdst + s * WG_TILE, gsrc, sl, tile_valid(j + 2));
                cp_async_commit();
                tile_slots(j + 3, sl);                    // this thread's rows of tile j+3
#else
                const int key2 = kbeg + (j + 2) * WG_KEYS;
                gather_rows(gdst + s * WG_TILE, gsrc, sl, kend - key2 - rg);
                cp_async_commit();
                slots_of(key2 + WG_KEYS, sl);             // this thread's rows of tile j+3
#endif
            }
        }
        if (!q_next) cp_async_wait<0>();                  // (the next segment's loads stay in flight)
        bar_sync(BAR_FIN, 256);
        m0 = sM[r0]; m1 = sM[r1];
        l0 = sL[r0]; l1 = sL[r1];
    } else {
        // ---------------------------------------------------------------- WG0: S, softmax, left half
        float sacc[32];
        u32 pa[4][4];
        const u64 dQ = desc_sw128(sbase + WG_OFF_Q, 16, 1024);
        const int mbase = mask_indptr[b];
        const int tok0 = min((row0 + r0) / H, Q - 1), tok1 = min((row0 + r1) / H, Q - 1);
        const u8* mrow0 = custom_mask + (size_t)mbase + (size_t)tok0 * kvlen;
        const u8* mrow1 = custom_mask + (size_t)mbase + (size_t)tok1 * kvlen;

        auto issue_s = [&](int stage) {
            const u64 dK = desc_sw128(sbase + WG_OFF_K + stage * WG_TILE, 16, 1024);
            fence_operands(sacc);                         // no accumulator writes inside the stage
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 36; ++kk) {
                const int off = (kk >> 2) * (WG_BLOCK >> 4) + (kk & 3) * 2;
                wgmma_ss_n64(sacc, dQ + off, dK + off, kk > 0 ? 1 : 0);
            }
            wgmma_commit();
        };

        for (int j = 0; j < T; ++j) {
            const int s = (J0 + j) & 1;                   // the tile's stage (J0: tiles of earlier segments)
            const int key0 = kbeg + j * WG_KEYS;
            if (j == 0) {                                 // inside the loop: no loop-entry copies of
                mbar_wait(mb_kfull + 8 * (J0 & 1), (J0 >> 1) & 1);
                issue_s(J0 & 1);
            }
            // tiles holding tree keys or the split end: the rows' mask bytes, all 32 loads issued
            // before S_j is waited for (clamped to a tree column of the row, so no load depends on
            // a branch or on another load); prefix keys are always visible, keys past kend never
            const bool tail = key0 + WG_KEYS > P || key0 + WG_KEYS > kend;
            u8 mb0[16], mb1[16];
            if (tail) {
#pragma unroll
                for (int n = 0; n < 16; ++n) {
                    const int kc = min(max(key0 + 8 * (n >> 1) + 2 * t + (n & 1), P), kvlen - 1);
                    mb0[n] = mrow0[kc];
                    mb1[n] = mrow1[kc];
                }
            }
            wgmma_wait<0>();                              // S_j
            fence_operands(sacc);
            fence_operands(o);

            if (tail) {
#pragma unroll
                for (int n = 0; n < 16; ++n) {
                    const int kj = key0 + 8 * (n >> 1) + 2 * t + (n & 1);
                    const int a = 4 * (n >> 1) + (n & 1);
                    const bool past = kj >= kend, tree = kj >= P;   // no short-circuit: selects, not branches
                    if (past | (tree & (mb0[n] == 0))) sacc[a] = neg_inf();
                    if (past | (tree & (mb1[n] == 0))) sacc[a + 2] = neg_inf();
                }
            }
            float mx0 = neg_inf(), mx1 = neg_inf();
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                mx0 = fmaxf(mx0, fmaxf(sacc[4 * i], sacc[4 * i + 1]));
                mx1 = fmaxf(mx1, fmaxf(sacc[4 * i + 2], sacc[4 * i + 3]));
            }
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
            }
            const float mn0 = fmaxf(m0, mx0 == neg_inf() ? neg_inf() : mx0 * sm_scale_log2);
            const float mn1 = fmaxf(m1, mx1 == neg_inf() ? neg_inf() : mx1 * sm_scale_log2);
            const bool dead0 = mn0 == neg_inf(), dead1 = mn1 == neg_inf();
            const float al0 = dead0 ? 1.f : exp2f(m0 - mn0);
            const float al1 = dead1 ? 1.f : exp2f(m1 - mn1);
            m0 = mn0; m1 = mn1;
            // -m, or 0 for a row that saw only masked keys (all its scores -inf): a masked score
            // gives 2^-inf = 0 either way, so no test per element
            const float nm0 = dead0 ? 0.f : -mn0, nm1 = dead1 ? 0.f : -mn1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) p[e] = exp2_ftz(fmaf(sacc[4 * i + e], sm_scale_log2, e < 2 ? nm0 : nm1));
                ps0 += p[0] + p[1];
                ps1 += p[2] + p[3];
                pa[i >> 1][(i & 1) * 2] = pack_bf16x2(p[0], p[1]);
                pa[i >> 1][(i & 1) * 2 + 1] = pack_bf16x2(p[2], p[3]);
            }
            l0 = l0 * al0 + ps0;
            l1 = l1 * al1 + ps1;

            // P_j into block 8 of stage s (S_j, its only other reader, completed above) and alpha_j
            unsigned char* sP = smem + WG_OFF_K + s * WG_TILE + 8 * WG_BLOCK;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                *(u32*)(sP + r0 * 128 + ((i ^ (r0 & 7)) << 4) + 4 * t) = pa[i >> 1][(i & 1) * 2];
                *(u32*)(sP + r1 * 128 + ((i ^ (r1 & 7)) << 4) + 4 * t) = pa[i >> 1][(i & 1) * 2 + 1];
            }
            if (t == 0) { sAlpha[s * 64 + r0] = al0; sAlpha[s * 64 + r1] = al1; }
            fence_proxy_async();
            mbar_arrive(mb_pfull);

            // O[:, 0:256) = alpha O + P V
            rescale(o, al0, al1);
            const u64 dV = desc_sw128(sbase + WG_OFF_K + s * WG_TILE, WG_BLOCK, 1024);
            fence_operands(o);                            // the rescale lands before the fence
            fence_regs(pa);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) wgmma_rs_n256_t(o, pa[ks], dV + 128 * ks, 1);
            wgmma_commit();
            if (j + 1 < T) {
                wgmma_wait<0>();                          // P.V_j done: stage s is free for tile j+2
                keep_alive(pa);
                fence_operands(o);
                if (j + 2 < T + pre_next) bar_arrive(s ? BAR_SF1 : BAR_SF0, 256);
                mbar_wait(mb_kfull + 8 * (s ^ 1), ((J0 + j + 1) >> 1) & 1);   // tile j+1 landed
                issue_s(s ^ 1);
            }
        }
        wgmma_wait<0>();
        if (T > 0) keep_alive(pa);
        fence_operands(o);
        if (pre_next == 2) bar_arrive(((J0 + T - 1) & 1) ? BAR_SF1 : BAR_SF0, 256);   // for the next segment's tile 1
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, off);
            l1 += __shfl_xor_sync(0xffffffffu, l1, off);
        }
        if (t == 0) { sL[r0] = l0; sL[r1] = l1; sM[r0] = m0; sM[r1] = m1; }
        bar_arrive(BAR_FIN, 256);
    }

    // ---------------------------------------------------------------- epilogue: both halves
    const size_t gr0 = grow0 + r0, gr1 = grow0 + r1;
#if !WG2_LPT
    const size_t rows_total = (size_t)B * rows_req;
    const bool direct = n_splits == 1;
#endif
    const bool rv0 = r0 < nrows, rv1 = r1 < nrows;
    const int colbase = wg * 256 + 2 * t;
#if WG2_STAGED_STORE
    // The tile leaves through shared memory: each thread's fragments into the K ring (free: every
    // wgmma that read it and every cp.async into it completed before BAR_FIN and the sync below),
    // rows padded by 16 B (bf16) / 32 B (fp32) so that a warp's 8 rows hit distinct banks; then
    // whole rows out, a warp storing 512 contiguous bytes with 16-byte stores (instead of 8 rows x
    // 16 or 32 bytes a store instruction). The same values as the direct stores, bit for bit.
    unsigned char* stage = smem + WG_OFF_K;
    __syncthreads();
#endif
    if (direct) {
        const float inv0 = __frcp_rn(l0), inv1 = __frcp_rn(l1);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int col = colbase + 8 * i;
#if WG2_STAGED_STORE
            *(u32*)(stage + r0 * WG2_OUT_PITCH + 2 * col) =
                pack_bf16x2(div_rn_by(o[4 * i], l0, inv0), div_rn_by(o[4 * i + 1], l0, inv0));
            *(u32*)(stage + r1 * WG2_OUT_PITCH + 2 * col) =
                pack_bf16x2(div_rn_by(o[4 * i + 2], l1, inv1), div_rn_by(o[4 * i + 3], l1, inv1));
#else
            if (rv0) *(u32*)(out + gr0 * ATTN_DV + col) =
                pack_bf16x2(div_rn_by(o[4 * i], l0, inv0), div_rn_by(o[4 * i + 1], l0, inv0));
            if (rv1) *(u32*)(out + gr1 * ATTN_DV + col) =
                pack_bf16x2(div_rn_by(o[4 * i + 2], l1, inv1), div_rn_by(o[4 * i + 3], l1, inv1));
#endif
        }
        if (wg == 0 && t == 0) {
            if (rv0) lse[gr0] = LN2_F * (m0 + log2f(l0));
            if (rv1) lse[gr1] = LN2_F * (m1 + log2f(l1));
        }
#if WG2_STAGED_STORE
        __syncthreads();
#pragma unroll 4
        for (int c = tid; c < WG_ROWS * 64; c += WG_THREADS) {         // 64 16-byte chunks a row
            const int row = c >> 6, k = c & 63;
            if (row < nrows)
                *(uint4*)(out + (grow0 + row) * ATTN_DV + 8 * k) = *(const uint4*)(stage + row * WG2_OUT_PITCH + 16 * k);
        }
#endif
    } else {
#if WG2_LPT
        const size_t pr0 = prow0 + r0, pr1 = prow0 + r1;  // partial rows
#else
        const size_t pr0 = (size_t)z * rows_total + gr0, pr1 = (size_t)z * rows_total + gr1;
#endif
#if !WG2_STAGED_STORE
        float* w0 = ws_o + pr0 * ATTN_DV;
        float* w1 = ws_o + pr1 * ATTN_DV;
#endif
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int col = colbase + 8 * i;
#if WG2_STAGED_STORE
            *(float2*)(stage + r0 * WG2_PART_PITCH + 4 * col) = make_float2(o[4 * i], o[4 * i + 1]);
            *(float2*)(stage + r1 * WG2_PART_PITCH + 4 * col) = make_float2(o[4 * i + 2], o[4 * i + 3]);
#else
            if (rv0) *(float2*)(w0 + col) = make_float2(o[4 * i], o[4 * i + 1]);
            if (rv1) *(float2*)(w1 + col) = make_float2(o[4 * i + 2], o[4 * i + 3]);
#endif
        }
        if (wg == 0 && t == 0) {
            if (rv0) { ws_m[pr0] = m0 * LN2_F; ws_l[pr0] = l0; }
            if (rv1) { ws_m[pr1] = m1 * LN2_F; ws_l[pr1] = l1; }
        }
#if WG2_STAGED_STORE
        __syncthreads();
        const size_t prow = pr0 - r0;                                   // the tile's first partial row
#pragma unroll 4
        for (int c = tid; c < WG_ROWS * 128; c += WG_THREADS) {        // 128 16-byte chunks a row
            const int row = c >> 7, k = c & 127;
            if (row < nrows)
                *(float4*)(ws_o + (prow + row) * ATTN_DV + 4 * k) = *(const float4*)(stage + row * WG2_PART_PITCH + 16 * k);
        }
#endif
    }
#if WG2_LPT == 2
    if (n_splits > 0) break;                              // the uniform grid: one pass
    J0 += T;                                              // the segment's tiles: the phases go on
    seg_t += T;
    if (seg_t == seg_cum + (kvlen + WG_KEYS - 1) / WG_KEYS) { ++seg_b; seg_cum = seg_t; }
    if (seg_t >= seg_t1) break;
#if SEG_PF
    seg_pre = pre_next;
#endif
    }
#endif
#endif
}

#if WG2_PDL
ATTN_MERGE_DEPENDENT_ENTRY(verify_attn_bf16_wgmma2_merge, ATTN_MERGE_MAXZ, u16, StoreBF16)
#else
ATTN_MERGE_ENTRY(verify_attn_bf16_wgmma2_merge, u16, StoreBF16)
#endif
ATTN_MERGE_LPT_ENTRY(verify_attn_bf16_wgmma2_merge_lpt, u16, StoreBF16)
