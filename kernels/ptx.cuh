// The inline PTX the attention kernels use, one wrapper per instruction: async copies, bf16
// conversion, the MUFU exp2, ldmatrix / mma.sync, barriers and mbarriers, bulk copies, programmatic
// dependent launch, register budgets, the launch's dynamic shared memory.
//
// KDTREE_PTX_EMULATED leaves them out. The CPU emulator of the tests (tests/kernels/emulator/, which
// compiles a kernel's own source with g++) defines it and supplies host versions of these functions,
// so that a kernel's code runs on the CPU exactly as written everywhere else; no kernel has any other
// branch on it.
#pragma once

typedef unsigned int u32;

#ifndef KDTREE_PTX_EMULATED

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// 16-byte async copy global -> shared; `valid` false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// 4-byte async copy global -> shared (cp.async.ca: 4 bytes is below .cg's 16); `valid` false
// writes 4 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// fp32 -> bf16, round to nearest even; two values packed as (lo in bits 0..15, hi in 16..31)
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// 2^x on the MUFU unit with subnormal results flushed to 0: exp2f without its subnormal-range
// fix-up (two FMULs and a compare), equal to it wherever 2^x >= 2^-126.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// D += A (16x16 bf16, row) * B (16x8 bf16, col), fp32 accumulators
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D (16x8 f64) += A (16x4 f64, row) * B (4x8 f64, col): sm_90's f64 MMA shape (fp32_dmma)
__device__ __forceinline__ void dmma_16x8x4(double (&d)[4], double a0, double a1, double b0) {
    asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a0), "d"(a1), "d"(b0));
}

// Synchronise `count` threads on named barrier `id` (1..15; 0 is __syncthreads)
__device__ __forceinline__ void named_barrier(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

// Named barrier `id` over `count` threads: sync waits for them all, arrive counts this thread in
// and goes on (a producer / consumer hand-off between warpgroups).
__device__ __forceinline__ void bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

// mbarrier (shared memory, CTA scope): arrive has release and try_wait acquire semantics, so a
// hand-off through one orders ordinary shared-memory accesses both ways (and compute-sanitizer
// racecheck tracks it). Phase k of a barrier completes when `count` arrivals have been made; a
// waiter for phase k passes parity k & 1 and must be at most one phase behind.
__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned addr) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "MBAR_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra MBAR_WAIT;\n}\n"
        :: "r"(addr), "r"(parity) : "memory");
}

// After mbarrier.init, before the async proxy (bulk copies) may signal the barriers.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// bulk-copy engine; the calling thread arrives on mbarrier `mbar` (count 1) expecting them, and the
// barrier's phase completes once they have landed.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned mbar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(mbar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}

// Programmatic dependent launch (sm_90+; no-ops before, and in a grid launched without the host's
// programmatic-serialization attribute). grid_dep_wait: block until the grid before this one in the
// stream has completed and its writes are visible; every global access of a grid launched with the
// attribute must follow it. grid_dep_launch: let the next grid (if launched with the attribute) be
// scheduled once every block of this one has called it or exited; it never waives the wait.
__device__ __forceinline__ void grid_dep_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Warpgroup register budgets (sm_90a / sm_100a): every warp of the warpgroup executes the same one;
// inc waits until other warpgroups' dec have freed the registers.
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N) : "memory");
}

// Bytes of dynamic shared memory this launch got: a kernel whose layout is sized by compile-time
// knobs traps when the host gave it less, instead of corrupting memory.
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

#endif  // KDTREE_PTX_EMULATED
