// Shared pieces of the verify_attn kernels: sizes, cp.async / ldmatrix / mma wrappers, bf16
// conversion, and the split-KV merge (partials -> normalised output + lse).
//
// Split-KV partials (both variants): for split z and global row r (request-major (token, head)
// rows, the same order as `out`):
//   ws_o[z][r][0..512)  unnormalised sum of exp(s - m) * v in fp32
//   ws_m[z][r]          the running max m in natural-log units (-inf when the split saw no key)
//   ws_l[z][r]          sum of exp(s - m)
// merge: M = max_z m_z; w_z = exp(m_z - M) (0 for an empty split); out = sum w_z o_z / sum w_z l_z;
// lse = M + log(sum w_z l_z).
#pragma once

#define ATTN_D 576          // latent row: c_kv (512) then k_pe (64)
#define ATTN_DV 512         // value width
#define MERGE_THREADS 128   // merge: one block per row, 4 columns per thread

typedef unsigned char u8;
typedef unsigned short u16;

#include "ptx.cuh"          // u32 and the inline-PTX wrappers

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Declares `chunk`, `kbeg`, `kend` of split z of a request's kvlen keys: chunk = ceil(kvlen / n_splits)
// rounded up to `round` keys; the split has keys [kbeg, kend) = [min(z chunk, kvlen), min(kbeg + chunk,
// kvlen)) (empty past the end). Serves the fp32 kernels dmma, bf16x3 and ffma99. A macro, not a function:
// spelled out in place it compiles to the SASS those kernels were verified with (a function returning
// kbeg and kend changed ptxas's allocation).
#define ATTN_KEY_SPLIT(kvlen, n_splits, z, round)                                                       \
    const int chunk = (((kvlen) + (n_splits) - 1) / (n_splits) + (round) - 1) / (round) * (round);     \
    const int kbeg = min((z) * chunk, (kvlen));                                                         \
    const int kend = min(kbeg + chunk, (kvlen));

// The bf16_paged kernels' parameters, in the order of the host's launch (kernel_operands, then
// kernel_tail, then the outputs and the split workspace); each kernel's header gives their shapes.
#define ATTN_BF16_PAGED_PARAMS                                                                          \
    const u16* __restrict__ q, const u16* __restrict__ kv_buffer, const int* __restrict__ kv_indptr,   \
    const int* __restrict__ kv_indices, const int* __restrict__ tree_slots,                            \
    const u8* __restrict__ custom_mask, const int* __restrict__ mask_indptr, int B, int Q, int H,      \
    float sm_scale_log2, int n_splits, u16* __restrict__ out, float* __restrict__ lse,                \
    float* __restrict__ ws_o, float* __restrict__ ws_m, float* __restrict__ ws_l

// Declares what a bf16_paged block (row tile blockIdx.x of `rows` rows, request b = blockIdx.y, split
// z = blockIdx.z) knows of its request: its rows, and its keys (P prefix keys, then the Q tree keys).
#define ATTN_PAGED_REQUEST(rows)                                                                        \
    const int b = blockIdx.y, z = blockIdx.z;                                                           \
    const int rows_req = Q * H;                                                                         \
    const int row0 = blockIdx.x * (rows);                                                               \
    const int nrows = min((rows), rows_req - row0);                                                     \
    const int ibase = kv_indptr[b];                                                                     \
    const int P = kv_indptr[b + 1] - ibase;                                                             \
    const int kvlen = P + Q;

// The fp32 (contiguous layout) kernels' parameters that read q and kv directly (fp32_dmma,
// fp32_ffma99), in the host's launch order; each kernel's header gives their shapes.
#define ATTN_DENSE_PARAMS                                                                               \
    const float* __restrict__ q, const float* __restrict__ kv, const int* __restrict__ prefix_len,      \
    const u8* __restrict__ visibility, int B, int Q, int H, int S, float sm_scale, int n_splits,        \
    float* __restrict__ out, float* __restrict__ lse, float* __restrict__ ws_o,                         \
    float* __restrict__ ws_m, float* __restrict__ ws_l

// The same for an fp32 (contiguous layout) block: its request's P = prefix_len[b] prefix keys,
// then the Q tree keys; and `chunk`, `kbeg`, `kend` of its split (ATTN_KEY_SPLIT, keys a tile).
#define ATTN_DENSE_REQUEST(rows, keys)                                                                  \
    const int b = blockIdx.y, z = blockIdx.z;                                                           \
    const int rows_req = Q * H;                                                                         \
    const int row0 = blockIdx.x * (rows);                                                               \
    const int nrows = min((rows), rows_req - row0);                                                     \
    const int P = prefix_len[b];                                                                        \
    const int kvlen = P + Q;                                                                            \
    ATTN_KEY_SPLIT(kvlen, n_splits, z, keys)

