/* test_sim_runtime.c — the simulated CUDA runtime (libcudart.so.13): devices,
 * memory, copies and memsets, streams, events, launches (cudaLaunchKernel,
 * __cudaGetKernel + __cudaLaunchKernel, cudaGetFuncBySymbol), the per-thread
 * last error, error strings, and the loud refusal of what it does not offer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

/* What nvcc-generated launch stubs call; declared for C++ only in crt/. */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);

#define MiB (1024ull * 1024)

static const dim3 one = {1, 1, 1};

/* ---- helpers ---- */

#include "capture.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- kernels ---- */

/* (int *dst, int a, double b): *dst = a + (int)b */
static void k_add(void **args)
{
    **(int **)args[0] = *(int *)args[1] + (int)*(double *)args[2];
}
/* same, after 80 ms */
static void k_add_slow(void **args)
{
    k_add(args);
}
/* never registered */
static void k_unknown(void **args)
{
    (void)args;
}

static void setup_kernels(void)
{
    static int done;
    if (done)
        return;
    const size_t sz[] = {sizeof(int *), sizeof(int), sizeof(double)};
    assert_int_equal(simcuda_register_kernel(k_add, "k_add", 3, sz, 1), 0);
    assert_int_equal(simcuda_register_kernel(k_add_slow, "k_add_slow", 3, sz, 80 * 1000), 0);
    done = 1;
}

/* ---- devices and versions ---- */

static void device_queries(void **state)
{
    (void)state;
    int n = 0, dev = -1, v = 0;
    /* The runtime initialises itself: no cuInit needed. */
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 1);
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(dev, 0);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDriverGetVersion(&v), cudaSuccess);
    assert_int_equal(v, 13000);
    assert_int_equal(cudaRuntimeGetVersion(&v), cudaSuccess);
    assert_int_equal(v, CUDART_VERSION);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerBlock, 0), cudaSuccess);
    assert_int_equal(v, 1024);
    int least = 9, greatest = 9;
    assert_int_equal(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
    assert_int_equal(least, 0);
    assert_int_equal(greatest, -5);
    /* The runtime made the primary context current on this thread. */
    CUcontext c = NULL, primary = NULL;
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    assert_ptr_equal(c, primary);
    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);

    assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetDevice(NULL), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
}

/* ---- the last error ---- */

static void last_error_get_clears_peek_does_not(void **state)
{
    (void)state;
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaSetDevice(3), cudaErrorInvalidDevice);
    /* A later success does not overwrite it. */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    /* The most recent error wins. */
    void *p = NULL;
    assert_int_equal(cudaSetDevice(3), cudaErrorInvalidDevice);
    assert_int_equal(cudaMemcpy(&p, &p, 1, (enum cudaMemcpyKind)9),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
}

static void *other_thread_errors(void *arg)
{
    (void)arg;
    /* Each thread has its own last error, and its own context made current. */
    cudaError_t first = cudaGetLastError();
    void *p = NULL;
    cudaError_t m = cudaMalloc(&p, 4096);
    cudaError_t f = cudaFree(p);
    cudaError_t bad = cudaSetDevice(7);
    return (void *)(intptr_t)(first == cudaSuccess && m == cudaSuccess && f == cudaSuccess &&
                              bad == cudaErrorInvalidDevice &&
                              cudaGetLastError() == cudaErrorInvalidDevice);
}

static void last_error_and_context_are_per_thread(void **state)
{
    (void)state;
    assert_int_equal(cudaSetDevice(5), cudaErrorInvalidDevice);
    pthread_t th;
    void *ok = NULL;
    assert_int_equal(pthread_create(&th, NULL, other_thread_errors, NULL), 0);
    assert_int_equal(pthread_join(th, &ok), 0);
    assert_true(ok == (void *)1);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
}

/* ---- memory ---- */

