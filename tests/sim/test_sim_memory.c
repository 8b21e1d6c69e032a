/* test_sim_memory.c — device and host allocations on the simulated GPU, with
 * the capacities set from the environment: SIMCUDA_VRAM_MB=64,
 * SIMCUDA_HOST_MB=32, SIMCUDA_GRANULARITY_KB=512 (set in main, before the
 * first call). cuMemAlloc/cuMemFree, pinned and registered host memory,
 * stream-ordered allocation, memcpy and memset (sync and async, 8/16/32-bit),
 * and the out-of-memory codes of driver and runtime.
 *
 * Configurations that need another environment (SIMCUDA_NO_HOST_VMM, values
 * that do not parse) run in a fresh copy of this program: main() takes the
 * scenario's name as its argument and exits 0 if every check held.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

#define MiB  (1024ull * 1024)
#define VRAM (64 * MiB)
#define HOST (32 * MiB)
#define GRAN (512 * 1024ull)

static const char *self_path = "/proc/self/exe";

/* ---- helpers ---- */

static CUcontext ctx;

static void need_ctx(void)
{
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    if (!ctx)
        assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

static simcuda_stats_t stats(void)
{
    simcuda_stats_t s;
    simcuda_get_stats(&s);
    return s;
}

static size_t mem_free(void)
{
    size_t f = 0, t = 0;
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(t, VRAM);
    return f;
}

static CUmemAllocationProp prop_of(CUmemLocationType type)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = type;
    return p;
}

struct capture {
    int saved, fds[2];
};

static void capture_begin(struct capture *c)
{
    fflush(stderr);
    if (pipe(c->fds) != 0)
        abort();
    c->saved = dup(STDERR_FILENO);
    dup2(c->fds[1], STDERR_FILENO);
}

