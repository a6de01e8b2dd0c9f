// The balanced ("LPT") schedule of a bf16_paged batch's KV chunks, and the merge of its partials.
//
// With requests of different lengths in a batch (a serving batch: prefixes from a few tokens to
// thousands), one grid dimension per request and the same split count for all (the uniform grid)
// leaves the last wave to whatever long requests the hardware happened to dispatch last. Here every
// block computes the same schedule from kv_indptr (no metadata kernel, no host read of device
// memory, so the launch stays graph-capturable):
//   - key tiles kt_b = ceil(kvlen_b / 64) a request, the batch's sum, least and most;
//   - the chunk, in keys: `chunk_min` (the host's, from its split count for the mean request) where
//     every request has the same kt_b or `sms` is 0 (a forced chunk); otherwise at least an even
//     share of the GPU, 64 * ceil(row_tiles * sum kt_b / sms) keys, so that no block is longer than
//     a fair SM's work;
//   - request b in n_b = ceil(kvlen_b / chunk) chunks of c_b = roundup64(ceil(kvlen_b / n_b)) keys
//     (its last chunk what is left: the uniform kernel's split of the same n_b);
//   - the jobs (request, chunk) in longest-first order: c_b descending, then b ascending, a
//     request's chunks together in chunk order. The host launches grid.y >= sum n_b (an upper
//     bound from shapes); block y takes job y and a block past the last job returns.
// Job y's partials (n_b > 1) are slot y of the workspace, [slot][Q*H rows]; a request's chunks have
// slots first_b .. first_b + n_b - 1, which block (0, 0) writes to meta[b] = (first_b, n_b) for the
// merge. The hardware dispatches blocks in order of their index, so the longest jobs start first and
// the shortest fill the last wave (list scheduling, longest first).
#pragma once

struct LptJob {
    int b;        // the request (-1: no job for this block)
    int z;        // its chunk, 0 .. n - 1
    int n;        // the request's chunks
    int chunk;    // keys a chunk (c_b): chunk z has keys [z * chunk, min((z + 1) * chunk, kvlen))
    int ibase;    // kv_indptr[b]
    int kvlen;    // its keys, P_b + Q
};

__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Job `job` of the schedule (above), computed by every thread of the block (it holds
// __syncthreads) in `scratch` (128 + 4 B ints of shared memory, free again on return: bf16_wgmma2
// lends it K stage 1, 73,728 B, room for 4,576 requests);
// `write_meta`: this block writes meta[2b], meta[2b + 1] = (first slot, chunks) of every request.
__device__ __forceinline__ LptJob lpt_job(int job, const int* __restrict__ kv_indptr, int B, int Q,
                                          int row_tiles, int chunk_min, int sms, int* __restrict__ meta,
                                          bool write_meta, int* scratch) {
    const int tid = threadIdx.x, nthr = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
    int* s_red = scratch;                 // [3][32]: each warp's sum, least and most key tiles
    int* s_pick = scratch + 96;           // the job's request and chunk
    int* s_kv = scratch + 128;            // [B] keys
    int* s_ib = s_kv + B;                 // [B] kv_indptr[b]
    int* s_n = s_ib + B;                  // [B] chunks
    int* s_ch = s_n + B;                  // [B] keys a chunk
    int tiles = 0, lo = 0x7fffffff, hi = 0;
    #pragma unroll 1
    for (int r = tid; r < B; r += nthr) {
        const int i0 = kv_indptr[r];
        const int kv = kv_indptr[r + 1] - i0 + Q;
        s_ib[r] = i0;
        s_kv[r] = kv;
        const int kt = (kv + 63) / 64;
        tiles += kt;
        lo = min(lo, kt);
        hi = max(hi, kt);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        tiles += __shfl_xor_sync(0xffffffffu, tiles, off);
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, off));
    }
    if (lane == 0) { s_red[warp] = tiles; s_red[32 + warp] = lo; s_red[64 + warp] = hi; }
    if (tid == 0) { s_pick[0] = -1; s_pick[1] = 0; }
    __syncthreads();
    long long all = 0;
    lo = 0x7fffffff;
    hi = 0;
    #pragma unroll 1
    for (int w = 0; w < nwarps; ++w) {
        all += s_red[w];
        lo = min(lo, s_red[32 + w]);
        hi = max(hi, s_red[64 + w]);
    }
    int chunk = chunk_min;
    if (sms > 0 && lo != hi) {
        const long long fair = ((long long)row_tiles * all + sms - 1) / sms;     // key tiles of an even share
        chunk = (int)max((long long)chunk, min(64 * fair, (long long)0x40000000));
    }
    #pragma unroll 1
    for (int r = tid; r < B; r += nthr) {
        const int kv = s_kv[r];
        const int n = (kv + chunk - 1) / chunk;
        s_n[r] = n;
        s_ch[r] = ((kv + n - 1) / n + 63) / 64 * 64;
    }
    __syncthreads();
    // request r's first job: the chunks of every request before it in the order (a warp a request)
    #pragma unroll 1
    for (int r = warp; r < B; r += nwarps) {
        const int ch = s_ch[r];
        int before = 0;
        #pragma unroll 1
        for (int j = lane; j < B; j += 32) {
            const int cj = s_ch[j];
            if (cj > ch || (cj == ch && j < r)) before += s_n[j];
        }
        before = warp_sum(before);
        if (lane == 0) {
            const int n = s_n[r];
            if (job >= before && job < before + n) { s_pick[0] = r; s_pick[1] = job - before; }
            if (write_meta) { meta[2 * r] = before; meta[2 * r + 1] = n; }
        }
    }
    __syncthreads();
    LptJob out;
    out.b = s_pick[0];
    out.z = s_pick[1];
    const int r = max(out.b, 0);
    out.n = s_n[r];
    out.chunk = s_ch[r];
    out.ibase = s_ib[r];
    out.kvlen = s_kv[r];
    __syncthreads();                      // every thread has read: the caller may reuse the scratch
    return out;
}