static void malloc_free_and_mem_get_info(void **state)
{
    (void)state;
    size_t f0 = 0, total = 0, f1 = 0;
    assert_int_equal(cudaMemGetInfo(&f0, &total), cudaSuccess);
    assert_int_equal(total, 1024 * MiB);
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, 3 * MiB), cudaSuccess);
    assert_non_null(p);
    assert_int_equal(cudaMemGetInfo(&f1, &total), cudaSuccess);
    assert_int_equal(f0 - f1, 3 * MiB);
    assert_int_equal(cudaFree(p), cudaSuccess);
    assert_int_equal(cudaMemGetInfo(&f1, &total), cudaSuccess);
    assert_int_equal(f1, f0);
    int local;
    assert_int_equal(cudaFree(&local), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaMalloc(&p, 2048 * MiB), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);

    /* Pinned host memory. */
    void *h1 = NULL, *h2 = NULL;
    assert_int_equal(cudaMallocHost(&h1, 5000), cudaSuccess);
    assert_int_equal(cudaHostAlloc(&h2, 5000, cudaHostAllocMapped | cudaHostAllocPortable),
                     cudaSuccess);
    memset(h1, 1, 5000);
    memset(h2, 2, 5000);
    assert_int_equal(cudaFreeHost(h1), cudaSuccess);
    assert_int_equal(cudaFreeHost(h2), cudaSuccess);
    assert_int_equal(cudaFreeHost(h2), cudaErrorInvalidValue);
    assert_int_equal(cudaHostAlloc(&h1, 16, 0x100), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
}

static void stream_ordered_allocation(void **state)
{
    (void)state;
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    void *p = NULL;
    assert_int_equal(cudaMallocAsync(&p, 4096, s), cudaSuccess);
    assert_non_null(p);
    assert_int_equal(cudaMemsetAsync(p, 0x3c, 4096, s), cudaSuccess);
    unsigned char back[4096];
    assert_int_equal(cudaMemcpyAsync(back, p, sizeof back, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(back[i], 0x3c);
    assert_int_equal(cudaFreeAsync(NULL, s), cudaSuccess);
    void *z = (void *)&p;
    assert_int_equal(cudaMallocAsync(&z, 0, s), cudaSuccess);
    assert_null(z);
    assert_int_equal(cudaMallocAsync(NULL, 16, s), cudaErrorInvalidValue);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&p, 16, s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

static void memcpy_every_kind_and_a_bad_one(void **state)
{
    (void)state;
    enum { N = 3000 };
    char *src = malloc(N), *dst = malloc(N);
    assert_non_null(src);
    assert_non_null(dst);
    for (int i = 0; i < N; i++)
        src[i] = (char)(i * 13);
    void *a = NULL, *b = NULL;
    assert_int_equal(cudaMalloc(&a, N), cudaSuccess);
    assert_int_equal(cudaMalloc(&b, N), cudaSuccess);
    assert_int_equal(cudaMemcpy(a, src, N, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(b, a, N, cudaMemcpyDeviceToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dst, b, N, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(src, dst, N);
    memset(dst, 0, N);
    assert_int_equal(cudaMemcpy(dst, src, N, cudaMemcpyHostToHost), cudaSuccess);
    assert_memory_equal(src, dst, N);
    memset(dst, 0, N);
    assert_int_equal(cudaMemset(b, 0, N), cudaSuccess);
    assert_int_equal(cudaMemcpy(b, a, N / 2, cudaMemcpyDefault), cudaSuccess);
    assert_int_equal(cudaMemcpy(dst, b, N, cudaMemcpyDefault), cudaSuccess);
    assert_memory_equal(src, dst, N / 2);
    for (int i = N / 2; i < N; i++)
        assert_int_equal(dst[i], 0);

    /* A direction that is not a cudaMemcpyKind. */
    memset(dst, 0, N);
    assert_int_equal(cudaMemcpy(dst, a, N, (enum cudaMemcpyKind)5),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemcpy(dst, a, N, (enum cudaMemcpyKind) - 1),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemcpyAsync(dst, a, N, (enum cudaMemcpyKind)7, NULL),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < N; i++)
        assert_int_equal(dst[i], 0);

    /* Asynchronous, on a stream. */
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMemsetAsync(a, 0x7e, 10, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dst, a, N, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    for (int i = 0; i < 10; i++)
        assert_int_equal(dst[i], 0x7e);
    assert_memory_equal(dst + 10, src + 10, N - 10);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);

    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaFree(b), cudaSuccess);
    free(src);
    free(dst);
}

/* ---- streams and events ---- */

static void streams_and_events(void **state)
{
    (void)state;
    setup_kernels();
    cudaStream_t s = NULL, t = NULL;
    assert_int_equal(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -9), cudaSuccess);
    int prio = 9;
    unsigned flags = 9;
    assert_int_equal(cudaStreamGetPriority(s, &prio), cudaSuccess);
    assert_int_equal(prio, -5);
    assert_int_equal(cudaStreamGetFlags(s, &flags), cudaSuccess);
    assert_int_equal(flags, cudaStreamNonBlocking);
    assert_int_equal(cudaStreamCreate(&t), cudaSuccess);
    assert_int_equal(cudaStreamGetFlags(t, &flags), cudaSuccess);
    assert_int_equal(flags, cudaStreamDefault);
    enum cudaStreamCaptureStatus cs = (enum cudaStreamCaptureStatus)9;
    assert_int_equal(cudaStreamIsCapturing(s, &cs), cudaSuccess);
    assert_int_equal(cs, cudaStreamCaptureStatusNone);

    cudaEvent_t e0 = NULL, e1 = NULL, nt = NULL;
    assert_int_equal(cudaEventCreate(&e0), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&e1, cudaEventBlockingSync), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming), cudaSuccess);

    int *out = NULL;
    assert_int_equal(cudaMallocHost((void **)&out, sizeof(int)), cudaSuccess);
    *out = 0;
    int a = 40;
    double b = 2.9;
    void *args[] = {&out, &a, &b};
    assert_int_equal(cudaEventRecord(e0, s), cudaSuccess);
    assert_int_equal(cudaLaunchKernel((const void *)k_add_slow, one, one, args, 0, s), cudaSuccess);
    assert_int_equal(cudaEventRecord(e1, s), cudaSuccess);
    assert_int_equal(cudaEventRecord(nt, s), cudaSuccess);
    float ms = -1;
    assert_int_equal(cudaEventQuery(e1), cudaErrorNotReady);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e1), cudaErrorNotReady);
    /* Not-ready is not an error. */
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    /* The other stream waits for the event. */
    assert_int_equal(cudaStreamWaitEvent(t, e1, 0), cudaSuccess);
    int copy = -1;
    assert_int_equal(cudaMemcpyAsync(&copy, out, sizeof copy, cudaMemcpyHostToHost, t),
                     cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(t), cudaSuccess);
    assert_int_equal(copy, 42);
    assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
    assert_int_equal(cudaEventQuery(e1), cudaSuccess);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    assert_true(ms >= 80);
    assert_true(ms < 80 + 400);
    assert_int_equal(cudaEventElapsedTime(&ms, e0, nt), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);

    assert_int_equal(cudaEventDestroy(e0), cudaSuccess);
    assert_int_equal(cudaEventDestroy(e1), cudaSuccess);
    assert_int_equal(cudaEventDestroy(nt), cudaSuccess);
    assert_int_equal(cudaEventDestroy(nt), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(t), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamCreateWithFlags(&s, 0x10), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFreeHost(out), cudaSuccess);
}