// a / b correctly rounded, given inv = __frcp_rn(b): q = a·inv, then one Newton correction with the
// exact residual a - q·b (Markstein's theorem: RN(q + (a - q·b)·inv) = RN(a / b) for normal a, b
// and a normal quotient). Three FP ops instead of IEEE division's sequence and its slow-path branch,
// with the same bits for the kernels' quotients (O / l with l >= 1).
__device__ __forceinline__ float div_rn_by(float a, float b, float inv) {
    const float q = __fmul_rn(a, inv);
    return fmaf(fmaf(-q, b, a), inv, q);
}
__device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// P.V for 4 keys on FFMA: o[r][c] += p[r][j] * v4[j].c for j = 0..3 in order (one fmaf chain per
// output), rows r < n_rows; row r's 4 weights are the float4 at p + r * p_stride + at (a broadcast
// when every lane of the warp holds the same rows). Serves fp32_dmma's O
// warps. A macro, not a function: spelled out in place it compiles to the very SASS the kernel
// was verified and timed with (an inline function changed ptxas's register allocation).
#define ATTN_PV_4KEYS(o, v4, p, p_stride, at, n_rows)                                                  \
    _Pragma("unroll") for (int pv_r = 0; pv_r < (n_rows); ++pv_r) {                                   \
        const float4 pv_p = *(const float4*)((p) + pv_r * (p_stride) + (at));                         \
        const float pv_pj[4] = {pv_p.x, pv_p.y, pv_p.z, pv_p.w};                                      \
        _Pragma("unroll") for (int pv_j = 0; pv_j < 4; ++pv_j) {                                      \
            o[pv_r][0] = fmaf(pv_pj[pv_j], v4[pv_j].x, o[pv_r][0]);                                   \
            o[pv_r][1] = fmaf(pv_pj[pv_j], v4[pv_j].y, o[pv_r][1]);                                   \
            o[pv_r][2] = fmaf(pv_pj[pv_j], v4[pv_j].z, o[pv_r][2]);                                   \
            o[pv_r][3] = fmaf(pv_pj[pv_j], v4[pv_j].w, o[pv_r][3]);                                   \
        }                                                                                              \
    }

// The end of a split-KV merge: out = acc / l (4 columns of `row`), lse = M + ln l (thread 0).
template <typename Store>
__device__ __forceinline__ void merge_finish(int row, int col, const float (&acc)[4], float l, float M,
                                             float* __restrict__ lse, Store store) {
    store((size_t)row * ATTN_DV + col, acc[0] / l, acc[1] / l, acc[2] / l, acc[3] / l);
    if (threadIdx.x == 0) lse[row] = M + logf(l);
}

// merge_row's loop over one batch of N splits z0 .. z0 + N - 1 whose o rows (4 columns) are already
// loaded into oz and whose m and l are in shared memory: the same arithmetic in the same order
// (ascending z; past n_splits, or an empty split, m = -inf: skipped, its oz never read).
template <int N>
__device__ __forceinline__ void merge_batch(const float4 (&oz)[N], const float* s_m, const float* s_l, int z0,
                                            int n_splits, float M, float& l, float (&acc)[4]) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int zz = z0 + k;
        if (zz >= n_splits || s_m[zz] == neg_inf()) continue;
        const float w = expf(s_m[zz] - M);
        l += w * s_l[zz];
        acc[0] += w * oz[k].x; acc[1] += w * oz[k].y; acc[2] += w * oz[k].z; acc[3] += w * oz[k].w;
    }
}

// Row `row` of split-KV partials laid out [split][rows] (ws_m, ws_l; ws_o with ATTN_DV columns a row),
// stored to row `row` of out / lse.
template <typename Store>
__device__ __forceinline__ void merge_row(const float* __restrict__ ws_o, const float* __restrict__ ws_m,
                                          const float* __restrict__ ws_l, int n_splits, int rows, int row,
                                          float* __restrict__ lse, Store store) {
    if (row >= rows) return;
    float M = neg_inf();
    for (int z = 0; z < n_splits; ++z) M = fmaxf(M, ws_m[(size_t)z * rows + row]);
    float l = 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int col = threadIdx.x * 4;
    for (int z = 0; z < n_splits; ++z) {
        const float m = ws_m[(size_t)z * rows + row];
        if (m == neg_inf()) continue;                       // an empty split: weight 0, never read
        const float w = expf(m - M);
        l += w * ws_l[(size_t)z * rows + row];
        const float4 o = *(const float4*)(ws_o + ((size_t)z * rows + row) * ATTN_DV + col);
        acc[0] += w * o.x; acc[1] += w * o.y; acc[2] += w * o.z; acc[3] += w * o.w;
    }
    merge_finish(row, col, acc, l, M, lse, store);
}

