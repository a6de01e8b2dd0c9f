// Dependent-latency probes for one warp (kernels/NOTES.md, tree_build): each entry runs N dependent
// steps of one operation and writes clock64() cycles / N to out[slot]. Inputs come from the host so
// nothing folds; results are written so nothing is dead.
typedef unsigned long long u64;
#define N 1024
__device__ __forceinline__ long long now() { long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }

extern "C" __global__ void probe(const double* din, const int* iin, double* dout, int* iout, float* cyc) {
    const int lane = threadIdx.x;
    double x = din[0], y = din[1], z = din[2];
    int a = iin[0], b = iin[1], c = iin[2];
    long long t0, t1;
    // 0: DADD chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) x = x + y;
    t1 = now(); if (lane == 0) cyc[0] = (float)(t1 - t0) / N;
    // 1: DSETP -> FSEL (double select) chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) z = (z > y) ? x : z - 0.0;
    t1 = now(); if (lane == 0) cyc[1] = (float)(t1 - t0) / N;
    // 2: ISETP -> SEL chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) a = (a > b) ? c : a ^ 1;
    t1 = now(); if (lane == 0) cyc[2] = (float)(t1 - t0) / N;
    // 3: SHFL.IDX chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) b = __shfl_sync(0xffffffffu, b, (lane + 1) & 31);
    t1 = now(); if (lane == 0) cyc[3] = (float)(t1 - t0) / N;
    // 4: IADD chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) c = c + a;
    t1 = now(); if (lane == 0) cyc[4] = (float)(t1 - t0) / N;
    // 5: VOTE.ANY -> SEL chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) a = __any_sync(0xffffffffu, a > c) ? a + 1 : a - 3;
    t1 = now(); if (lane == 0) cyc[5] = (float)(t1 - t0) / N;
    // 6: LDS pointer chase
    __shared__ int ring[64];
    ring[lane] = (lane + 1) & 31; ring[lane + 32] = 0;
    __syncwarp();
    int p = iin[3] & 31;
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) p = ring[p];
    t1 = now(); if (lane == 0) cyc[6] = (float)(t1 - t0) / N;
    // 7: u64 compare -> select chain (ISETP pair)
    u64 k = (u64)iin[4] << 20, m = (u64)iin[5] << 21;
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) k = (k > m) ? k - 1 : k + 5;
    t1 = now(); if (lane == 0) cyc[7] = (float)(t1 - t0) / N;
    // 8: DSETP -> branch-free predicate + VOTE (the tie test shape)
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) { bool t = (y == x); x = __any_sync(0xffffffffu, t) ? x + z : x - z; }
    t1 = now(); if (lane == 0) cyc[8] = (float)(t1 - t0) / N;
    // 9: DFMA-free DADD two-level (sibling formula) (s - a) + b chain
    t0 = now();
#pragma unroll 16
    for (int i = 0; i < N; ++i) y = (y - z) + x;
    t1 = now(); if (lane == 0) cyc[9] = (float)(t1 - t0) / N;
    dout[lane] = x + y + z;
    iout[lane] = a + b + c + p + (int)k;
}
