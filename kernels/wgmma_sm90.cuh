// Hopper warpgroup MMA (wgmma, sm_90a only) and the shared-memory descriptors it reads: thin
// wrappers over the PTX, one function per shape used by the verify_attn wgmma kernel.
//
// Layout used throughout: bf16 tiles stored as [rows][64-element (128-byte) column blocks] with the
// 128-byte swizzle (16-byte chunk c of row r stored at chunk c ^ (r & 7); blocks 1024-byte aligned).
//   K-major operand (rows = M or N, contiguous = K): start address advances 32 B per k16 step
//     inside a block; LBO unused (1), SBO = 1024 B (8 rows x 128 B).
//   MN-major operand (rows = K, contiguous = N): LBO = byte stride between 64-wide column blocks,
//     SBO = 1024 B (8 K-rows); start advances 16 rows x 128 B = 2048 B per k16 step.
// (CUTLASS make_gmma_desc's canonical SW128 forms; PTX ISA "matrix descriptor".)
// Accumulator fragment (m64nN, f32): warp w of the warpgroup holds rows 16w..16w+15; lane
// (g = lane / 4, t = lane % 4) holds d[4i + e] = (row 16w + g + 8 (e >> 1), col 8i + 2t + (e & 1)).
// A-from-registers fragment (k16): a[0] = (row g, k 2t..2t+1), a[1] = (row g+8, same k),
// a[2] = (row g, k 2t+8..), a[3] = (row g+8, k 2t+8..), bf16 pairs, low half = lower k.
#pragma once

typedef unsigned long long u64;

// 64-bit shared-memory matrix descriptor, 128-byte swizzle
__device__ __forceinline__ u64 desc_sw128(unsigned saddr, unsigned lbo_bytes, unsigned sbo_bytes) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)((lbo_bytes >> 4) & 0x3FFFu) << 16) |
           ((u64)((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
// generic-proxy shared-memory writes (st.shared, cp.async) made visible to the async proxy (wgmma)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving reads of in-flight accumulators across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// Keeps register A fragments of an in-flight wgmma live (unmodified) until a wait covering it.
__device__ __forceinline__ void keep_alive(const unsigned (&a)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" :: "r"(a[i][j]) : "memory");
}

// Pins register A fragments (written by ordinary instructions) ahead of the next wgmma.fence.
__device__ __forceinline__ void fence_regs(unsigned (&a)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j]) :: "memory");
}

// The accumulator operands of the wrappers below: "+f" constraints on d[0..N) and the matching
// "%0, ..., %N-1" placeholder list (the inputs follow at %N).
#define WG_D4(i) "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define WG_D16(i) WG_D4(i), WG_D4((i) + 4), WG_D4((i) + 8), WG_D4((i) + 12)
#define WG_D32 WG_D16(0), WG_D16(16)
#define WG_D128 WG_D32, WG_D16(32), WG_D16(48), WG_D16(64), WG_D16(80), WG_D16(96), WG_D16(112)
#define WG_P32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_P128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, " \
    "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, " \
    "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, " \
    "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, " \
    "%123, %124, %125, %126, %127"

// D (64 x 64 fp32) (+)= A (smem desc, K-major) * B (smem desc, K-major)
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], u64 da, u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_P32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : WG_D32
        : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 256 fp32) (+)= A (registers, bf16 pairs) * B (smem desc, MN-major)
__device__ __forceinline__ void wgmma_rs_n256_t(float (&d)[128], const u32 (&a)[4], u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_P128 "}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : WG_D128
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// D (64 x 256 fp32) (+)= A (smem desc, K-major) * B (smem desc, MN-major)
__device__ __forceinline__ void wgmma_ss_n256_t(float (&d)[128], u64 da, u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_P128 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : WG_D128
        : "l"(da), "l"(db), "r"(scale_d));
}
