// Probe: fp32_dmma's S-warp loop in isolation. grid = 132 blocks (one per SM), block = 32*WARPS; each
// warp runs ITERS sub-tiles of 9 dim groups x 4 k-steps x 5 n tiles of mma.m16n8k4.f64 on operands
// in shared memory (all warps read the same 144 dims). CVT: 1 fp32 operands + F2F (the kernel),
// 0 fp64 operands (no conversion, twice the loads), 2 operands loaded once (registers only: the MMA
// chains alone). ACC2: two accumulator sets (k-steps 0-1 / 2-3 of each group). `out` gets one value per thread.
#ifndef CVT
#define CVT 1
#endif
#ifndef ACC2
#define ACC2 0
#endif
#define NT 5
__device__ __forceinline__ void dmma(double (&d)[4], double a0, double a1, double b0) {
    asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a0), "d"(a1), "d"(b0));
}
__device__ __forceinline__ float at4(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
extern "C" __global__ void probe(const float* __restrict__ in, double* __restrict__ out, int iters) {
    extern __shared__ __align__(16) unsigned char sm[];
    float* q32 = (float*)sm;                 // [40][144]
    float* k32 = q32 + 40 * 144;             // [16][144]
    double* q64 = (double*)(k32 + 16 * 144); // [40][144]
    double* k64 = q64 + 40 * 144;            // [16][144]
    for (int i = threadIdx.x; i < 56 * 144; i += blockDim.x) {
        const float v = in[i % 4096];
        if (i < 40 * 144) { q32[i] = v; q64[i] = v; } else { k32[i - 40 * 144] = v; k64[i - 40 * 144] = v; }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    double acc[ACC2 + 1][NT][4];
    for (int h = 0; h <= ACC2; ++h)
        for (int n = 0; n < NT; ++n) acc[h][n][0] = acc[h][n][1] = acc[h][n][2] = acc[h][n][3] = 0.0;
#if CVT == 2
    double a0r[4], a1r[4], br[NT][4];
    for (int u = 0; u < 4; ++u) {
        a0r[u] = k64[g * 144 + 4 * t + u]; a1r[u] = k64[(g + 8) * 144 + 4 * t + u];
        for (int n = 0; n < NT; ++n) br[n][u] = q64[(8 * n + g) * 144 + 4 * t + u];
    }
#endif
    for (int it = 0; it < iters; ++it) {
#pragma unroll 3
        for (int jg = 0; jg < 9; ++jg) {
            const int off = 16 * jg + 4 * t;
#if CVT == 1
            const float4 ka = *(const float4*)(k32 + g * 144 + off), kb = *(const float4*)(k32 + (g + 8) * 144 + off);
            float4 qv[NT];
#pragma unroll
            for (int n = 0; n < NT; ++n) qv[n] = *(const float4*)(q32 + (8 * n + g) * 144 + off);
#elif CVT == 0
            double2 ka[2], kb[2], qv[NT][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                ka[h] = *(const double2*)(k64 + g * 144 + off + 2 * h);
                kb[h] = *(const double2*)(k64 + (g + 8) * 144 + off + 2 * h);
#pragma unroll
                for (int n = 0; n < NT; ++n) qv[n][h] = *(const double2*)(q64 + (8 * n + g) * 144 + off + 2 * h);
            }
#endif
#pragma unroll
            for (int u = 0; u < 4; ++u) {
#if CVT == 1
                const double a0 = (double)at4(ka, u), a1 = (double)at4(kb, u);
#elif CVT == 0
                const double a0 = (u & 1) ? ka[u >> 1].y : ka[u >> 1].x, a1 = (u & 1) ? kb[u >> 1].y : kb[u >> 1].x;
#else
                const double a0 = a0r[u], a1 = a1r[u];
#endif
#pragma unroll
                for (int n = 0; n < NT; ++n) {
#if CVT == 1
                    const double b = (double)at4(qv[n], u);
#elif CVT == 0
                    const double b = (u & 1) ? qv[n][u >> 1].y : qv[n][u >> 1].x;
#else
                    const double b = br[n][u];
#endif
                    dmma(acc[ACC2 ? u >> 1 : 0][n], a0, a1, b);
                }
            }
        }
    }
    double s = 0.0;
    for (int h = 0; h <= ACC2; ++h)
        for (int n = 0; n < NT; ++n) s += acc[h][n][0] + acc[h][n][1] + acc[h][n][2] + acc[h][n][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
