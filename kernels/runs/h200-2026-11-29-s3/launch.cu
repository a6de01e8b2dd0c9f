// What a tree_build-shaped launch costs before any work (kernels/NOTES.md, session 3): one block of
// 256 threads per request, grid 64; `words` 32-bit stores per block (the outputs' drain), `chase`
// dependent global loads by thread 0 (the staging's latency) before them.
extern "C" __global__ void __launch_bounds__(256) launch_probe(const int* __restrict__ in, int* __restrict__ out,
                                                              int words, int chase) {
    extern __shared__ int smem[];
    int v = blockIdx.x;
    if (threadIdx.x == 0)
        for (int i = 0; i < chase; ++i) v = in[v & 1023];
    if (chase > 0) {
        if (threadIdx.x == 0) smem[0] = v;
        __syncthreads();
        v = smem[0];
    }
    for (int i = threadIdx.x; i < words; i += blockDim.x) out[(size_t)blockIdx.x * words + i] = v + i;
}
