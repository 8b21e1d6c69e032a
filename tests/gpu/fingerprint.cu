// fingerprint.cu — the library's kernels on the hardware. The fingerprint: its PTX
// (clean/ptx.c, what the library loads) computes, for buffers of many
// sizes and with several grids, exactly what the CPU implementation
// (clean/hash.c) computes on the same bytes — the agreement the simulated
// GPU assumes when it runs the CPU code in the kernel's place. Also how
// fast it reads device memory (the cost of a clean eviction). The pointer
// prefilter: the same answer as its CPU version (clean/hash.c), and its speed.
//
// No library needed (it runs without LD_PRELOAD). FP_MAX_MB: the largest
// buffer [256].
#include "common.cuh"

#include "clean/clean.h"

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        const char *s = "?";
        cuGetErrorString(r, &s);
        fail("%s: %s", what, s);
    }
}

// X of n bytes at src with `grid` blocks, and how long the kernel took.
static void run(CUfunction f, CUdeviceptr src, uint64_t n, CUdeviceptr key, CUdeviceptr out,
                unsigned grid, uint64_t x[2], float *ms)
{
    CUevent a, b;
    check(cuEventCreate(&a, 0), "cuEventCreate");
    check(cuEventCreate(&b, 0), "cuEventCreate");
    check(cuMemsetD8(out, 0, 16), "cuMemsetD8");
    void *args[] = {&src, &n, &key, &out};
    check(cuEventRecord(a, 0), "cuEventRecord");
    check(cuLaunchKernel(f, grid, 1, 1, SH_CLEAN_THREADS, 1, 1, 0, 0, args, NULL),
          "cuLaunchKernel");
    check(cuEventRecord(b, 0), "cuEventRecord");
    check(cuMemcpyDtoH(x, out, 16), "cuMemcpyDtoH");
    check(cuEventElapsedTime(ms, a, b), "cuEventElapsedTime");
    cuEventDestroy(a);
    cuEventDestroy(b);
}

// The pointer prefilter (SH_PTRS_KERNEL) over n bytes at src: found or not.
static uint32_t ptrs(CUfunction f, CUdeviceptr src, uint64_t n, uint32_t top, uint32_t span,
                     CUdeviceptr out, unsigned grid, float *ms)
{
    CUevent a, b;
    check(cuEventCreate(&a, 0), "cuEventCreate");
    check(cuEventCreate(&b, 0), "cuEventCreate");
    check(cuMemsetD8(out, 0, 4), "cuMemsetD8");
    uint64_t words = n / 4;
    void *args[] = {&src, &words, &top, &span, &out};
    check(cuEventRecord(a, 0), "cuEventRecord");
    check(cuLaunchKernel(f, grid, 1, 1, SH_CLEAN_THREADS, 1, 1, 0, 0, args, NULL),
          "cuLaunchKernel");
    check(cuEventRecord(b, 0), "cuEventRecord");
    uint32_t found = 2;
    check(cuMemcpyDtoH(&found, out, 4), "cuMemcpyDtoH");
    check(cuEventElapsedTime(ms, a, b), "cuEventElapsedTime");
    cuEventDestroy(a);
    cuEventDestroy(b);
    return found;
}

// The prefilter agrees with sh_clean_ptr_candidate on the random bytes,
// with ranges that find something and ranges that do not, and with one
// word planted; returns its speed over n bytes, GB/s.
static double check_ptrs(CUmodule mod, CUdeviceptr src, const unsigned char *h, uint64_t n)
{
    CUfunction f;
    check(cuModuleGetFunction(&f, mod, SH_PTRS_KERNEL), "cuModuleGetFunction (prefilter)");
    CUdeviceptr out;
    check(cuMemAlloc(&out, 4), "cuMemAlloc");
    const uint32_t *w = (const uint32_t *)h;
    // Random words: a span of 0 rarely finds one, a span of 2^28 always does.
    const uint32_t tops[] = {0x7f00u, w[n / 8] - 3, 0x10000000u};
    const uint32_t spans[] = {0, 16, 1u << 28};
    float ms = 0, best = 1e30f;
    for (size_t t = 0; t < 3; t++) {
        int want = sh_clean_ptr_candidate(w, n / 4, tops[t], spans[t]);
        for (unsigned grid : {1u, 64u, (unsigned)SH_CLEAN_GRID_MAX}) {
            uint32_t got = ptrs(f, src, n, tops[t], spans[t], out, grid, &ms);
            if ((int)got != want)
                fail("prefilter over %llu bytes, top %x span %x, grid %u: the kernel says %u, "
                     "the CPU %d", (unsigned long long)n, tops[t], spans[t], grid, got, want);
            best = grid == SH_CLEAN_GRID_MAX && ms < best ? ms : best;
        }
    }
    check(cuMemFree(out), "cuMemFree");
    return (double)n / (best / 1e3) / 1e9;
}