static int host_fn_value;

static void CUDART_CB host_fn(void *user)
{
    host_fn_value = *(int *)user;
}

static void host_function_and_device_synchronize(void **state)
{
    (void)state;
    setup_kernels();
    int *out = NULL;
    assert_int_equal(cudaMallocHost((void **)&out, sizeof(int)), cudaSuccess);
    *out = 0;
    host_fn_value = 0;
    int a = 1;
    double b = 6.0;
    void *args[] = {&out, &a, &b};
    double t0 = now_ms();
    assert_int_equal(cudaLaunchKernel((const void *)k_add_slow, one, one, args, 0, NULL),
                     cudaSuccess);
    assert_int_equal(cudaLaunchHostFunc(NULL, host_fn, out), cudaSuccess);
    assert_true(now_ms() - t0 < 60);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_true(now_ms() - t0 >= 80);
    assert_int_equal(*out, 7);
    assert_int_equal(host_fn_value, 7);
    assert_int_equal(cudaLaunchHostFunc(NULL, NULL, NULL), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFreeHost(out), cudaSuccess);
}

/* ---- launches ---- */

static void launch_kernel_by_function_pointer(void **state)
{
    (void)state;
    setup_kernels();
    int *out = NULL;
    assert_int_equal(cudaMalloc((void **)&out, 4 * sizeof(int)), cudaSuccess);
    assert_int_equal(cudaMemset(out, 0, 4 * sizeof(int)), cudaSuccess);
    int a = 100;
    double b = -1.5;
    void *args[] = {&out, &a, &b};
    dim3 grid = {8, 2, 1}, block = {32, 4, 2};
    assert_int_equal(cudaLaunchKernel((const void *)k_add, grid, block, args, 0, NULL),
                     cudaSuccess);
    int back[4] = {-1, -1, -1, -1};
    assert_int_equal(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(back[0], 99);
    assert_int_equal(back[1], 0);

    /* Cooperative launch. */
    int *out1 = out + 1;
    void *args1[] = {&out1, &a, &b};
    assert_int_equal(cudaLaunchCooperativeKernel((const void *)k_add, one, one, args1, 0, NULL),
                     cudaSuccess);
    assert_int_equal(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(back[1], 99);

    /* A function that was never registered. */
    simcuda_stats_t s0, s1;
    simcuda_get_stats(&s0);
    assert_int_equal(cudaLaunchKernel((const void *)k_unknown, one, one, args, 0, NULL),
                     cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaLaunchKernel(NULL, one, one, args, 0, NULL),
                     cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaLaunchCooperativeKernel((const void *)k_unknown, one, one, args, 0, NULL),
                     cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    simcuda_get_stats(&s1);
    assert_int_equal(s1.launches, s0.launches);
    assert_int_equal(cudaFree(out), cudaSuccess);
}

static void launch_through_the_cuda13_stub_entry_points(void **state)
{
    (void)state;
    setup_kernels();
    cudaKernel_t k = NULL;
    assert_int_equal(__cudaGetKernel(&k, (const void *)k_add), cudaSuccess);
    assert_non_null(k);
    assert_ptr_equal((void *)k, (void *)simcuda_function(k_add));
    int *out = NULL;
    assert_int_equal(cudaMallocHost((void **)&out, sizeof(int)), cudaSuccess);
    *out = 0;
    int a = 5;
    double b = 0.5;
    void *args[] = {&out, &a, &b};
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(__cudaLaunchKernel(k, one, one, args, 0, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(*out, 5);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);

    cudaKernel_t none = (cudaKernel_t)&k;
    assert_int_equal(__cudaGetKernel(&none, (const void *)k_unknown),
                     cudaErrorInvalidDeviceFunction);
    assert_null(none);
    assert_int_equal(__cudaGetKernel(NULL, (const void *)k_add), cudaErrorInvalidValue);
    assert_int_equal(__cudaLaunchKernel(NULL, one, one, args, 0, NULL),
                     cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);

    /* cudaGetFuncBySymbol gives the driver's handle for the same kernel. */
    cudaFunction_t f = NULL;
    assert_int_equal(cudaGetFuncBySymbol(&f, (const void *)k_add), cudaSuccess);
    assert_ptr_equal((void *)f, (void *)simcuda_function(k_add));
    const char *name = NULL;
    assert_int_equal(cuFuncGetName(&name, (CUfunction)f), CUDA_SUCCESS);
    assert_string_equal(name, "k_add");
    f = (cudaFunction_t)&k;
    assert_int_equal(cudaGetFuncBySymbol(&f, (const void *)k_unknown),
                     cudaErrorInvalidDeviceFunction);
    assert_null(f);
    assert_int_equal(cudaGetFuncBySymbol(NULL, (const void *)k_add), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFreeHost(out), cudaSuccess);
}

/* ---- error strings ---- */

static void error_strings(void **state)
{
    (void)state;
    static const struct {
        cudaError_t e;
        const char *name, *text;
    } want[] = {
#define E(code, text) {code, #code, text}
        E(cudaSuccess, "no error"),
        E(cudaErrorInvalidValue, "invalid argument"),
        E(cudaErrorMemoryAllocation, "out of memory"),
        E(cudaErrorInvalidDeviceFunction, "invalid device function"),
        E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
        E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
#undef E
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        assert_string_equal(cudaGetErrorName(want[i].e), want[i].name);
        assert_string_equal(cudaGetErrorString(want[i].e), want[i].text);
    }
    assert_string_equal(cudaGetErrorString(cudaErrorNotReady), "device not ready");
    assert_string_equal(cudaGetErrorString(cudaErrorInvalidResourceHandle),
                        "invalid resource handle");
    assert_string_equal(cudaGetErrorString(cudaErrorNotSupported), "operation not supported");
    assert_string_equal(cudaGetErrorName((cudaError_t)123456), "unrecognized error code");
    assert_string_equal(cudaGetErrorString((cudaError_t)123456), "unrecognized error code");
}

/* cuda_runtime_api.h, cudaGetErrorName: "Returns a string containing the name
 * of an error code in the enum" — the cudaError enum, whose names are
 * cudaError..., also for codes that share their value with a CUresult. */
static void error_names_are_the_runtime_enum_names(void **state)
{
    (void)state;
    static const struct {
        cudaError_t e;
        const char *name;
    } want[] = {
#define E(code) {code, #code}
        E(cudaErrorNotReady),
        E(cudaErrorInvalidResourceHandle),
        E(cudaErrorInvalidDevice),
        E(cudaErrorNotSupported),
        E(cudaErrorInitializationError),
        E(cudaErrorHostMemoryAlreadyRegistered),
#undef E
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *got = cudaGetErrorName(want[i].e);
        if (!got || strcmp(got, want[i].name) != 0) {
            print_error("cudaGetErrorName(%d) = \"%s\", want \"%s\"\n", (int)want[i].e,
                        got ? got : "(null)", want[i].name);
            wrong++;
        }
    }
    assert_int_equal(wrong, 0);
}

/* ---- what the runtime does not implement ---- */

static void unimplemented_calls_are_refused_loudly(void **state)
{
    (void)state;
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    void *pitched = NULL;
    size_t pitch = 0;
    struct cudaPitchedPtr p = {0};
    cudaGraph_t g = NULL;
    struct capture c;
    char err[2048];
    capture_begin(&c);
    cudaError_t r1 = cudaMalloc3D(&p, (struct cudaExtent){256, 16, 2});
    cudaError_t r2 = cudaGraphCreate(&g, 0);
    cudaError_t r3 = cudaMallocPitch(&pitched, &pitch, 256, 16);
    capture_end(&c, err, sizeof err);
    assert_int_equal(r1, cudaErrorNotSupported);
    assert_int_equal(r1, 801);
    assert_int_equal(r2, cudaErrorNotSupported);
    assert_int_equal(r3, cudaErrorNotSupported);
    assert_null(p.ptr);
    assert_null(g);
    assert_null(pitched);
    assert_non_null(strstr(err, "cudaMalloc3D"));
    assert_non_null(strstr(err, "cudaGraphCreate"));
    assert_non_null(strstr(err, "cudaMallocPitch"));
    assert_int_equal(cudaGetLastError(), cudaErrorNotSupported);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
}

/* Deprecated declarations are declarations: a program calling one must get
 * cudaErrorNotSupported, not fail to load. */
static void deprecated_calls_are_refused_loudly_too(void **state)
{
    (void)state;
    void *lib = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
    assert_non_null(lib);
    static const char *const names[] = {
        "cudaGetDriverEntryPoint",      "cudaMemcpyToArray",
        "cudaMemcpyFromArray",          "cudaMemcpyArrayToArray",
        "cudaDeviceSetSharedMemConfig", "cudaFuncSetSharedMemConfig",
    };
    int missing = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        if (!dlsym(lib, names[i])) {
            print_error("%s is declared in cuda_runtime_api.h but libcudart.so.13 does not "
                        "define it\n",
                        names[i]);
            missing++;
        }
    }
    dlclose(lib);
    assert_int_equal(missing, 0);
}

int main(void)
{
    static const char *const env[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                      "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                      "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_queries),
        cmocka_unit_test(last_error_get_clears_peek_does_not),
        cmocka_unit_test(last_error_and_context_are_per_thread),
        cmocka_unit_test(malloc_free_and_mem_get_info),
        cmocka_unit_test(stream_ordered_allocation),
        cmocka_unit_test(memcpy_every_kind_and_a_bad_one),
        cmocka_unit_test(streams_and_events),
        cmocka_unit_test(host_function_and_device_synchronize),
        cmocka_unit_test(launch_kernel_by_function_pointer),
        cmocka_unit_test(launch_through_the_cuda13_stub_entry_points),
        cmocka_unit_test(error_strings),
        cmocka_unit_test(error_names_are_the_runtime_enum_names),
        cmocka_unit_test(unimplemented_calls_are_refused_loudly),
        cmocka_unit_test(deprecated_calls_are_refused_loudly_too),
    };
    return cmocka_run_group_tests_name("sim_runtime", tests, NULL, NULL);
}