// The merge of the schedule's partials: grid = (Q*H, B), block = MERGE_THREADS (128); block (r, b)
// merges row r of request b from its meta[b] = (first slot, chunks) (a request of one chunk was
// written by the main kernel: the block returns). One row a block, as the uniform grid's merge, so
// that the requests it split merge with as many rows in flight; the arithmetic is
// merge_row_batched's, in chunk order, so a uniform batch gives the uniform grid's bits. It waits
// for the main kernel's grid (a programmatic dependent launch); meta is read through L2 (ld.cg).
#define ATTN_MERGE_LPT_ENTRY(name, out_t, Store)                                                      \
    extern "C" __global__ void __launch_bounds__(MERGE_THREADS)                                       \
    name(const float* __restrict__ ws_o, const float* __restrict__ ws_m,                               \
         const float* __restrict__ ws_l, const int* meta, int rows_req, out_t* __restrict__ out,      \
         float* __restrict__ lse) {                                                                    \
        grid_dep_wait();                                                                               \
        grid_dep_launch();                                                                             \
        const int b = blockIdx.y, first = __ldcg(meta + 2 * b), n = __ldcg(meta + 2 * b + 1);          \
        if (n == 1) return;                                                                            \
        const size_t at = (size_t)first * rows_req;                                                    \
        merge_row_batched<ATTN_MERGE_MAXZ>(ws_o + at * ATTN_DV, ws_m + at, ws_l + at, n, rows_req,     \
                                           blockIdx.x, lse + (size_t)b * rows_req,                     \
                                           Store{out + (size_t)b * rows_req * ATTN_DV});               \
    }

// The segment schedule (bf16_wgmma2's WG2_LPT 2; the shape of FlashMLA's metadata): the batch's key
// tiles kt_b = ceil(kvlen_b / 64) laid end to end in request order, T in all; G = min(grid.y, T)
// blocks a row tile, block y taking tiles [floor(y T / G), floor((y + 1) T / G)) (at least one: a
// block past G returns), which it runs as (request, key range) segments in turn. Request b's pieces
// are the blocks yf_b .. yl_b its tiles fall in (y(t) = floor(((t + 1) G - 1) / T) for tile t);
// piece (b, y) is partial slot y + b, consecutive for a request and distinct over the batch (a later
// request's blocks are never earlier ones), so G + B - 1 slots at most; a request inside one block is
// written directly. Block (0, 0) writes meta[b] = (yf_b + b, yl_b - yf_b + 1): the balanced merge
// reads it as it reads the LPT schedule's. Every block computes the prefix of the tiles itself (no
// metadata kernel, no host read of device memory: the launch stays graph-capturable).
struct SegRange {
    int b;        // the request of the block's first tile (-1: this block has no tiles)
    int cum;      // the tiles of the requests before b
    int t0, t1;   // the block's tiles [t0, t1) of the batch's T
};

// Block y's range (above), computed by every thread of the block (it holds __syncthreads) in
// `scratch` (B + 34 ints of shared memory, free again on return); `write_meta`: this block writes
// meta[2b], meta[2b + 1] of every request.
__device__ __forceinline__ SegRange seg_range(int y, int G, const int* __restrict__ kv_indptr, int B, int Q,
                                              int* __restrict__ meta, bool write_meta, int* scratch) {
    const int tid = threadIdx.x, nthr = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
    int* s_cum = scratch;                 // [B + 1]: the tiles before each request, then T
    int* s_red = scratch + B + 1;         // [32] each warp's tiles, [1] the picked request
    const int per = (B + nthr - 1) / nthr;
    const int r0 = min(tid * per, B), r1 = min(r0 + per, B);
    int mine = 0;                         // the tiles of this thread's requests r0 .. r1 - 1
    #pragma unroll 1
    for (int r = r0; r < r1; ++r) mine += (kv_indptr[r + 1] - kv_indptr[r] + Q + 63) / 64;
    int incl = mine;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    if (lane == 31) s_red[warp] = incl;
    if (tid == 0) s_red[32] = -1;
    __syncthreads();
    int before = 0, T = 0;
    #pragma unroll 1
    for (int w = 0; w < nwarps; ++w) {
        before += w < warp ? s_red[w] : 0;
        T += s_red[w];
    }
    int run = before + incl - mine;
    #pragma unroll 1
    for (int r = r0; r < r1; ++r) {
        s_cum[r] = run;
        run += (kv_indptr[r + 1] - kv_indptr[r] + Q + 63) / 64;
    }
    if (tid == 0) s_cum[B] = T;
    __syncthreads();
    const int g = min(G, T);
    SegRange out;
    out.t0 = (int)((long long)y * T / g);
    out.t1 = (int)((long long)(y + 1) * T / g);
    #pragma unroll 1
    for (int r = tid; r < B; r += nthr) {
        const long long c = s_cum[r], e = s_cum[r + 1];
        if (y < g && c <= out.t0 && out.t0 < e) s_red[32] = r;
        if (write_meta) {
            const int yf = (int)(((c + 1) * g - 1) / T), yl = (int)((e * g - 1) / T);
            meta[2 * r] = yf + r;
            meta[2 * r + 1] = yl - yf + 1;
        }
    }
    __syncthreads();
    out.b = s_red[32];
    out.cum = s_cum[max(out.b, 0)];
    __syncthreads();                      // every thread has read: the caller may reuse the scratch
    return out;
}
