// CUDA on the CPU, for the tests: enough of the CUDA C++ dialect and of kernels/ptx.cuh's wrappers
// that a kernel's own source compiles with g++ and runs, one block at a time, each CUDA thread a
// fiber of one OS thread. Included before the kernel (g++ -include); the Python side
// (tests/kernels/emulator/__init__.py) turns `__shared__` into `static` and builds the library.
// A fiber starts with makecontext and switches with _setjmp/_longjmp, which leave the signal mask
// alone: swapcontext's two sigprocmask calls a switch were two thirds of test_emulated_kernels.py's
// time (187 s, now 58 s).
//
// What it models, adversarially where the hardware leaves room:
// - __syncthreads, __syncwarp, named barriers (bar.sync id, count) and shuffles as real barriers:
//   a fiber runs until it waits; the scheduler runs the others in the order the launch asks
//   (ascending, descending, or a seeded shuffle), so a kernel whose result depends on the order of
//   threads between two barriers (a race) gives different bits under different orders. A round in
//   which no fiber makes progress is a deadlock and fails the launch.
// - cp.async: a copy lands only when its thread waits for its group (the latest the hardware may
//   deliver it), so a missing wait reads the poison left in shared memory; or, in the launch's
//   early mode, as it is issued (the earliest), so a buffer refilled while another thread still
//   reads it gives that thread the new data.
// - Shared memory is filled with 0xFF bytes (a NaN as fp32, -NaN as bf16) before every block.
// - ldmatrix, mma.sync m16n8k16 bf16 and m16n8k4 f64 as warp-collective exchanges with the
//   fragment layouts of the PTX ISA; the bf16 MMA sums its 16 exact products in double and rounds
//   once (the tensor cores round in their own way: results agree to fp32 rounding, not bit for bit).
// - mbarriers complete a phase when their arrivals are in and their bulk copies have landed; a bulk
//   copy lands only when a thread waits on its barrier. setmaxnreg and griddepcontrol do nothing.
// Not modelled: timing, memory consistency between blocks, the hardware's MMA rounding, wgmma,
// __trap's exact effect (here: the launch fails with a message).
#pragma once
// _longjmp switches stacks: fortified (Ubuntu's g++ fortifies by default), a jump to a fiber's stack
// lower in memory aborts ("longjmp causes uninitialized stack frame")
#undef _FORTIFY_SOURCE
#include <math.h>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <setjmp.h>
#include <ucontext.h>
#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define KDTREE_PTX_EMULATED 1

struct dim3_ { unsigned x, y, z; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) double2 { double x, y; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
struct __attribute__((aligned(8))) int2 { int x, y; };
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

namespace emu {

struct Copy { void* dst; const void* src; int bytes; };

struct Fiber {
    ucontext_t ctx;                             // its start (trampoline on its own stack)
    jmp_buf jb;                                 // where it waits, once started
    dim3_ tid;
    int flat = 0;
    bool started = false, done = false;
    std::vector<Copy> open;                     // cp.async copies since the last commit
    std::vector<std::vector<Copy>> groups;      // committed groups, oldest first
};

struct Barrier { int expected = 0, arrived = 0; unsigned gen = 0; };

// An mbarrier: `count` arrivals and `tx` bytes of bulk copies complete its current phase.
struct MBarrier { unsigned count = 0, pending = 0, phase = 0; long long tx = 0; };
struct BulkCopy { void* dst; const void* src; unsigned bytes; unsigned mbar; };

struct WarpState {
    Barrier sync;
    unsigned long long xchg[32];                // one value a lane (gather)
    unsigned ufrag[32][6];                      // an mma.sync's A and B fragments, a lane's six registers
};

struct Launch {
    dim3_ grid{1, 1, 1}, block{1, 1, 1}, bidx{0, 0, 0};
    unsigned smem = 0;
    bool early_copies = false;                  // cp.async lands as issued, not at its wait
    std::vector<Fiber> fibers;
    Fiber* cur = nullptr;
    jmp_buf sched;                              // the scheduler, where a fiber yields to
    Barrier block_bar;
    Barrier named[16];
    std::vector<WarpState> warps;
    std::map<unsigned, MBarrier> mbars;          // by shared-memory address
    std::vector<BulkCopy> bulk;                 // bulk copies not yet landed
    unsigned long long progress = 0;
    std::string error;
};
inline Launch* L = nullptr;

inline void fail(const std::string& why) {
    if (L->error.empty()) L->error = why;
    throw std::runtime_error(why);
}

inline void yield() {
    if (!_setjmp(L->cur->jb)) _longjmp(L->sched, 1);
}

inline void arrive_and_wait(Barrier& b, int expected, const char* what) {
    if (b.arrived == 0) b.expected = expected;
    else if (b.expected != expected) fail(std::string(what) + ": threads wait with different counts");
    const unsigned gen = b.gen;
    ++L->progress;
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.gen;
        return;
    }
    while (b.gen == gen) yield();
}

inline int lane() { return L->cur->flat & 31; }
inline WarpState& warp() { return L->warps[L->cur->flat >> 5]; }

inline void warp_sync(unsigned mask) {
    if (mask != 0xffffffffu) fail("only full-warp masks are emulated");
    arrive_and_wait(warp().sync, 32, "__syncwarp");
}

inline void apply(const Copy& c) {
    if (c.src) std::memcpy(c.dst, c.src, c.bytes);
    else std::memset(c.dst, 0, c.bytes);
}

}  // namespace emu

