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