static void capture_end(struct capture *c, char *buf, size_t cap)
{
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO);
    close(c->saved);
    close(c->fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(c->fds[0], buf + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = '\0';
    close(c->fds[0]);
}

/* Runs this program again as `self scenario` with no SIMCUDA_* variables but
 * the (name, value) pairs of vars, and returns its exit code. */
static int run_scenario(const char *scenario, const char *const *vars)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        static const char *const all[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                          "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                          "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            unsetenv(all[i]);
        for (size_t i = 0; vars && vars[i]; i += 2) {
            if (vars[i + 1])
                setenv(vars[i], vars[i + 1], 1);
            else
                unsetenv(vars[i]);
        }
        execl(self_path, "test_sim_memory", scenario, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* ---- the configuration ---- */

static void configuration_comes_from_the_environment(void **state)
{
    (void)state;
    need_ctx();
    size_t total = 0, f = 0;
    assert_int_equal(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
    assert_int_equal(total, VRAM);
    assert_int_equal(cuMemGetInfo(&f, &total), CUDA_SUCCESS);
    assert_int_equal(total, VRAM);
    assert_int_equal(f, VRAM);
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE);
    size_t g = 0;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_SUCCESS);
    assert_int_equal(g, GRAN);
    /* The granularity rules follow it. */
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(cuMemCreate(&h, GRAN + GRAN / 2, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, 3 * GRAN, &p, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    simcuda_stats_t s = stats();
    assert_int_equal(s.device_bytes_in_use, 0);
    assert_int_equal(s.host_bytes_in_use, 0);
}

/* ---- device memory and its cap ---- */

static void device_memory_is_capped(void **state)
{
    (void)state;
    need_ctx();
    enum { N = VRAM / MiB };
    CUdeviceptr d[N + 1];
    memset(d, 0, sizeof d);
    for (int i = 0; i < N; i++) {
        assert_int_equal(cuMemAlloc(&d[i], MiB), CUDA_SUCCESS);
        assert_int_equal(mem_free(), VRAM - (size_t)(i + 1) * MiB);
    }
    simcuda_stats_t s = stats();
    assert_int_equal(s.device_bytes_in_use, VRAM);
    assert_int_equal(s.device_bytes_peak, VRAM);
    assert_int_equal(mem_free(), 0);
    assert_int_equal(cuMemAlloc(&d[N], MiB), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemAlloc(&d[N], 1), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(d[N], 0);
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE);
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    void *rp = NULL;
    assert_int_equal(cudaMalloc(&rp, 4096), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaSuccess);

    /* Freeing gives it back. */
    assert_int_equal(cuMemFree(d[7]), CUDA_SUCCESS);
    assert_int_equal(mem_free(), MiB);
    assert_int_equal(cuMemAlloc(&d[7], MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&d[N], 1), CUDA_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < N; i++)
        assert_int_equal(cuMemFree(d[i]), CUDA_SUCCESS);
    s = stats();
    assert_int_equal(s.device_bytes_in_use, 0);
    assert_int_equal(s.device_bytes_peak, VRAM);
    assert_int_equal(mem_free(), VRAM);

    /* One allocation larger than the card. */
    assert_int_equal(cuMemAlloc(&d[0], VRAM + 1), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cudaMalloc(&rp, VRAM + MiB), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_int_equal(cuMemAlloc(&d[0], VRAM), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d[0]), CUDA_SUCCESS);
}

static void device_handles_share_the_cap_with_allocations(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0, d2 = 0;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(cuMemAlloc(&d, 40 * MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemCreate(&h, 32 * MiB, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemCreate(&h, 24 * MiB, &p, 0), CUDA_SUCCESS);
    assert_int_equal(mem_free(), 0);
    assert_int_equal(cuMemAlloc(&d2, 4096), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemCreate(&h2, GRAN, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* Host-located handles do not take device memory. */
    CUmemAllocationProp hp = prop_of(CU_MEM_LOCATION_TYPE_HOST_NUMA);
    assert_int_equal(cuMemCreate(&h2, 16 * MiB, &hp, 0), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, 16 * MiB);
    assert_int_equal(mem_free(), 0);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, 0);

    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(mem_free(), 24 * MiB);
    assert_int_equal(cuMemAlloc(&d2, 24 * MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d2), CUDA_SUCCESS);
    assert_int_equal(stats().device_bytes_in_use, 0);
}

static void mem_free_errors(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    int local = 0;
    assert_int_equal(cuMemAlloc(&d, 8192), CUDA_SUCCESS);
    assert_int_equal(cuMemFree((CUdeviceptr)(uintptr_t)&local), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(d + 4), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(d + 4096), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(stats().device_bytes_in_use, 8192);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(0), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAlloc(NULL, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(stats().device_bytes_in_use, 0);

    void *rp = NULL;
    assert_int_equal(cudaFree(&local), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(NULL), cudaSuccess);
    assert_int_equal(cudaMalloc(&rp, 0), cudaSuccess);
    assert_null(rp);
}

static void allocations_are_usable_and_aligned(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, 1000), CUDA_SUCCESS);
    assert_int_equal(d % 256, 0);
    unsigned char in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(cuMemcpyHtoD(d, in, sizeof in), CUDA_SUCCESS);
    memset(out, 0, sizeof out);
    assert_int_equal(cuMemcpyDtoH(out, d, sizeof out), CUDA_SUCCESS);
    assert_memory_equal(in, out, sizeof in);
    void *rp = NULL;
    assert_int_equal(cudaMalloc(&rp, 3), cudaSuccess);
    assert_int_equal((uintptr_t)rp % 256, 0);
    assert_int_equal(cudaFree(rp), cudaSuccess);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* ---- host memory and its cap ---- */

static void pinned_host_memory_is_capped(void **state)
{
    (void)state;
    need_ctx();
    void *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(cuMemHostAlloc(&a, 16 * MiB, 0), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, 16 * MiB);
    assert_int_equal(cuMemAllocHost(&b, 8 * MiB), CUDA_SUCCESS);
    assert_int_equal(cudaHostAlloc(&c, 8 * MiB, cudaHostAllocPortable), cudaSuccess);
    assert_int_equal(stats().host_bytes_in_use, HOST);
    memset(a, 1, 16 * MiB);
    memset(b, 2, 8 * MiB);
    memset(c, 3, 8 * MiB);
    /* Pinned memory does not take device memory. */
    assert_int_equal(mem_free(), VRAM);

    void *x = NULL;
    assert_int_equal(cuMemHostAlloc(&x, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
    assert_null(x);
    assert_int_equal(cudaMallocHost(&x, 4096), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_HOST);
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    p = prop_of(CU_MEM_LOCATION_TYPE_HOST_NUMA);
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    void *page = aligned_alloc(4096, 4096);
    assert_non_null(page);
    assert_int_equal(cuMemHostRegister(page, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* A device allocation still works. */
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);

    /* Freeing gives it back. */
    assert_int_equal(cuMemFreeHost(b), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, 24 * MiB);
    assert_int_equal(cuMemHostRegister(page, 4096, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, 24 * MiB + 4096 + GRAN);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemHostUnregister(page), CUDA_SUCCESS);
    free(page);
    assert_int_equal(cuMemFreeHost(a), CUDA_SUCCESS);
    assert_int_equal(cudaFreeHost(c), cudaSuccess);
    assert_int_equal(stats().host_bytes_in_use, 0);
    assert_int_equal(cudaMallocHost(&x, HOST), cudaSuccess);
    assert_int_equal(cudaFreeHost(x), cudaSuccess);
}

static void host_alloc_and_free_errors(void **state)
{
    (void)state;
    need_ctx();
    void *p = NULL;
    int local = 0;
    assert_int_equal(cuMemHostAlloc(&p, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemHostAlloc(NULL, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemHostAlloc(&p, 4096, 0x10), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemHostAlloc(&p, 100, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    CUdeviceptr dp = 0;
    assert_int_equal(cuMemHostGetDevicePointer(&dp, p, 0), CUDA_SUCCESS);
    assert_int_equal(dp, (CUdeviceptr)(uintptr_t)p);
    assert_int_equal(cuMemHostGetDevicePointer(&dp, &local, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFreeHost(&local), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFreeHost((char *)p + 8), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFreeHost(p), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cudaFreeHost(&local), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(stats().host_bytes_in_use, 0);
}

static void host_register_and_unregister(void **state)
{
    (void)state;
    need_ctx();
    char *buf = aligned_alloc(4096, 4 * 4096);
    assert_non_null(buf);
    void *pinned = NULL;
    int local = 0;
    assert_int_equal(cuMemHostAlloc(&pinned, 4096, 0), CUDA_SUCCESS);
    size_t h0 = stats().host_bytes_in_use;

    assert_int_equal(cuMemHostRegister(buf, 2 * 4096, 0), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, h0 + 2 * 4096);
    /* The same range, a range overlapping it, or pinned memory. */
    assert_int_equal(cuMemHostRegister(buf, 2 * 4096, 0),
                     CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    assert_int_equal(cuMemHostRegister(buf + 4096, 2 * 4096, 0),
                     CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    assert_int_equal(cuMemHostRegister(pinned, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    assert_int_equal(cudaHostRegister(buf, 4096, 0), cudaErrorHostMemoryAlreadyRegistered);
    assert_int_equal(cudaGetLastError(), cudaErrorHostMemoryAlreadyRegistered);
    /* The free neighbour can be registered on its own. */
    assert_int_equal(cuMemHostRegister(buf + 2 * 4096, 4096, 0), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, h0 + 3 * 4096);
    /* Registered memory is not pinned memory to free. */
    assert_int_equal(cuMemFreeHost(buf), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemHostRegister(NULL, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemHostRegister(buf + 3 * 4096, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemHostRegister(buf + 3 * 4096, 4096, 0x10), CUDA_ERROR_INVALID_VALUE);

    /* Unregister: only what was registered, by its start, once. */
    assert_int_equal(cuMemHostUnregister(buf + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cuMemHostUnregister(&local), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cuMemHostUnregister(pinned), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cuMemHostUnregister(buf), CUDA_SUCCESS);
    assert_int_equal(cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cudaHostUnregister(buf), cudaErrorHostMemoryNotRegistered);
    assert_int_equal(cudaGetLastError(), cudaErrorHostMemoryNotRegistered);
    assert_int_equal(cudaHostUnregister(buf + 2 * 4096), cudaSuccess);
    assert_int_equal(stats().host_bytes_in_use, h0);
    /* And again from scratch, through the runtime. */
    assert_int_equal(cudaHostRegister(buf, 4 * 4096, cudaHostRegisterDefault), cudaSuccess);
    assert_int_equal(stats().host_bytes_in_use, h0 + 4 * 4096);
    assert_int_equal(cudaHostUnregister(buf), cudaSuccess);

    assert_int_equal(cuMemFreeHost(pinned), CUDA_SUCCESS);
    assert_int_equal(stats().host_bytes_in_use, 0);
    free(buf);
}

/* ---- stream-ordered allocation ---- */

/* (unsigned *flag) after 150 ms: *flag = 1 */
static void k_slow_flag(void **args)
{
    **(unsigned **)args[0] = 1;
}

static void stream_ordered_free_returns_memory_when_the_stream_gets_there(void **state)
{
    (void)state;
    need_ctx();
    const size_t sz[] = {sizeof(void *)};
    assert_int_equal(simcuda_register_kernel(k_slow_flag, "k_slow_flag", 1, sz, 150 * 1000), 0);
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL;
    assert_int_equal(cudaMallocAsync(&p, 8 * MiB, s), cudaSuccess);
    assert_non_null(p);
    assert_int_equal(stats().device_bytes_in_use, 8 * MiB);
    assert_int_equal(cudaMemsetAsync(p, 0, 4, s), cudaSuccess);
    void *args[] = {&p};
    assert_int_equal(
        cudaLaunchKernel((const void *)k_slow_flag, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, s),
        cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, s), cudaSuccess);
    /* The stream has not reached the free. */
    assert_int_equal(stats().device_bytes_in_use, 8 * MiB);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(stats().device_bytes_in_use, 0);
    assert_int_equal(mem_free(), VRAM);

    /* Stream-ordered allocation honours the cap too. */
    assert_int_equal(cudaMallocAsync(&p, VRAM + MiB, s), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAllocAsync(&d, VRAM, (CUstream)s), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocAsync(&d, 1, (CUstream)s), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemFreeAsync(d + 4, (CUstream)s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFreeAsync(d, (CUstream)s), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize((CUstream)s), CUDA_SUCCESS);
    assert_int_equal(stats().device_bytes_in_use, 0);

    /* Memory freed earlier on a stream is a later allocation's on that
     * stream, even before the stream got there: no out-of-memory. */
    assert_int_equal(cuMemAllocAsync(&d, VRAM, (CUstream)s), CUDA_SUCCESS);
    void *dp = (void *)(uintptr_t)d;
    void *args2[] = {&dp};
    assert_int_equal(
        cudaLaunchKernel((const void *)k_slow_flag, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args2, 0, s),
        cudaSuccess);
    assert_int_equal(cuMemFreeAsync(d, (CUstream)s), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocAsync(&d, VRAM, (CUstream)s), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeAsync(d, (CUstream)s), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize((CUstream)s), CUDA_SUCCESS);
    assert_int_equal(stats().device_bytes_in_use, 0);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- copies and memsets ---- */

static void copies_in_every_direction(void **state)
{
    (void)state;
    need_ctx();
    enum { N = 10000 };
    CUdeviceptr a = 0, b = 0;
    assert_int_equal(cuMemAlloc(&a, N), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&b, N), CUDA_SUCCESS);
    unsigned char *src = malloc(N), *dst = malloc(N), *pinned = NULL;
    assert_non_null(src);
    assert_non_null(dst);
    assert_int_equal(cuMemHostAlloc((void **)&pinned, N, 0), CUDA_SUCCESS);
    for (int i = 0; i < N; i++)
        src[i] = (unsigned char)(i ^ (i >> 8));
    simcuda_stats_t s0 = stats();

    assert_int_equal(cuMemcpyHtoD(a, src, N), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoD(b, a, N), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(dst, b, N), CUDA_SUCCESS);
    assert_memory_equal(src, dst, N);
    memset(dst, 0, N);
    assert_int_equal(cuMemcpy((CUdeviceptr)(uintptr_t)pinned, a, N), CUDA_SUCCESS);
    assert_memory_equal(src, pinned, N);

    CUstream st = NULL;
    assert_int_equal(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8Async(b, 0, N, st), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoDAsync(b + 1, pinned, N - 1, st), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoDAsync(a, b, N, st), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(dst, a, N, st), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyAsync((CUdeviceptr)(uintptr_t)pinned, a, 16, st), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(st), CUDA_SUCCESS);
    assert_int_equal(dst[0], 0);
    assert_memory_equal(dst + 1, src, N - 1);
    assert_int_equal(pinned[0], 0);
    assert_memory_equal(pinned + 1, src, 15);

    simcuda_stats_t s1 = stats();
    /* h2d: HtoD, HtoDAsync; d2h: DtoH, cuMemcpy to pinned, DtoHAsync, cuMemcpyAsync. */
    assert_int_equal(s1.copies_h2d - s0.copies_h2d, 2);
    assert_int_equal(s1.bytes_h2d - s0.bytes_h2d, N + N - 1);
    assert_int_equal(s1.copies_d2h - s0.copies_d2h, 4);
    assert_int_equal(s1.bytes_d2h - s0.bytes_d2h, 3 * N + 16);

    /* Zero bytes is a no-op; a bad stream is not. */
    assert_int_equal(cuMemcpyHtoD(a, src, 0), CUDA_SUCCESS);
    CUstream dead = NULL;
    assert_int_equal(cuStreamCreate(&dead, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(dead), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoDAsync(a, src, 4, dead), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuMemsetD8Async(a, 0, 4, dead), CUDA_ERROR_INVALID_HANDLE);

    assert_int_equal(cuStreamDestroy(st), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(pinned), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(b), CUDA_SUCCESS);
    free(src);
    free(dst);
}

static void memsets_of_each_width(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, 256), CUDA_SUCCESS);
    unsigned char out[256];

    assert_int_equal(cuMemsetD8(d, 0xff, 256), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8(d + 1, 0xab, 5), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, d, 8), CUDA_SUCCESS);
    const unsigned char w8[] = {0xff, 0xab, 0xab, 0xab, 0xab, 0xab, 0xff, 0xff};
    assert_memory_equal(out, w8, 8);

    assert_int_equal(cuMemsetD16(d + 2, 0x1234, 3), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, d, 10), CUDA_SUCCESS);
    const unsigned char w16[] = {0xff, 0xab, 0x34, 0x12, 0x34, 0x12, 0x34, 0x12, 0xff, 0xff};
    assert_memory_equal(out, w16, 10);

    assert_int_equal(cuMemsetD32(d + 16, 0xdeadbeef, 2), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, d + 12, 16), CUDA_SUCCESS);
    const unsigned char w32[] = {0xff, 0xff, 0xff, 0xff, 0xef, 0xbe, 0xad, 0xde,
                                 0xef, 0xbe, 0xad, 0xde, 0xff, 0xff, 0xff, 0xff};
    assert_memory_equal(out, w32, 16);

    /* Asynchronous, on a stream. */
    CUstream s = NULL;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8Async(d + 100, 0x11, 3, s), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD16Async(d + 104, 0x2233, 2, s), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD32Async(d + 108, 0x44556677, 1, s), CUDA_SUCCESS);
    assert_int_equal(cudaMemsetAsync((void *)(uintptr_t)(d + 112), 0x88, 2, (cudaStream_t)s),
                     cudaSuccess);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, d + 100, 16), CUDA_SUCCESS);
    const unsigned char wa[] = {0x11, 0x11, 0x11, 0xff, 0x33, 0x22, 0x33, 0x22,
                                0x77, 0x66, 0x55, 0x44, 0x88, 0x88, 0xff, 0xff};
    assert_memory_equal(out, wa, 16);
    assert_int_equal(cudaMemset((void *)(uintptr_t)d, 0, 256), cudaSuccess);
    assert_int_equal(cuMemcpyDtoH(out, d, 256), CUDA_SUCCESS);
    for (int i = 0; i < 256; i++)
        assert_int_equal(out[i], 0);

    /* Misaligned wide memsets. */
    assert_int_equal(cuMemsetD16(d + 1, 0, 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD32(d + 2, 0, 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD16Async(d + 3, 0, 2, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD32Async(d + 6, 0, 2, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD8(d, 0x5, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, d, 8), CUDA_SUCCESS);
    for (int i = 0; i < 8; i++)
        assert_int_equal(out[i], 0);

    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* ---- other environments ---- */

static void no_host_vmm_turns_host_located_handles_off(void **state)
{
    (void)state;
    static const char *const vars[] = {"SIMCUDA_NO_HOST_VMM", "1", NULL};
    assert_int_equal(run_scenario("no-host-vmm", vars), 0);
}

static void unparsable_environment_values_fall_back_loudly(void **state)
{
    (void)state;
    static const char *const vars[] = {
        "SIMCUDA_VRAM_MB", "lots", "SIMCUDA_GRANULARITY_KB", "3", "SIMCUDA_HOST_MB", "0", NULL};
    assert_int_equal(run_scenario("bad-env", vars), 0);
}

/* The scenarios run by the two tests above, in a fresh process. */

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int scenario_no_host_vmm(void)
{
    int v = -1;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDeviceGetAttribute(&v,
                               CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                               0) == CUDA_SUCCESS);
    CHECK(v == 0);
    CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) ==
          CUDA_SUCCESS);
    CHECK(v == 1);
    CUmemGenericAllocationHandle h = 0;
    size_t g = 0;
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_HOST_NUMA);
    CHECK(cuMemCreate(&h, 2 * MiB, &p, 0) == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
          CUDA_ERROR_NOT_SUPPORTED);
    p = prop_of(CU_MEM_LOCATION_TYPE_HOST);
    CHECK(cuMemCreate(&h, 2 * MiB, &p, 0) == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(h == 0);
    p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE);
    CHECK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    CHECK(g == 2 * MiB);
    CHECK(cuMemCreate(&h, 2 * MiB, &p, 0) == CUDA_SUCCESS);
    CHECK(cuMemRelease(h) == CUDA_SUCCESS);
    return 0;
}

static int scenario_bad_env(void)
{
    struct capture c;
    char err[2048];
    capture_begin(&c);
    CUresult r = cuInit(0);
    capture_end(&c, err, sizeof err);
    CHECK(r == CUDA_SUCCESS);
    CHECK(strstr(err, "SIMCUDA_VRAM_MB=lots") != NULL);
    CHECK(strstr(err, "SIMCUDA_GRANULARITY_KB") != NULL);
    CHECK(strstr(err, "SIMCUDA_HOST_MB=0") != NULL);
    size_t total = 0, g = 0;
    CHECK(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
    CHECK(total == 1024 * MiB);
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE);
    CHECK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    CHECK(g == 2 * MiB);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "no-host-vmm") == 0)
        return scenario_no_host_vmm();
    if (argc == 2 && strcmp(argv[1], "bad-env") == 0)
        return scenario_bad_env();

    static const char *const env[] = {"SIMCUDA_PCIE_GBPS", "SIMCUDA_KERNEL_US",
                                      "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    setenv("SIMCUDA_VRAM_MB", "64", 1);
    setenv("SIMCUDA_HOST_MB", "32", 1);
    setenv("SIMCUDA_GRANULARITY_KB", "512", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(configuration_comes_from_the_environment),
        cmocka_unit_test(device_memory_is_capped),
        cmocka_unit_test(device_handles_share_the_cap_with_allocations),
        cmocka_unit_test(mem_free_errors),
        cmocka_unit_test(allocations_are_usable_and_aligned),
        cmocka_unit_test(pinned_host_memory_is_capped),
        cmocka_unit_test(host_alloc_and_free_errors),
        cmocka_unit_test(host_register_and_unregister),
        cmocka_unit_test(stream_ordered_free_returns_memory_when_the_stream_gets_there),
        cmocka_unit_test(copies_in_every_direction),
        cmocka_unit_test(memsets_of_each_width),
        cmocka_unit_test(no_host_vmm_turns_host_located_handles_off),
        cmocka_unit_test(unparsable_environment_values_fall_back_loudly),
    };
    return cmocka_run_group_tests_name("sim_memory", tests, NULL, NULL);
}