#define threadIdx (emu::L->cur->tid)
#define blockIdx (emu::L->bidx)
#define blockDim (emu::L->block)
#define gridDim (emu::L->grid)

inline void __syncthreads() {
    emu::arrive_and_wait(emu::L->block_bar, (int)emu::L->fibers.size(), "__syncthreads");
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_sync(mask); }
[[noreturn]] inline void __trap() { emu::fail("__trap"); throw 0; }

namespace emu {
// Every lane's value of v: a warp-collective exchange, as shuffles, votes and reductions are.
template <typename T>
inline void gather(unsigned mask, T v, T (&all)[32]) {
    static_assert(sizeof(T) <= 8, "lane values of at most 8 bytes");
    auto& w = warp();
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.xchg[lane()] = bits;
    warp_sync(mask);
    for (int i = 0; i < 32; ++i) std::memcpy(&all[i], &w.xchg[i], sizeof(T));
    warp_sync(mask);                            // every lane has read before any writes again
}
template <typename T>
inline T lane_value(unsigned mask, T v, int src) {
    T all[32];
    gather(mask, v, all);
    return all[src & 31];
}
template <typename T>
inline T warp_extreme(unsigned mask, T v, bool largest) {
    T all[32];
    gather(mask, v, all);
    return largest ? *std::max_element(all, all + 32) : *std::min_element(all, all + 32);
}
}  // namespace emu

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    return emu::lane_value(mask, v, emu::lane() ^ lane_mask);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src) { return emu::lane_value(mask, v, src); }
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
    const int l = emu::lane();
    return emu::lane_value(mask, v, l >= (int)delta ? l - (int)delta : l);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
    const int l = emu::lane();
    return emu::lane_value(mask, v, l + (int)delta < 32 ? l + (int)delta : l);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    int all[32];
    emu::gather(mask, pred ? 1 : 0, all);
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (unsigned)(all[i] != 0) << i;
    return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) { return emu::warp_extreme(mask, v, true); }
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) { return emu::warp_extreme(mask, v, false); }
inline int __reduce_max_sync(unsigned mask, int v) { return emu::warp_extreme(mask, v, true); }
inline int __reduce_min_sync(unsigned mask, int v) { return emu::warp_extreme(mask, v, false); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll((unsigned long long)v); }
inline long long __double_as_longlong(double d) { long long v; std::memcpy(&v, &d, 8); return v; }
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
inline int __double2hiint(double d) { return (int)(__double_as_longlong(d) >> 32); }
inline int __double2loint(double d) { return (int)(unsigned)__double_as_longlong(d); }
inline double __hiloint2double(int hi, int lo) {
    return __longlong_as_double((long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
}
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcg(const T* p) { return *p; }

inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }
inline unsigned __float_as_uint(float f) { unsigned v; std::memcpy(&v, &f, 4); return v; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __frcp_rn(float a) { volatile float r = 1.0f / a; return r; }
inline float __fdividef(float a, float b) { return a / b; }

// -- kernels/ptx.cuh, on the host -----------------------------------------------------------------

typedef unsigned int u32;

inline void cp_async_issue(void* dst, const void* src, int bytes) {
    if (emu::L->early_copies) emu::apply({dst, src, bytes});
    else emu::L->cur->open.push_back({dst, src, bytes});
}
inline void cp_async16(void* dst, const void* src, bool valid) { cp_async_issue(dst, valid ? src : nullptr, 16); }
inline void cp_async4(void* dst, const void* src, bool valid) { cp_async_issue(dst, valid ? src : nullptr, 4); }
inline void cp_async_commit() {
    auto* f = emu::L->cur;
    f->groups.push_back(std::move(f->open));
    f->open.clear();
}
template <int N>
inline void cp_async_wait() {
    auto* f = emu::L->cur;
    while ((int)f->groups.size() > N) {
        for (const auto& c : f->groups.front()) emu::apply(c);
        f->groups.erase(f->groups.begin());
    }
}

inline u32 bf16_rn_bits(float x) {               // fp32 -> bf16, round to nearest even (cvt.rn)
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;   // NaN stays NaN (quiet)
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
inline u32 pack_bf16x2(float lo, float hi) { return bf16_rn_bits(lo) | (bf16_rn_bits(hi) << 16); }
inline float exp2_ftz(float x) {
    const float y = exp2f(x);
    return fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}
inline unsigned dynamic_smem_bytes() { return emu::L->smem; }

inline void named_barrier(int id, int count) {
    if (id <= 0 || id >= 16) emu::fail("named barrier id out of 1..15");
    emu::arrive_and_wait(emu::L->named[id], count, "bar.sync");
}

// ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8; register i of lane l holds
// matrix i's row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (.trans: the transposed matrix's).
inline void ldmatrix_exchange(u32 (&r)[4], const void* p, bool trans) {
    const void* rows[32];
    emu::gather(0xffffffffu, p, rows);
    const int l = emu::lane();
    for (int i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        if (!trans) {
            const uint16_t* row = (const uint16_t*)rows[8 * i + l / 4];
            lo = row[2 * (l % 4)];
            hi = row[2 * (l % 4) + 1];
        } else {
            lo = ((const uint16_t*)rows[8 * i + 2 * (l % 4)])[l / 4];
            hi = ((const uint16_t*)rows[8 * i + 2 * (l % 4) + 1])[l / 4];
        }
        r[i] = (u32)lo | ((u32)hi << 16);
    }
}
inline void ldmatrix_x4(u32 (&r)[4], const void* p) { ldmatrix_exchange(r, p, false); }
inline void ldmatrix_x4_trans(u32 (&r)[4], const void* p) { ldmatrix_exchange(r, p, true); }

inline float bf16_value(u32 packed, int half) { return __uint_as_float(half ? packed & 0xffff0000u : packed << 16); }

// D (16x8 f32) += A (16x16 bf16, row) B (16x8 bf16, col). Fragments (g = lane / 4, t = lane % 4):
// A a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (k 2t..2t+1, n g),
// b1 (k 2t+8.., n g); C/D c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
inline void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    auto& w = emu::warp();
    const int l = emu::lane();
    for (int i = 0; i < 4; ++i) w.ufrag[l][i] = a[i];
    w.ufrag[l][4] = b0;
    w.ufrag[l][5] = b1;
    emu::warp_sync(0xffffffffu);
    auto A = [&](int row, int k) {
        const int t = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return bf16_value(w.ufrag[4 * (row % 8) + t][reg], k & 1);
    };
    auto B = [&](int k, int n) {
        const int t = (k % 8) / 2;
        return bf16_value(w.ufrag[4 * n + t][4 + (k >= 8 ? 1 : 0)], k & 1);
    };
    const int g = l / 4, t = l % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        double s = d[i];
        for (int k = 0; k < 16; ++k) s += (double)A(row, k) * (double)B(k, col);
        out[i] = (float)s;
    }
    emu::warp_sync(0xffffffffu);
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// Shared-memory addresses (what mbarrier instructions take) are offsets from the block's dynamic
// shared memory; function statics (static __shared__) lie elsewhere in the library, within 2 GB.
#define EMU_SMEM_CAPACITY 232448
inline unsigned char emu_dynamic_smem[EMU_SMEM_CAPACITY] __attribute__((aligned(128)));
inline u32 smem_addr(const void* p) { return (u32)((const unsigned char*)p - emu_dynamic_smem); }
inline void grid_dep_wait() {}
inline void grid_dep_launch() {}
template <int N> inline void setmaxnreg_inc() {}
template <int N> inline void setmaxnreg_dec() {}
inline void mbar_fence_init() {}

namespace emu {
inline MBarrier& mbarrier(unsigned addr) {
    auto it = L->mbars.find(addr);
    if (it == L->mbars.end()) fail("an mbarrier used before mbarrier.init");
    return it->second;
}
inline void mbar_settle(MBarrier& b) {
    if (b.pending == 0 && b.tx == 0) { ++b.phase; b.pending = b.count; ++L->progress; }
}
// Lands the bulk copies that barrier `addr` waits for (as late as the hardware may: when a thread
// waits on it); true if there were any.
inline bool land_bulk(unsigned addr) {
    bool any = false;
    for (size_t i = 0; i < L->bulk.size();) {
        const BulkCopy c = L->bulk[i];
        if (c.mbar != addr) { ++i; continue; }
        std::memcpy(c.dst, c.src, c.bytes);
        L->bulk.erase(L->bulk.begin() + i);
        MBarrier& b = mbarrier(addr);
        b.tx -= c.bytes;
        ++L->progress;
        mbar_settle(b);
        any = true;
    }
    return any;
}
}  // namespace emu

inline void mbar_init(unsigned addr, unsigned count) {
    emu::L->mbars[addr] = emu::MBarrier{count, count, 0, 0};
    ++emu::L->progress;
}
inline void mbar_arrive(unsigned addr) {
    auto& b = emu::mbarrier(addr);
    if (b.pending == 0) emu::fail("an mbarrier arrival beyond its count");
    --b.pending;
    ++emu::L->progress;
    emu::mbar_settle(b);
}
// try_wait.parity in a loop: returns once the phase of that parity has completed.
inline void mbar_wait(unsigned addr, unsigned parity) {
    while ((emu::mbarrier(addr).phase & 1) == parity) {
        if (!emu::land_bulk(addr)) emu::yield();
    }
}
inline void bulk_load(void* dst, const void* src, unsigned bytes, unsigned mbar) {
    auto& b = emu::mbarrier(mbar);                // mbarrier.arrive.expect_tx, then the copy
    b.tx += bytes;
    if (b.pending == 0) emu::fail("an mbarrier arrival beyond its count");
    --b.pending;
    ++emu::L->progress;
    emu::L->bulk.push_back({dst, src, bytes, mbar});
}

// D (16x8 f64) += A (16x4 f64, row) B (4x8 f64, col): a0 (g, t), a1 (g+8, t); b0 (k t, n g);
// d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1).
inline void dmma_16x8x4(double (&d)[4], double a0, double a1, double b0) {
    double all[32][3];
    const double mine[3] = {a0, a1, b0};
    for (int i = 0; i < 3; ++i) {
        double lane_vals[32];
        emu::gather(0xffffffffu, mine[i], lane_vals);
        for (int l = 0; l < 32; ++l) all[l][i] = lane_vals[l];
    }
    const int g = emu::lane() / 4, t = emu::lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        double s = d[i];
        for (int k = 0; k < 4; ++k) s = fma(all[4 * (row % 8) + k][row >= 8 ? 1 : 0], all[4 * col + k][2], s);
        d[i] = s;
    }
}

// -- the launch ------------------------------------------------------------------------------------

namespace emu {

constexpr size_t STACK_BYTES = 128 * 1024;
inline void (*fiber_body)(void**) = nullptr;
inline void** fiber_args = nullptr;

inline void trampoline() {
    try {
        fiber_body(fiber_args);
    } catch (...) {
        // the message is in L->error; this fiber ends here
    }
    for (auto& g : L->cur->groups) for (const auto& c : g) apply(c);
    L->cur->groups.clear();
    L->cur->done = true;
    ++L->progress;
    _longjmp(L->sched, 1);
}

// Runs fiber f until it yields or ends: its first time from its start, then from where it waits.
[[gnu::noinline]] inline void resume(Launch& launch, Fiber& f) {
    launch.cur = &f;
    if (_setjmp(launch.sched)) return;
    if (f.started) _longjmp(f.jb, 1);
    f.started = true;
    setcontext(&f.ctx);
}

// Runs body(args) over the grid, one block at a time; `order` 0 runs a block's threads ascending,
// 1 descending, >= 2 shuffled with that seed; `early` lands cp.async copies as they are issued.
// Returns 0, or 1 with the message in `error`.
inline int launch(void (*body)(void**), void** args, dim3_ grid, dim3_ block, unsigned smem,
                  unsigned char* dyn_smem, size_t dyn_capacity, int order, int early, char* error,
                  size_t error_size) {
    Launch launch;
    L = &launch;
    launch.early_copies = early != 0;
    launch.grid = grid;
    launch.block = block;
    launch.smem = smem;
    const int n = (int)(block.x * block.y * block.z);
    if (smem > dyn_capacity) {
        std::snprintf(error, error_size, "dynamic shared memory %u B exceeds the emulator's %zu B", smem, dyn_capacity);
        L = nullptr;
        return 1;
    }
    std::unique_ptr<char[]> stacks(new char[STACK_BYTES * n]);
    std::mt19937 rng(order);
    std::vector<int> schedule(n);
    fiber_body = body;
    fiber_args = args;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        launch.bidx = {bx, by, bz};
        std::memset(dyn_smem, 0xff, smem);
        launch.fibers.assign(n, Fiber{});
        launch.warps.assign((n + 31) / 32, WarpState{});
        launch.block_bar = Barrier{};
        for (auto& b : launch.named) b = Barrier{};
        launch.mbars.clear();
        launch.bulk.clear();
        for (int i = 0; i < n; ++i) {
            Fiber& f = launch.fibers[i];
            f.flat = i;
            f.tid = {(unsigned)(i % block.x), (unsigned)((i / block.x) % block.y), (unsigned)(i / (block.x * block.y))};
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = stacks.get() + STACK_BYTES * i;
            f.ctx.uc_stack.ss_size = STACK_BYTES;
            f.ctx.uc_link = nullptr;
            makecontext(&f.ctx, (void (*)())trampoline, 0);
        }
        for (int i = 0; i < n; ++i) schedule[i] = order == 1 ? n - 1 - i : i;
        if (order >= 2) std::shuffle(schedule.begin(), schedule.end(), rng);
        int live = n;
        while (live > 0 && launch.error.empty()) {
            const unsigned long long before = launch.progress;
            for (int i : schedule) {
                Fiber& f = launch.fibers[i];
                if (f.done) continue;
                resume(launch, f);
                if (f.done) --live;
                if (!launch.error.empty()) break;
            }
            if (live > 0 && launch.progress == before && launch.error.empty())
                launch.error = "deadlock: every live thread waits at a barrier the others never reach";
        }
        if (!launch.error.empty()) {
            std::snprintf(error, error_size, "block (%u, %u, %u): %s", bx, by, bz, launch.error.c_str());
            L = nullptr;
            return 1;
        }
    }
    L = nullptr;
    return 0;
}

template <typename... A>
constexpr size_t arity(void (*)(A...)) { return sizeof...(A); }

// Calls f with its parameters read from args[i], each a pointer to the value (as cuLaunchKernel
// takes them).
template <typename... A, size_t... I>
inline void call_with(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

}  // namespace emu


// One exported launcher per kernel entry: emu_<entry>(args, grid, block, smem, order, early, error,
// size).
#define EMU_EXPORT(entry)                                                                              \
    extern "C" int emu_##entry(void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx,         \
                               unsigned by, unsigned bz, unsigned smem, int order, int early,          \
                               char* error, unsigned error_size) {                                     \
        void (*body)(void**) = [](void** a) {                                                          \
            emu::call_with(&entry, a, std::make_index_sequence<emu::arity(&entry)>{});                 \
        };                                                                                             \
        return emu::launch(body, args, {gx, gy, gz}, {bx, by, bz}, smem, emu_dynamic_smem,             \
                           EMU_SMEM_CAPACITY, order, early, error, error_size);                        \
    }
