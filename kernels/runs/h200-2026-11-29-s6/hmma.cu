// Session 6 probe: mma.sync m16n8k16 bf16 (HMMA.16816) throughput per SM on the H200, alone and
// with other instructions issued beside it by the same warps. W warps a block (one block per SM),
// each `iters` rounds of NACC independent MMAs (operands in registers) plus CV instructions of kind
// OPK: 0 F2FP (cvt.rn.bf16x2.f32), 1 FFMA, 2 IADD+LOP pairs (counted as 2), 3 PRMT, 4 LDS.128,
// 5 ldmatrix.x4.
#include "../../attn_common.cuh"
#ifndef NACC
#define NACC 8
#endif
#ifndef CV
#define CV 0
#endif
#ifndef OPK
#define OPK 0
#endif
extern "C" __global__ void hmma(const float* __restrict__ in, float* __restrict__ out, int iters) {
    __shared__ __align__(16) float sm[4096];
    const int lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) sm[i] = in[i];
    __syncthreads();
    u32 a[4], b0 = __float_as_uint(in[lane + 64]), b1 = __float_as_uint(in[lane + 96]);
    for (int i = 0; i < 4; ++i) a[i] = __float_as_uint(in[lane + 32 * i]) & 0x3fff3fffu;
    b0 &= 0x3fff3fffu; b1 &= 0x3fff3fffu;
    float acc[NACC > 0 ? NACC : 1][4] = {};
    float x = in[lane], y = in[lane + 32];
    u32 cv[4] = {0, 0, 0, 0};
    float fv[4] = {x, y, x, y};
    int off = (threadIdx.x * 16) & 4095;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) mma_bf16_16816(acc[j], a, b0, b1);
#pragma unroll
        for (int c = 0; c < CV; ++c) {
#if OPK == 0
            cv[c & 3] ^= pack_bf16x2(x + (float)c, y);
#elif OPK == 1
            fv[c & 3] = fmaf(fv[c & 3], x, y);
#elif OPK == 2
            if (c & 1) cv[c & 3] = (cv[c & 3] + 0x8000u) & (u32)it; else cv[c & 3] += (u32)c;
#elif OPK == 3
            cv[c & 3] = __byte_perm(cv[c & 3], (u32)it, 0x7632 + c);
#elif OPK == 4
            { const float4 v = *(const float4*)(sm + ((off + 64 * c) & 4095)); fv[c & 3] += v.x + v.w; }
#else
            { u32 r[4]; ldmatrix_x4(r, sm + ((off + 64 * c) & 4095)); cv[c & 3] ^= r[0] ^ r[3]; }
#endif
        }
        x += 1.f;
        off = (off + 128) & 4095;
    }
    float s = __uint_as_float(cv[0] ^ cv[1] ^ cv[2] ^ cv[3]) * 0.f + (fv[0] + fv[1] + fv[2] + fv[3]) * 0.f;
    for (int j = 0; j < NACC; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