int main(void)
{
    set_test_name("fingerprint");
    check(cuInit(0), "cuInit");
    CUdevice dev;
    CUcontext ctx;
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUmodule mod;
    CUfunction f;
    check(cuModuleLoadData(&mod, sh_clean_ptx), "cuModuleLoadData (the library's PTX)");
    check(cuModuleGetFunction(&f, mod, SH_CLEAN_KERNEL), "cuModuleGetFunction");

    struct sh_clean_key k;
    if (sh_clean_key_random(&k) != 0)
        fail("no random key");
    uint64_t max = (uint64_t)env_ll("FP_MAX_MB", 256) << 20;
    unsigned char *h = (unsigned char *)malloc(max);
    if (!h)
        fail("no host memory for %llu bytes", (unsigned long long)max);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < max; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = (unsigned char)s;
    }
    CUdeviceptr src, key, out;
    check(cuMemAlloc(&src, max), "cuMemAlloc");
    check(cuMemAlloc(&key, sizeof k), "cuMemAlloc");
    check(cuMemAlloc(&out, 16), "cuMemAlloc");
    check(cuMemcpyHtoD(src, h, max), "cuMemcpyHtoD");
    check(cuMemcpyHtoD(key, &k, sizeof k), "cuMemcpyHtoD");

    // Sizes around the block and word edges, and whole chunks.
    const uint64_t sizes[] = {1,       7,        8,         4095,      4096,    4097,
                              12289,   65536,    1 << 20,   (2 << 20) + 24,   2 << 20,
                              8 << 20, 64 << 20, max - 8,   max};
    const unsigned grids[] = {1, 3, 64, SH_CLEAN_GRID_MAX};
    int checked = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        uint64_t n = sizes[i];
        if (n > max)
            continue;
        uint64_t want[2] = {0, 0};
        sh_clean_blocks(&k, h, n, want);
        for (size_t g = 0; g < sizeof grids / sizeof *grids; g++) {
            uint64_t got[2];
            float ms;
            run(f, src, n, key, out, grids[g], got, &ms);
            if (got[0] != want[0] || got[1] != want[1])
                fail("%llu bytes, grid %u: the kernel gave %016llx%016llx, the CPU %016llx%016llx",
                     (unsigned long long)n, grids[g], (unsigned long long)got[1],
                     (unsigned long long)got[0], (unsigned long long)want[1],
                     (unsigned long long)want[0]);
            checked++;
        }
    }
    // A byte changed, the last one included: the kernel's fingerprint changes.
    uint64_t base[2], moved[2];
    float ms;
    run(f, src, max, key, out, SH_CLEAN_GRID_MAX, base, &ms);
    check(cuMemsetD8(src + max - 1, (unsigned char)(h[max - 1] ^ 1), 1), "cuMemsetD8");
    run(f, src, max, key, out, SH_CLEAN_GRID_MAX, moved, &ms);
    if (base[0] == moved[0] && base[1] == moved[1])
        fail("a change of the last byte left the fingerprint as it was");

    // Speed, as the library launches it (at most SH_CLEAN_GRID_MAX blocks).
    float best = 1e30f;
    for (int rep = 0; rep < 5; rep++) {
        run(f, src, max, key, out, SH_CLEAN_GRID_MAX, moved, &ms);
        best = ms < best ? ms : best;
    }
    double gbps = (double)max / (best / 1e3) / 1e9;
    double pgbps = check_ptrs(mod, src, h, max);
    printf("RESULT fingerprint bytes=%llu ms=%.3f gbps=%.1f ptrs_gbps=%.1f\n",
           (unsigned long long)max, best, gbps, pgbps);
    pass("%d buffers and grids agree with the CPU bit for bit; %.1f GB/s over %llu MB; the "
         "pointer prefilter agrees with the CPU, %.1f GB/s",
         checked, gbps, (unsigned long long)(max >> 20), pgbps);
    return 0;
}
