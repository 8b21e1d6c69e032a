/* test_sim_newuser.c — the simulated GPU used the way a newcomer would use it,
 * from simcuda.h and the CUDA documentation alone: register kernels, allocate
 * with the runtime, copy, launch, synchronise, time with events, grow a
 * buffer with the virtual memory API, and handle errors. Every check is what
 * the CUDA documentation says the program may rely on.
 *
 * A simulated kernel is a host function that runs once per launch, so these
 * kernels loop over their whole index range themselves.
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
#include <time.h>

#include "tests/sim/simcuda.h"

/* ---- the kernels ---- */

/* saxpy(int n, float a, const float *x, float *y): y = a * x + y */
static void saxpy(void **args)
{
    int n = *(int *)args[0];
    float a = *(float *)args[1];
    const float *x = *(const float **)args[2];
    float *y = *(float **)args[3];
    for (int i = 0; i < n; i++)
        y[i] = a * x[i] + y[i];
}

/* The same, slowly: for the tests about asynchrony. */
static void saxpy_slow(void **args)
{
    saxpy(args);
}

struct affine {
    float scale;
    int count;
    double offset;
};

/* affine_fill(double *out, struct affine p, int tag): out[i] = i * scale + offset;
 * out[count] = tag */
static void affine_fill(void **args)
{
    double *out = *(double **)args[0];
    struct affine p = *(struct affine *)args[1];
    int tag = *(int *)args[2];
    for (int i = 0; i < p.count; i++)
        out[i] = i * (double)p.scale + p.offset;
    out[p.count] = tag;
}

/* fill_bytes(unsigned char *dst, size_t n, unsigned char v) */
static void fill_bytes(void **args)
{
    memset(*(void **)args[0], *(unsigned char *)args[2], *(size_t *)args[1]);
}