// Stores of merge_row's normalised output, 4 values per call: fp32, or bf16 (round to nearest even).
struct StoreF32 {
    float* out;
    __device__ void operator()(size_t at, float a, float b, float c, float d) const {
        *(float4*)(out + at) = make_float4(a, b, c, d);
    }
};
struct StoreBF16 {
    u16* out;
    __device__ void operator()(size_t at, float a, float b, float c, float d) const {
        *(uint2*)(out + at) = make_uint2(pack_bf16x2(a, b), pack_bf16x2(c, d));
    }
};

// merge_row's arithmetic in its order (ascending z, empty splits skipped), with the loads of MAXZ
// splits in flight at once: every m and l first (one round trip, through shared memory), then the o
// rows in batches of MAXZ (ceil(n_splits / MAXZ) round trips). More than 256 splits: merge_row.
// A block that merges another row after this one must __syncthreads first (s_m, s_l are reused).
template <int MAXZ, typename Store>
__device__ __forceinline__ void merge_row_batched(const float* __restrict__ ws_o, const float* __restrict__ ws_m,
                                                  const float* __restrict__ ws_l, int n_splits, int rows, int row,
                                                  float* __restrict__ lse, Store store) {
    __shared__ float s_m[256], s_l[256];
    if (row >= rows) return;
    if (n_splits > 256) {
        merge_row(ws_o, ws_m, ws_l, n_splits, rows, row, lse, store);
        return;
    }
    for (int z = threadIdx.x; z < n_splits; z += MERGE_THREADS) {
        s_m[z] = ws_m[(size_t)z * rows + row];
        s_l[z] = ws_l[(size_t)z * rows + row];
    }
    __syncthreads();
    float M = neg_inf();
    for (int z = 0; z < n_splits; ++z) M = fmaxf(M, s_m[z]);
    const int col = threadIdx.x * 4;
    float l = 0.f;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int z0 = 0; z0 < n_splits; z0 += MAXZ) {
        float4 oz[MAXZ];
#pragma unroll
        for (int k = 0; k < MAXZ; ++k) {
            const int zz = z0 + k;
            const bool ok = zz < n_splits && s_m[zz] != neg_inf();      // the split saw a key
            oz[k] = ok ? *(const float4*)(ws_o + ((size_t)zz * rows + row) * ATTN_DV + col)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        merge_batch(oz, s_m, s_l, z0, n_splits, M, l, acc);
    }
    merge_finish(row, col, acc, l, M, lse, store);
}

// A kernel's split-KV merge entry: grid = B*Q*H rows, block = MERGE_THREADS (128); the loads of
// ATTN_MERGE_MAXZ splits in flight at once (merge_row_batched, above), not one split's at a time
// (kernels/NOTES.md, "Where the serving shapes go"). Knob ATTN_MERGE_MAXZ (1: one load in flight)
// for an A/B; no value changes a bit.
#ifndef ATTN_MERGE_MAXZ
#define ATTN_MERGE_MAXZ 8
#endif
#define ATTN_MERGE_ENTRY(name, out_t, Store)                                                         \
    extern "C" __global__ void __launch_bounds__(MERGE_THREADS)                                       \
    name(const float* __restrict__ ws_o, const float* __restrict__ ws_m,                               \
         const float* __restrict__ ws_l, int n_splits, int rows, out_t* __restrict__ out,              \
         float* __restrict__ lse) {                                                                    \
        merge_row_batched<ATTN_MERGE_MAXZ>(ws_o, ws_m, ws_l, n_splits, rows, blockIdx.x, lse, Store{out}); \
    }

// A batched split-KV merge entry that may be launched as a programmatic dependent of its main
// kernel (it waits for that grid first): grid = B*Q*H rows, block = MERGE_THREADS (128), MAXZ
// splits' loads in flight, out_t / Store the output's type and its store.
#define ATTN_MERGE_DEPENDENT_ENTRY(name, maxz, out_t, Store)                                         \
    extern "C" __global__ void __launch_bounds__(MERGE_THREADS)                                       \
    name(const float* __restrict__ ws_o, const float* __restrict__ ws_m,                               \
         const float* __restrict__ ws_l, int n_splits, int rows, out_t* __restrict__ out,              \
         float* __restrict__ lse) {                                                                    \
        grid_dep_wait();                                                                               \
        grid_dep_launch();                                                                             \
        merge_row_batched<maxz>(ws_o, ws_m, ws_l, n_splits, rows, blockIdx.x, lse, Store{out});        \
    }
// The fp32 kernels' (fp32 output).
#define ATTN_MERGE_BATCHED_ENTRY(name, maxz) ATTN_MERGE_DEPENDENT_ENTRY(name, maxz, float, StoreF32)
