// Session 6 probe (sm_90a): which units run beside the tensor cores when the other work comes from
// OTHER warps. A block (one per SM) has NM "MMA" warps and NC "conversion" warps.
//   WG = 0: the MMA warps issue mma.sync m16n8k16 bf16 (8 independent accumulators a round);
//   WG = 1: they form NM / 4 warpgroups issuing wgmma m64n64k16 bf16 from shared memory (8 a round,
//           one accumulator, then commit and wait).
//   CK = 0: the conversion warps issue F2FP (cvt.rn.bf16x2.f32), 16 a round; CK = 1: FFMA, 16 a round;
//   CK = 2 (call 10): the integer split's instructions, IADD3 / LOP3 / PRMT, 16 a round.
#include "../../attn_common.cuh"
#include "../../wgmma_sm90.cuh"
#ifndef WG
#define WG 0
#endif
#ifndef CK
#define CK 0
#endif
extern "C" __global__ void wgprobe(const float* __restrict__ in, float* __restrict__ out, int nm, int mma_iters,
                                   int cv_iters) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) ((float*)smem)[i] = in[i] * 1e-3f;
    __syncthreads();
    float s = 0.f;
    if (warp < nm) {
#if WG
        float d[32] = {};
        const u64 da = desc_sw128(smem_addr(smem), 16, 1024), db = desc_sw128(smem_addr(smem + 8192), 16, 1024);
        for (int it = 0; it < mma_iters; ++it) {
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < 8; ++k) wgmma_ss_n64(d, da, db, 1);
            wgmma_commit();
            wgmma_wait<0>();
            fence_operands(d);
        }
        for (int i = 0; i < 32; ++i) s += d[i];
#else
        u32 a[4], b0 = __float_as_uint(in[lane + 64]) & 0x3fff3fffu, b1 = __float_as_uint(in[lane + 96]) & 0x3fff3fffu;
        for (int i = 0; i < 4; ++i) a[i] = __float_as_uint(in[lane + 32 * i]) & 0x3fff3fffu;
        float acc[8][4] = {};
        for (int it = 0; it < mma_iters; ++it) {
#pragma unroll
            for (int j = 0; j < 8; ++j) mma_bf16_16816(acc[j], a, b0, b1);
        }
        for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
#endif
    } else {
        float x = in[lane], y = in[lane + 32];
        u32 cv[4] = {0, 0, 0, 0};
        float fv[4] = {x, y, x, y};
        for (int it = 0; it < cv_iters; ++it) {
#pragma unroll
            for (int c = 0; c < 16; ++c) {
#if CK == 0
                cv[c & 3] ^= pack_bf16x2(x + (float)c, y);
#elif CK == 2
                if (c % 3 == 0) cv[c & 3] += (u32)c + (u32)it;
                else if (c % 3 == 1) cv[c & 3] = (cv[c & 3] ^ (u32)it) & 0xffff0000u;
                else cv[c & 3] = __byte_perm(cv[c & 3], (u32)it, 0x7632);
#else
                fv[c & 3] = fmaf(fv[c & 3], x, y);
#endif
            }
            x += 1.f;
        }
        s = __uint_as_float(cv[0] ^ cv[1] ^ cv[2] ^ cv[3]) * 0.f + (fv[0] + fv[1] + fv[2] + fv[3]) * 0.f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