static void register_kernels(void)
{
    static int done;
    if (done)
        return;
    const size_t saxpy_sizes[] = {sizeof(int), sizeof(float), sizeof(float *), sizeof(float *)};
    const size_t affine_sizes[] = {sizeof(double *), sizeof(struct affine), sizeof(int)};
    const size_t fill_sizes[] = {sizeof(void *), sizeof(size_t), 1};
    assert_int_equal(simcuda_register_kernel(saxpy, "saxpy", 4, saxpy_sizes, 10), 0);
    assert_int_equal(simcuda_register_kernel(saxpy_slow, "saxpy_slow", 4, saxpy_sizes, 100000), 0);
    assert_int_equal(simcuda_register_kernel(affine_fill, "affine_fill", 3, affine_sizes, 10), 0);
    assert_int_equal(simcuda_register_kernel(fill_bytes, "fill_bytes", 3, fill_sizes, 10), 0);
    done = 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#define CUDA_OK(call) assert_int_equal((call), cudaSuccess)
#define CU_OK(call)   assert_int_equal((call), CUDA_SUCCESS)

/* ---- the programs ---- */

static void saxpy_with_the_runtime(void **state)
{
    (void)state;
    register_kernels();
    int count = 0;
    CUDA_OK(cudaGetDeviceCount(&count));
    assert_int_equal(count, 1);
    CUDA_OK(cudaSetDevice(0));

    enum { N = 100000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = (float)(2 * i);
    }
    float *dx = NULL, *dy = NULL;
    CUDA_OK(cudaMalloc((void **)&dx, N * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&dy, N * sizeof(float)));
    CUDA_OK(cudaMemcpy(dx, x, N * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dy, y, N * sizeof(float), cudaMemcpyHostToDevice));

    simcuda_stats_t s0, s1;
    simcuda_get_stats(&s0);
    int n = N;
    float a = 3.0f;
    void *args[] = {&n, &a, &dx, &dy};
    dim3 block = {256, 1, 1}, grid = {(N + 255) / 256, 1, 1};
    CUDA_OK(cudaLaunchKernel((const void *)saxpy, grid, block, args, 0, NULL));
    CUDA_OK(cudaGetLastError());
    /* cudaMemcpy on the default stream follows the kernel. */
    CUDA_OK(cudaMemcpy(y, dy, N * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        assert_true(y[i] == (float)(5 * i));
    simcuda_get_stats(&s1);
    assert_int_equal(s1.launches - s0.launches, 1);
    assert_int_equal(s1.copies_d2h - s0.copies_d2h, 1);
    assert_int_equal(s1.bytes_d2h - s0.bytes_d2h, N * sizeof(float));
    assert_int_equal(s1.faults, 0);

    CUDA_OK(cudaFree(dx));
    CUDA_OK(cudaFree(dy));
    CUDA_OK(cudaDeviceSynchronize());
    free(x);
    free(y);
}

static void launches_are_asynchronous(void **state)
{
    (void)state;
    register_kernels();
    enum { N = 1024 };
    float *x = NULL, *y = NULL, *host = NULL;
    CUDA_OK(cudaMalloc((void **)&x, N * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&y, N * sizeof(float)));
    CUDA_OK(cudaMallocHost((void **)&host, N * sizeof(float)));
    for (int i = 0; i < N; i++)
        host[i] = 1.0f;
    CUDA_OK(cudaMemcpy(x, host, N * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(y, 0, N * sizeof(float)));

    int n = N;
    float a = 2.0f;
    void *args[] = {&n, &a, &x, &y};
    double t0 = now_ms();
    CUDA_OK(cudaLaunchKernel((const void *)saxpy_slow, (dim3){4, 1, 1}, (dim3){256, 1, 1}, args, 0,
                             NULL));
    assert_true(now_ms() - t0 < 50);
    /* Not done yet: the stream says so, and an async copy on it waits. */
    assert_int_equal(cudaStreamQuery(NULL), cudaErrorNotReady);
    CUDA_OK(cudaMemcpyAsync(host, y, N * sizeof(float), cudaMemcpyDeviceToHost, NULL));
    CUDA_OK(cudaStreamSynchronize(NULL));
    assert_true(now_ms() - t0 >= 100);
    for (int i = 0; i < N; i++)
        assert_true(host[i] == 2.0f);
    CUDA_OK(cudaFreeHost(host));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(y));
}

static void struct_parameters_by_value(void **state)
{
    (void)state;
    register_kernels();
    /* The layout nvcc gives (double *, struct affine, int). */
    size_t off = 0, size = 0;
    CUfunction f = simcuda_function(affine_fill);
    assert_non_null(f);
    CU_OK(cuFuncGetParamInfo(f, 0, &off, &size));
    assert_int_equal(off, 0);
    assert_int_equal(size, 8);
    CU_OK(cuFuncGetParamInfo(f, 1, &off, &size));
    assert_int_equal(off, 8);
    assert_int_equal(size, sizeof(struct affine));
    CU_OK(cuFuncGetParamInfo(f, 2, &off, &size));
    assert_int_equal(off, 8 + sizeof(struct affine));
    assert_int_equal(size, 4);

    double *out = NULL;
    CUDA_OK(cudaMalloc((void **)&out, 11 * sizeof(double)));
    struct affine p = {.scale = 0.5f, .count = 10, .offset = -1.25};
    int tag = 4242;
    void *args[] = {&out, &p, &tag};
    CUDA_OK(cudaLaunchKernel((const void *)affine_fill, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0,
                             NULL));
    double back[11];
    CUDA_OK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDefault));
    for (int i = 0; i < 10; i++)
        assert_true(back[i] == i * 0.5 - 1.25);
    assert_true(back[10] == 4242.0);
    CUDA_OK(cudaFree(out));
}

static void two_stream_pipeline(void **state)
{
    (void)state;
    register_kernels();
    enum { CHUNKS = 8, CHUNK = 4096 };
    float *hx = NULL, *hy = NULL, *dx = NULL, *dy = NULL;
    CUDA_OK(cudaMallocHost((void **)&hx, CHUNKS * CHUNK * sizeof(float)));
    CUDA_OK(cudaMallocHost((void **)&hy, CHUNKS * CHUNK * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&dx, CHUNKS * CHUNK * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&dy, CHUNKS * CHUNK * sizeof(float)));
    for (int i = 0; i < CHUNKS * CHUNK; i++) {
        hx[i] = (float)(i % 1000);
        hy[i] = 1.0f;
    }
    cudaStream_t st[2];
    CUDA_OK(cudaStreamCreate(&st[0]));
    CUDA_OK(cudaStreamCreate(&st[1]));
    simcuda_stats_t s0, s1;
    simcuda_get_stats(&s0);
    for (int c = 0; c < CHUNKS; c++) {
        cudaStream_t s = st[c % 2];
        size_t o = (size_t)c * CHUNK;
        CUDA_OK(cudaMemcpyAsync(dx + o, hx + o, CHUNK * sizeof(float), cudaMemcpyHostToDevice, s));
        CUDA_OK(cudaMemcpyAsync(dy + o, hy + o, CHUNK * sizeof(float), cudaMemcpyHostToDevice, s));
        int n = CHUNK;
        float a = (float)c;
        float *x = dx + o, *y = dy + o;
        void *args[] = {&n, &a, &x, &y};
        CUDA_OK(cudaLaunchKernel((const void *)saxpy, (dim3){CHUNK / 256, 1, 1}, (dim3){256, 1, 1},
                                 args, 0, s));
        CUDA_OK(cudaMemcpyAsync(hy + o, dy + o, CHUNK * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    CUDA_OK(cudaDeviceSynchronize());
    for (int c = 0; c < CHUNKS; c++)
        for (int i = 0; i < CHUNK; i++) {
            int g = c * CHUNK + i;
            assert_true(hy[g] == (float)c * (float)(g % 1000) + 1.0f);
        }
    simcuda_get_stats(&s1);
    assert_int_equal(s1.copies_h2d - s0.copies_h2d, 2 * CHUNKS);
    assert_int_equal(s1.copies_d2h - s0.copies_d2h, CHUNKS);
    assert_int_equal(s1.bytes_h2d - s0.bytes_h2d, 2 * CHUNKS * CHUNK * sizeof(float));
    assert_int_equal(s1.launches - s0.launches, CHUNKS);
    CUDA_OK(cudaStreamDestroy(st[0]));
    CUDA_OK(cudaStreamDestroy(st[1]));
    CUDA_OK(cudaFreeHost(hx));
    CUDA_OK(cudaFreeHost(hy));
    CUDA_OK(cudaFree(dx));
    CUDA_OK(cudaFree(dy));
}

static void timing_a_kernel_with_events(void **state)
{
    (void)state;
    register_kernels();
    float *x = NULL, *y = NULL;
    CUDA_OK(cudaMalloc((void **)&x, 64));
    CUDA_OK(cudaMalloc((void **)&y, 64));
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    int n = 16;
    float a = 1.0f;
    void *args[] = {&n, &a, &x, &y};
    CUDA_OK(cudaEventRecord(start, NULL));
    CUDA_OK(cudaLaunchKernel((const void *)saxpy_slow, (dim3){1, 1, 1}, (dim3){16, 1, 1}, args, 0,
                             NULL));
    CUDA_OK(cudaEventRecord(stop, NULL));
    float ms = 0;
    /* Asking too early is "not ready", not an error. */
    assert_int_equal(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventSynchronize(stop));
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    assert_true(ms >= 100);
    assert_true(ms < 500);
    CUDA_OK(cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(stop));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(y));
}

/* A buffer that grows and shrinks in place, the way an allocator built on the
 * virtual memory API does it. */
static void growable_buffer_with_the_vmm_api(void **state)
{
    (void)state;
    register_kernels();
    CUDA_OK(cudaFree(NULL)); /* the customary way to make the runtime set up the context */
    CUdevice dev;
    CU_OK(cuCtxGetDevice(&dev));
    int vmm = 0;
    CU_OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    assert_int_equal(vmm, 1);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CU_OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    assert_true(gran > 0);
    CUmemAccessDesc rw;
    memset(&rw, 0, sizeof rw);
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    simcuda_stats_t base;
    simcuda_get_stats(&base);
    CUdeviceptr va = 0;
    CU_OK(cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
    CUmemGenericAllocationHandle h[2];
    /* First piece. */
    CU_OK(cuMemCreate(&h[0], gran, &prop, 0));
    CU_OK(cuMemMap(va, gran, 0, h[0], 0));
    CU_OK(cuMemSetAccess(va, gran, &rw, 1));
    unsigned char *p = (unsigned char *)(uintptr_t)va;
    size_t n = gran;
    unsigned char v = 0xa1;
    void *args[] = {&p, &n, &v};
    CUDA_OK(cudaLaunchKernel((const void *)fill_bytes, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0,
                             NULL));
    /* Grow in place: the second piece right after the first. */
    CU_OK(cuMemCreate(&h[1], 2 * gran, &prop, 0));
    CU_OK(cuMemMap(va + gran, 2 * gran, 0, h[1], 0));
    CU_OK(cuMemSetAccess(va + gran, 2 * gran, &rw, 1));
    unsigned char *p2 = p + gran - 100;
    size_t n2 = 200;
    unsigned char v2 = 0xb2;
    void *args2[] = {&p2, &n2, &v2};
    CUDA_OK(cudaLaunchKernel((const void *)fill_bytes, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args2, 0,
                             NULL));
    simcuda_stats_t grown;
    simcuda_get_stats(&grown);
    assert_int_equal(grown.device_bytes_in_use - base.device_bytes_in_use, 3 * gran);

    /* One copy across both pieces. */
    unsigned char *back = malloc(3 * gran);
    assert_non_null(back);
    CUDA_OK(cudaMemcpy(back, p, 3 * gran, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < 3 * gran; i++) {
        unsigned char want = i < gran - 100 ? 0xa1 : i < gran + 100 ? 0xb2 : 0;
        if (back[i] != want) {
            print_error("byte %zu is 0x%x, want 0x%x\n", i, back[i], want);
            fail();
        }
    }

    /* Shrink: nothing uses the second piece any more once the device is idle. */
    CUDA_OK(cudaDeviceSynchronize());
    CU_OK(cuMemUnmap(va + gran, 2 * gran));
    CU_OK(cuMemRelease(h[1]));
    CUDA_OK(cudaMemcpy(back, p + gran - 4, 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4; i++)
        assert_int_equal(back[i], 0xb2);
    CU_OK(cuMemUnmap(va, gran));
    CU_OK(cuMemRelease(h[0]));
    CU_OK(cuMemAddressFree(va, 8 * gran));
    simcuda_stats_t after;
    simcuda_get_stats(&after);
    assert_int_equal(after.device_bytes_in_use, base.device_bytes_in_use);
    assert_int_equal(after.faults, 0);
    free(back);
}

static void errors_a_program_checks_for(void **state)
{
    (void)state;
    register_kernels();
    void *p = NULL;
    size_t free_b = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total));
    assert_int_equal(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    CUDA_OK(cudaGetLastError());
    assert_string_equal(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");

    char buf[8];
    assert_int_equal(cudaMemcpy(buf, buf, sizeof buf, (enum cudaMemcpyKind)42),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);

    static int not_a_kernel;
    assert_int_equal(
        cudaLaunchKernel(&not_a_kernel, (dim3){1, 1, 1}, (dim3){1, 1, 1}, NULL, 0, NULL),
        cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
    CUDA_OK(cudaGetLastError());
}

/* cuda_runtime_api.h lists cudaErrorInvalidConfiguration among the results of
 * cudaLaunchKernel, and driver_types.h says "requesting too many threads or
 * blocks" triggers it: the error every CUDA newcomer meets with <<<1, 2048>>>. */
static void too_many_threads_is_an_invalid_configuration(void **state)
{
    (void)state;
    register_kernels();
    float *x = NULL;
    CUDA_OK(cudaMalloc((void **)&x, 64));
    int n = 0;
    float a = 1.0f;
    void *args[] = {&n, &a, &x, &x};
    cudaError_t big =
        cudaLaunchKernel((const void *)saxpy, (dim3){1, 1, 1}, (dim3){2048, 1, 1}, args, 0, NULL);
    cudaError_t last = cudaGetLastError();
    cudaError_t empty =
        cudaLaunchKernel((const void *)saxpy, (dim3){0, 1, 1}, (dim3){32, 1, 1}, args, 0, NULL);
    CUDA_OK(cudaFree(x));
    (void)cudaGetLastError();
    assert_int_equal(big, cudaErrorInvalidConfiguration);
    assert_int_equal(last, cudaErrorInvalidConfiguration);
    assert_int_equal(empty, cudaErrorInvalidConfiguration);
    assert_string_equal(cudaGetErrorString(cudaErrorInvalidConfiguration),
                        "invalid configuration argument");
}

int main(void)
{
    static const char *const env[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                      "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                      "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(saxpy_with_the_runtime),
        cmocka_unit_test(launches_are_asynchronous),
        cmocka_unit_test(struct_parameters_by_value),
        cmocka_unit_test(two_stream_pipeline),
        cmocka_unit_test(timing_a_kernel_with_events),
        cmocka_unit_test(growable_buffer_with_the_vmm_api),
        cmocka_unit_test(errors_a_program_checks_for),
        cmocka_unit_test(too_many_threads_is_an_invalid_configuration),
    };
    return cmocka_run_group_tests_name("sim_newuser", tests, NULL, NULL);
}
