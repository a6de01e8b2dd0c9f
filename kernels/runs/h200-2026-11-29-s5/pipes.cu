// Probe: do FP64 tensor-core MMAs (fp32_dmma's S-warp loop, CVT=1 of dmma_cvt.cu) and FFMA chains (the
// O warps' unit) run at once on an SM? grid = 132 blocks, block = 32 * (DW + FW): warps < DW run the
// DMMA loop (`iters` sub-tiles), the other FW warps run 64 independent fmaf chains per lane for
// `fiters` rounds from registers. Timed alone (DW or FW = 0) and together. CVT (call 4): 1 the DMMA
// operands are fp32 in shared memory converted with F2F (call 3), 0 fp64 in shared memory (no
// conversion), 2 registers only (the MMAs alone), 3 the loads and F2F conversions without the MMAs
// (kept live by integer XORs).
#ifndef DW
#define DW 4
#endif
#ifndef FW
#define FW 8
#endif
#ifndef CVT
#define CVT 1
#endif
#define NT 5
__device__ __forceinline__ void dmma(double (&d)[4], double a0, double a1, double b0) {
    asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a0), "d"(a1), "d"(b0));
}
__device__ __forceinline__ float at4(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
extern "C" __global__ void pipes(const float* __restrict__ in, double* __restrict__ out, int iters, int fiters) {
#if CVT == 0   // fp64 operands: 64 dims (groups jg & 3), row stride 66 doubles (conflict-free LDS.128)
    __shared__ __align__(16) double q64[40 * 66], k64[16 * 66];
    for (int i = threadIdx.x; i < 56 * 66; i += blockDim.x) {
        const double v = in[i % 4096];
        if (i < 40 * 66) q64[i] = v; else k64[i - 40 * 66] = v;
    }
#else
    __shared__ __align__(16) float q32[40 * 144], k32[16 * 144];
    for (int i = threadIdx.x; i < 56 * 144; i += blockDim.x) {
        const float v = in[i % 4096];
        if (i < 40 * 144) q32[i] = v; else k32[i - 40 * 144] = v;
    }
#endif
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double s = 0.0;
    if (warp < DW) {
        const int g = lane >> 2, t = lane & 3;
        double acc[NT][4];
        for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0;
#if CVT == 2
        const float* k32r = k32; const float* q32r = q32;
        double a0r[4], a1r[4], br[NT][4];
        for (int u = 0; u < 4; ++u) {
            a0r[u] = k32[g * 144 + 4 * t + u]; a1r[u] = k32[(g + 8) * 144 + 4 * t + u];
            for (int n = 0; n < NT; ++n) br[n][u] = q32[(8 * n + g) * 144 + 4 * t + u];
        }
#endif
        unsigned long long xr[NT] = {};
        for (int it = 0; it < iters; ++it) {
#pragma unroll 3
            for (int jg = 0; jg < 9; ++jg) {
                const int off = 16 * jg + 4 * t;
#if CVT == 1 || CVT == 3
                const float4 ka = *(const float4*)(k32 + g * 144 + off), kb = *(const float4*)(k32 + (g + 8) * 144 + off);
                float4 qv[NT];
#pragma unroll
                for (int n = 0; n < NT; ++n) qv[n] = *(const float4*)(q32 + (8 * n + g) * 144 + off);
#elif CVT == 0
                const int o64 = 16 * (jg & 3) + 4 * t;
                double2 ka[2], kb[2], qv[NT][2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    ka[h] = *(const double2*)(k64 + g * 66 + o64 + 2 * h);
                    kb[h] = *(const double2*)(k64 + (g + 8) * 66 + o64 + 2 * h);
#pragma unroll
                    for (int n = 0; n < NT; ++n) qv[n][h] = *(const double2*)(q64 + (8 * n + g) * 66 + o64 + 2 * h);
                }
#endif
#pragma unroll
                for (int u = 0; u < 4; ++u) {
#if CVT == 1 || CVT == 3
                    const double a0 = (double)at4(ka, u), a1 = (double)at4(kb, u);
#elif CVT == 0
                    const double a0 = (u & 1) ? ka[u >> 1].y : ka[u >> 1].x, a1 = (u & 1) ? kb[u >> 1].y : kb[u >> 1].x;
#else
                    const double a0 = a0r[u], a1 = a1r[u];
#endif
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
#if CVT == 1 || CVT == 3
                        const double b = (double)at4(qv[n], u);
#elif CVT == 0
                        const double b = (u & 1) ? qv[n][u >> 1].y : qv[n][u >> 1].x;
#else
                        const double b = br[n][u];
#endif
#if CVT == 3
                        // the conversions kept live through integer XORs (ALU pipe), no MMA, no fp64 math
                        xr[n] ^= __double_as_longlong(b) ^ __double_as_longlong(a0) ^ __double_as_longlong(a1);
#else
                        dmma(acc[n], a0, a1, b);
#endif
                    }
                }
            }
        }
        for (int n = 0; n < NT; ++n) s += acc[n][0] + acc[n][1] + acc[n][2] + acc[n][3] + (double)(xr[n] & 1);
    } else {
        const float a = in[lane], b = in[lane + 32];
        float acc[64];
#pragma unroll
        for (int c = 0; c < 64; ++c) acc[c] = in[c];
        for (int it = 0; it < fiters; ++it) {
#pragma unroll
            for (int c = 0; c < 64; ++c) acc[c] = fmaf(acc[c], a, b);
        }
#pragma unroll
        for (int c = 0; c < 64; ++c) s += acc[c];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
