// Throughput probe: FP64 tensor-core MMA (mma.sync .f64) against FP32 FFMA on one launch shape.
// Launch: grid = blocks, block = 32*WARPS threads; each warp runs ITERS rounds of NACC independent
// MMAs (or FFMA chains) on register operands; `out` receives one value per thread so nothing is
// dead code. SHAPE: 0 m8n8k4, 1 m16n8k4, 2 m16n8k8, 3 m16n8k16, 9 FFMA (8 chains per lane, 4x unrolled).
// SMEMOP=1: the A/B fragments are re-read from shared memory (LDS.64) before every MMA group.
#ifndef SHAPE
#define SHAPE 0
#endif
#ifndef NACC
#define NACC 4
#endif
#ifndef SMEMOP
#define SMEMOP 0
#endif
extern "C" __global__ void probe(const double* __restrict__ in, double* __restrict__ out, int iters) {
    __shared__ double tile[4096];
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) tile[i] = in[i & 255] * 0.5;
    __syncthreads();
    const int lane = threadIdx.x & 31;
#if SHAPE == 9
    float a = (float)in[lane], b = (float)in[lane + 32];
    float acc[8];
    #pragma unroll
    for (int c = 0; c < 8; ++c) acc[c] = (float)c;
    for (int it = 0; it < iters; ++it) {
        #pragma unroll
        for (int u = 0; u < 16; ++u) {
            #pragma unroll
            for (int c = 0; c < 8; ++c) acc[c] = fmaf(acc[c], a, b);
        }
    }
    float s = 0.f;
    #pragma unroll
    for (int c = 0; c < 8; ++c) s += acc[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
#else
#if SHAPE == 0
    constexpr int NA = 1, NB = 1, NC = 2;
#elif SHAPE == 1
    constexpr int NA = 2, NB = 1, NC = 4;
#elif SHAPE == 2
    constexpr int NA = 4, NB = 2, NC = 4;
#else
    constexpr int NA = 8, NB = 4, NC = 4;
#endif
    double a[NA], b[NB], c[NACC][NC];
    #pragma unroll
    for (int i = 0; i < NA; ++i) a[i] = tile[lane * NA + i];
    #pragma unroll
    for (int i = 0; i < NB; ++i) b[i] = tile[1024 + lane * NB + i];
    #pragma unroll
    for (int q = 0; q < NACC; ++q)
        #pragma unroll
        for (int i = 0; i < NC; ++i) c[q][i] = 0.0;
    for (int it = 0; it < iters; ++it) {
#if SMEMOP
        const int off = (it & 7) * 128;
        #pragma unroll
        for (int i = 0; i < NA; ++i) a[i] = tile[off + lane * NA + i];
        #pragma unroll
        for (int i = 0; i < NB; ++i) b[i] = tile[2048 + off + lane * NB + i];
#endif
        #pragma unroll
        for (int q = 0; q < NACC; ++q) {
#if SHAPE == 0
            asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                         : "+d"(c[q][0]), "+d"(c[q][1]) : "d"(a[0]), "d"(b[0]));
#elif SHAPE == 1
            asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                         : "+d"(c[q][0]), "+d"(c[q][1]), "+d"(c[q][2]), "+d"(c[q][3]) : "d"(a[0]), "d"(a[1]), "d"(b[0]));
#elif SHAPE == 2
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+d"(c[q][0]), "+d"(c[q][1]), "+d"(c[q][2]), "+d"(c[q][3])
                         : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};"
                         : "+d"(c[q][0]), "+d"(c[q][1]), "+d"(c[q][2]), "+d"(c[q][3])
                         : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
                           "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#endif
        }
    }
    double s = 0.0;
    #pragma unroll
    for (int q = 0; q < NACC; ++q)
        #pragma unroll
        for (int i = 0; i < NC; ++i) s += c[q][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
#endif
}
