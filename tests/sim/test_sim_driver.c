/* test_sim_driver.c — the simulated driver's front: initialisation, the one
 * device and its attributes, the primary context and the per-thread current
 * context, error strings, cuGetProcAddress, kernels' parameter layout,
 * launches and the loud refusal of calls the simulator does not implement.
 *
 * The first test runs before anything calls cuInit. This program defines its
 * own cuMemAlloc (cuMemAlloc_v2), as an interposer would, to check that
 * cuGetProcAddress hands out the driver's own definition past it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

#define MiB (1024ull * 1024)

/* ---- the interposer ---- */

static int interposed_calls;

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    static CUresult (*real)(CUdeviceptr *, size_t);
    interposed_calls++;
    if (!real) {
        void *p = NULL;
        if (cuGetProcAddress("cuMemAlloc", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) !=
                CUDA_SUCCESS ||
            !p || p == (void *)cuMemAlloc)
            return CUDA_ERROR_NOT_FOUND; /* never recurse into ourselves */
        real = (CUresult(*)(CUdeviceptr *, size_t))p;
    }
    return real(dptr, bytesize);
}

/* ---- helpers ---- */

#include "capture.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *libcuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    assert_non_null(h);
    return h;
}

/* ---- kernels ---- */

/* (int *dst, int value): *dst = value */
static void k_store(void **args)
{
    int *dst = *(int **)args[0];
    *dst = *(int *)args[1];
}

static _Atomic int once_calls;
static _Atomic pthread_t once_thread;

/* (int *dst): counts its calls and notes the thread it ran on */
static void k_once(void **args)
{
    (void)args;
    once_calls++;
    once_thread = pthread_self();
}

/* (char, int, double, short, void *, float): nothing, only the layout matters */
static void k_layout(void **args)
{
    (void)args;
}

/* (int *dst, int value) after a delay: lets the caller change its arguments
 * while the launch is still queued */
static void k_store_slow(void **args)
{
    k_store(args);
}

static void k_never_registered(void **args)
{
    (void)args;
}

static const size_t store_sizes[] = {sizeof(int *), sizeof(int)};

static CUcontext ctx;

/* cuInit, the primary context current on this thread, kernels registered. */
static void need_ctx(void)
{
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    if (!ctx) {
        assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        assert_non_null(ctx);
        assert_int_equal(simcuda_register_kernel(k_store, "k_store", 2, store_sizes, 1), 0);
        assert_int_equal(simcuda_register_kernel(k_once, "k_once", 1, store_sizes, 1), 0);
        assert_int_equal(
            simcuda_register_kernel(k_store_slow, "k_store_slow", 2, store_sizes, 100 * 1000), 0);
    }
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

/* ---- initialisation (must run first) ---- */

static void before_init_calls_return_not_initialized(void **state)
{
    (void)state;
    int n = -1, v = -1;
    CUdevice dev = -1;
    CUcontext c = NULL;
    CUdeviceptr d = 0;
    size_t sz = 0, sz2 = 0;
    CUstream s = NULL;
    CUevent e = NULL;
    CUmemGenericAllocationHandle h = 0;
    void *p = NULL;
    char name[64];
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};

    assert_int_equal(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(n, -1);
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuDeviceGetName(name, sizeof name, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuDeviceTotalMem(&sz, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
        CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuDevicePrimaryCtxRetain(&c, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuCtxSetCurrent(NULL), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuCtxSynchronize(), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuMemGetInfo(&sz, &sz2), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuMemHostAlloc(&p, 4096, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuMemAddressReserve(&d, 2 * MiB, 0, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuMemGetAllocationGranularity(&sz, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuEventCreate(&e, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
                     CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuFuncGetParamInfo(NULL, 0, &sz, NULL), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(d, 0);
    assert_null(p);

    /* The version needs no initialisation. */
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
    assert_int_equal(v, 13000);
    assert_int_equal(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);

    /* Flags must be 0, and a refused cuInit initialises nothing. */
    assert_int_equal(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuInit(0xffffffffu), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);

    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGetCount(&n), CUDA_SUCCESS);
    assert_int_equal(n, 1);
    /* Still no context on this thread. */
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_null(c);
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_ERROR_INVALID_CONTEXT);
}

/* ---- the device ---- */

static void device_enumeration(void **state)
{
    (void)state;
    need_ctx();
    int n = 0;
    CUdevice dev = -1;
    assert_int_equal(cuDeviceGetCount(&n), CUDA_SUCCESS);
    assert_int_equal(n, 1);
    assert_int_equal(cuDeviceGetCount(NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(dev, 0);
    dev = 7;
    assert_int_equal(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(dev, 7);
    assert_int_equal(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);

    char name[128] = "";
    assert_int_equal(cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
    assert_true(strlen(name) > 0);
    assert_int_equal(cuDeviceGetName(name, sizeof name, 1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDeviceGetName(NULL, 10, 0), CUDA_ERROR_INVALID_VALUE);

    size_t total = 0;
    assert_int_equal(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
    assert_int_equal(total, 1024 * MiB);
    assert_int_equal(cuDeviceTotalMem(&total, 1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDeviceTotalMem(NULL, 0), CUDA_ERROR_INVALID_VALUE);
}

static void device_attributes(void **state)
{
    (void)state;
    need_ctx();
    static const struct {
        CUdevice_attribute attr;
        int value;
    } want[] = {
        {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0},
        {CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
        {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int v = -12345;
        assert_int_equal(cuDeviceGetAttribute(&v, want[i].attr, 0), CUDA_SUCCESS);
        assert_int_equal(v, want[i].value);
    }

    int v = -12345;
    assert_int_equal(
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1),
        CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuDeviceGetAttribute(&v, (CUdevice_attribute)0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(v, -12345);

    /* An attribute the simulator does not model is refused, loudly. */
    struct capture c;
    char err[512];
    capture_begin(&c);
    CUresult r = cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 0);
    capture_end(&c, err, sizeof err);
    assert_int_equal(r, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(v, -12345);
    assert_non_null(strstr(err, "cuDeviceGetAttribute"));
    char num[16];
    snprintf(num, sizeof num, "%d", (int)CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH);
    assert_non_null(strstr(err, num));
}

/* ---- contexts ---- */

static void primary_context_retain_release(void **state)
{
    (void)state;
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    CUcontext a = NULL, b = NULL;
    unsigned flags = 99;
    int active = -1;
    /* Start from whatever earlier tests retained: bring it to zero. */
    while (cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS)
        ;
    assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    assert_int_equal(active, 0);
    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);

    assert_int_equal(cuDevicePrimaryCtxRetain(&a, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&b, 0), CUDA_SUCCESS);
    assert_non_null(a);
    assert_ptr_equal(a, b);
    assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    assert_int_equal(flags, 0);
    assert_int_equal(active, 1);
    assert_int_equal(cuDevicePrimaryCtxRetain(&a, 1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDevicePrimaryCtxRetain(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_ERROR_INVALID_DEVICE);

    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    assert_int_equal(active, 1);
    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    assert_int_equal(active, 0);
    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);

    /* Keep one reference for the rest of the program. */
    assert_int_equal(cuDevicePrimaryCtxRetain(&a, 0), CUDA_SUCCESS);
    if (ctx)
        assert_ptr_equal(a, ctx);
}

static void set_get_push_pop_current(void **state)
{
    (void)state;
    need_ctx();
    CUcontext c = NULL;
    CUdevice dev = -1;
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);
    assert_int_equal(cuCtxGetCurrent(NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCtxGetDevice(&dev), CUDA_SUCCESS);
    assert_int_equal(dev, 0);

    int bogus = 0;
    assert_int_equal(cuCtxSetCurrent((CUcontext)&bogus), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);

    c = NULL;
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_null(c);
    assert_int_equal(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPushCurrent(ctx), CUDA_SUCCESS);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);

    assert_int_equal(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_null(c);
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);

    int least = 99, greatest = 99;
    assert_int_equal(cuCtxGetStreamPriorityRange(&least, &greatest), CUDA_SUCCESS);
    assert_int_equal(least, 0);
    assert_int_equal(greatest, -5);
}

struct thread_result {
    CUcontext seen;
    CUresult r[16];
    int value;
};

/* A thread that has never made a context current. */
static void *contextless_thread(void *arg)
{
    struct thread_result *t = arg;
    CUdeviceptr d = 0;
    size_t a, b;
    void *p = NULL;
    CUstream s = NULL;
    CUevent e = NULL;
    CUdevice dev;
    int v = 5;
    int *slot = &t->value;
    void *args[] = {&slot, &v};
    t->seen = (CUcontext)&t; /* any non-NULL value, overwritten below */
    t->r[0] = cuCtxGetCurrent(&t->seen);
    t->r[1] = cuMemAlloc(&d, 4096);
    t->r[2] = cuCtxSynchronize();
    t->r[3] = cuStreamCreate(&s, 0);
    t->r[4] = cuEventCreate(&e, 0);
    t->r[5] = cuMemGetInfo(&a, &b);
    t->r[6] = cuMemHostAlloc(&p, 4096, 0);
    t->r[7] = cuLaunchKernel(simcuda_function(k_store), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    t->r[8] = cuMemcpyHtoD((CUdeviceptr)(uintptr_t)&v, &v, sizeof v);
    t->r[9] = cuCtxGetDevice(&dev);
    t->r[10] = cuStreamSynchronize(NULL);
    /* Once it makes the context current, the same calls work. */
    t->r[11] = cuCtxSetCurrent(ctx);
    t->r[12] = cuMemAlloc(&d, 4096);
    t->r[13] = cuLaunchKernel(simcuda_function(k_store), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    t->r[14] = cuCtxSynchronize();
    t->r[15] = cuMemFree(d);
    return NULL;
}

static void current_context_is_per_thread(void **state)
{
    (void)state;
    need_ctx();
    struct thread_result t = {.value = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, contextless_thread, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(t.r[0], CUDA_SUCCESS);
    assert_null(t.seen);
    for (int i = 1; i <= 10; i++)
        assert_int_equal(t.r[i], CUDA_ERROR_INVALID_CONTEXT);
    for (int i = 11; i <= 15; i++)
        assert_int_equal(t.r[i], CUDA_SUCCESS);
    assert_int_equal(t.value, 5);
    /* This thread's context is untouched. */
    CUcontext c = NULL;
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);
}

static void context_synchronize_waits_for_work(void **state)
{
    (void)state;
    need_ctx();
    int *cell = calloc(1, sizeof *cell);
    assert_non_null(cell);
    int v = 77;
    void *args[] = {&cell, &v};
    double t0 = now_ms();
    assert_int_equal(
        cuLaunchKernel(simcuda_function(k_store_slow), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL),
        CUDA_SUCCESS);
    assert_true(now_ms() - t0 < 80); /* the launch itself does not wait */
    assert_int_equal(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_true(now_ms() - t0 >= 99);
    assert_int_equal(*cell, 77);
    free(cell);
}

/* ---- error strings ---- */

static void error_strings_and_names(void **state)
{
    (void)state;
    static const struct {
        CUresult code;
        const char *name, *text;
    } want[] = {
#define E(code, text) {code, #code, text}
        E(CUDA_SUCCESS, "no error"),
        E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
        E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
        E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
        E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
        E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
        E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
        E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
        E(CUDA_ERROR_NOT_READY, "device not ready"),
        E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
        E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
        E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
          "part or all of the requested memory range is already mapped"),
        E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
          "pointer does not correspond to a registered memory region"),
#undef E
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *s = NULL;
        assert_int_equal(cuGetErrorName(want[i].code, &s), CUDA_SUCCESS);
        assert_non_null(s);
        assert_string_equal(s, want[i].name);
        s = NULL;
        assert_int_equal(cuGetErrorString(want[i].code, &s), CUDA_SUCCESS);
        assert_non_null(s);
        assert_string_equal(s, want[i].text);
    }
    const char *s = "x";
    assert_int_equal(cuGetErrorName((CUresult)123456, &s), CUDA_ERROR_INVALID_VALUE);
    assert_null(s);
    s = "x";
    assert_int_equal(cuGetErrorString((CUresult)123456, &s), CUDA_ERROR_INVALID_VALUE);
    assert_null(s);
    assert_int_equal(cuGetErrorName(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuGetErrorString(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);
}

/* cuGetErrorName: "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE
 * will be returned" — every code of the CUresult enum is recognised by a driver,
 * and the last three here are codes the simulator itself returns (capture). */
static void error_names_cover_other_enum_codes(void **state)
{
    (void)state;
    static const struct {
        CUresult code;
        const char *name;
    } want[] = {
#define E(code) {code, #code}
        E(CUDA_ERROR_NO_DEVICE),
        E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
        E(CUDA_ERROR_INVALID_IMAGE),
        E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
        E(CUDA_ERROR_ILLEGAL_STATE),
#undef E
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *n = NULL, *t = NULL;
        CUresult rn = cuGetErrorName(want[i].code, &n), rt = cuGetErrorString(want[i].code, &t);
        if (rn != CUDA_SUCCESS || !n || strcmp(n, want[i].name) != 0 || rt != CUDA_SUCCESS || !t) {
            print_error("%s (%d): cuGetErrorName -> %d, cuGetErrorString -> %d\n", want[i].name,
                        (int)want[i].code, (int)rn, (int)rt);
            wrong++;
        }
    }
    assert_int_equal(wrong, 0);
}

/* ---- cuGetProcAddress ---- */

static void proc_address_returns_the_drivers_own_functions(void **state)
{
    (void)state;
    need_ctx();
    void *lib = libcuda();
    void *p = NULL;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;

    assert_int_equal(cuGetProcAddress("cuInit", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st),
                     CUDA_SUCCESS);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    assert_non_null(p);
    assert_ptr_equal(p, dlsym(lib, "cuInit"));

    /* The base name resolves to the current ABI version ... */
    p = NULL;
    st = (CUdriverProcAddressQueryResult)99;
    assert_int_equal(cuGetProcAddress("cuMemAlloc", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st),
                     CUDA_SUCCESS);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    assert_non_null(dlsym(lib, "cuMemAlloc_v2"));
    assert_ptr_equal(p, dlsym(lib, "cuMemAlloc_v2"));
    /* ... the driver's, not this program's interposer. */
    assert_true(p != (void *)cuMemAlloc);
    int before = interposed_calls;
    CUdeviceptr d = 0;
    assert_int_equal(((CUresult(*)(CUdeviceptr *, size_t))p)(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(interposed_calls, before);
    assert_true(d != 0);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    /* And a plain call goes through the interposer. */
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(interposed_calls, before + 1);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);

    p = NULL;
    assert_int_equal(cuGetProcAddress("cuStreamDestroy", &p, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(lib, "cuStreamDestroy_v2"));
    p = NULL;
    assert_int_equal(cuGetProcAddress("cuLaunchKernel", &p, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(p, (void *)cuLaunchKernel);

    /* Unknown names: cuda.h, cuGetProcAddress: "The API will return
     * CUDA_SUCCESS and set the returned pfn to NULL if [...] the driver
     * symbol is invalid." */
    p = (void *)&d;
    st = (CUdriverProcAddressQueryResult)99;
    assert_int_equal(cuGetProcAddress("cuNoSuchFunction", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_null(p);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    assert_int_equal(cuGetProcAddress(NULL, &p, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuGetProcAddress("cuInit", NULL, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    dlclose(lib);
}

/* "If the specified CUDA version is greater than the driver version, the API
 * will return CUDA_ERROR_INVALID_VALUE." (cuda.h, cuGetProcAddress) */
static void proc_address_version_above_driver_is_invalid_value(void **state)
{
    (void)state;
    need_ctx();
    void *p = NULL;
    assert_int_equal(cuGetProcAddress("cuMemAlloc", &p, 13010, 0, NULL), CUDA_ERROR_INVALID_VALUE);
}

/* ---- kernels and launches ---- */

static void param_info_follows_natural_alignment(void **state)
{
    (void)state;
    need_ctx();
    const size_t sizes[] = {1, 4, 8, 2, 8, 4, 1, 2};
    const size_t offsets[] = {0, 4, 8, 16, 24, 32, 36, 38};
    assert_int_equal(simcuda_register_kernel(k_layout, "k_layout", 8, sizes, 1), 0);
    CUfunction f = simcuda_function(k_layout);
    assert_non_null(f);
    for (size_t i = 0; i < 8; i++) {
        size_t off = 999, sz = 999;
        assert_int_equal(cuFuncGetParamInfo(f, i, &off, &sz), CUDA_SUCCESS);
        assert_int_equal(off, offsets[i]);
        assert_int_equal(sz, sizes[i]);
        off = 999;
        assert_int_equal(cuFuncGetParamInfo(f, i, &off, NULL), CUDA_SUCCESS);
        assert_int_equal(off, offsets[i]);
    }
    size_t off = 999;
    assert_int_equal(cuFuncGetParamInfo(f, 8, &off, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuFuncGetParamInfo(f, (size_t)-1, &off, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(off, 999);
    assert_int_equal(cuFuncGetParamInfo(f, 0, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuFuncGetParamInfo(NULL, 0, &off, NULL), CUDA_ERROR_INVALID_HANDLE);

    const char *name = NULL;
    assert_int_equal(cuFuncGetName(&name, f), CUDA_SUCCESS);
    assert_string_equal(name, "k_layout");
    name = NULL; /* the kernel handle of the same kernel names it too */
    assert_int_equal(cuKernelGetName(&name, (CUkernel)f), CUDA_SUCCESS);
    assert_string_equal(name, "k_layout");
    assert_int_equal(cuKernelGetName(&name, NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuKernelGetName(NULL, (CUkernel)f), CUDA_ERROR_INVALID_VALUE);

    /* Registering again replaces the layout; the handle stays. */
    const size_t two[] = {4, 8};
    assert_int_equal(simcuda_register_kernel(k_layout, "k_layout2", 2, two, 1), 0);
    assert_ptr_equal(simcuda_function(k_layout), f);
    assert_int_equal(cuFuncGetParamInfo(f, 1, &off, NULL), CUDA_SUCCESS);
    assert_int_equal(off, 8);
    assert_int_equal(cuFuncGetParamInfo(f, 2, &off, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuFuncGetName(&name, f), CUDA_SUCCESS);
    assert_string_equal(name, "k_layout2");
}

static void kernel_registration_errors(void **state)
{
    (void)state;
    const size_t zero[] = {8, 0};
    assert_int_equal(simcuda_register_kernel(NULL, "x", 0, NULL, 0), -1);
    assert_int_equal(simcuda_register_kernel(k_layout, "x", 2, zero, 0), -1);
    assert_int_equal(simcuda_register_kernel(k_layout, "x", 1, NULL, 0), -1);
    assert_null(simcuda_function(k_never_registered));
    /* A refused registration leaves the earlier one in place. */
    size_t off = 0;
    need_ctx();
    assert_int_equal(cuFuncGetParamInfo(simcuda_function(k_layout), 1, &off, NULL), CUDA_SUCCESS);
    assert_int_equal(off, 8);
}

static void launches_run_the_kernel_with_its_arguments(void **state)
{
    (void)state;
    need_ctx();
    CUfunction f = simcuda_function(k_store);
    assert_non_null(f);
    CUdeviceptr d = 0;
    CUstream s = NULL;
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD32(d, 0, 1024), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    simcuda_stats_t s0, s1;
    simcuda_get_stats(&s0);

    int *dst0 = (int *)(uintptr_t)d, *dst1 = dst0 + 1, *dst2 = dst0 + 2;
    int v0 = 1234, v1 = -99, v2 = 0x7fffffff;
    void *a0[] = {&dst0, &v0}, *a1[] = {&dst1, &v1}, *a2[] = {&dst2, &v2};
    assert_int_equal(cuLaunchKernel(f, 2, 3, 4, 8, 8, 16, 0, NULL, a0, NULL), CUDA_SUCCESS);
    CUlaunchConfig cfg = {.gridDimX = 3,
                          .gridDimY = 1,
                          .gridDimZ = 1,
                          .blockDimX = 64,
                          .blockDimY = 1,
                          .blockDimZ = 1,
                          .hStream = s};
    assert_int_equal(cuLaunchKernelEx(&cfg, f, a1, NULL), CUDA_SUCCESS);
    assert_int_equal(cuLaunchCooperativeKernel(f, 1, 1, 1, 32, 1, 1, 0, s, a2), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);

    int out[4] = {-1, -1, -1, -1};
    assert_int_equal(cuMemcpyDtoH(out, d, sizeof out), CUDA_SUCCESS);
    assert_int_equal(out[0], 1234);
    assert_int_equal(out[1], -99);
    assert_int_equal(out[2], 0x7fffffff);
    assert_int_equal(out[3], 0);
    simcuda_get_stats(&s1);
    assert_int_equal(s1.launches - s0.launches, 3);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void launch_copies_argument_values_at_launch(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD32(d, 0, 1024), CUDA_SUCCESS);
    int *dst = (int *)(uintptr_t)d;
    int v = 1;
    void *args[] = {&dst, &v};
    assert_int_equal(
        cuLaunchKernel(simcuda_function(k_store_slow), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL),
        CUDA_SUCCESS);
    /* The kernel has not run yet; what it was given must not change. */
    v = 2;
    dst = (int *)(uintptr_t)d + 1;
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    int out[2] = {-1, -1};
    assert_int_equal(cuMemcpyDtoH(out, d, sizeof out), CUDA_SUCCESS);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 0);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void kernel_runs_once_per_launch_on_a_worker_thread(void **state)
{
    (void)state;
    need_ctx();
    once_calls = 0;
    once_thread = pthread_self();
    int dummy = 0;
    int *p = &dummy;
    void *args[] = {&p};
    assert_int_equal(
        cuLaunchKernel(simcuda_function(k_once), 4, 2, 1, 128, 2, 1, 0, NULL, args, NULL),
        CUDA_SUCCESS);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(once_calls, 1);
    pthread_t t = once_thread;
    assert_false(pthread_equal(t, pthread_self()));
}

/* Parameters packed in one buffer (`extra`), at the kernel's offsets, as
 * cuLaunchKernel and a kernel node take them; malformed buffers refused. */
static void packed_parameters(void **state)
{
    (void)state;
    need_ctx();
    CUfunction f = simcuda_function(k_store);
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    struct {
        int *dst;
        int value;
    } buf = {(int *)(uintptr_t)d, 7};
    size_t size = sizeof buf, small = sizeof buf.dst;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra), CUDA_SUCCESS);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(*buf.dst, 7);
    buf.value = 8;
    assert_int_equal(simcuda_launch_unhooked(f, 1, 1, NULL, NULL, extra), CUDA_SUCCESS);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(*buf.dst, 8);
    void *args[] = {&buf.dst, &buf.value};
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, extra),
                     CUDA_ERROR_INVALID_VALUE); /* both */
    void *short_buf[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &small,
                         CU_LAUNCH_PARAM_END};
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, short_buf),
                     CUDA_ERROR_INVALID_VALUE);
    void *no_size[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_END};
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, no_size),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* Texture objects over linear and pitched memory: a kernel reads through
 * one at simcuda_texture_address; arrays are refused, handles die once. */
static void texture_objects(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    CUDA_RESOURCE_DESC res = {.resType = CU_RESOURCE_TYPE_LINEAR};
    res.res.linear.devPtr = d;
    res.res.linear.format = CU_AD_FORMAT_UNSIGNED_INT32;
    res.res.linear.numChannels = 1;
    res.res.linear.sizeInBytes = 4096;
    CUDA_TEXTURE_DESC desc = {0};
    CUtexObject lin = 0, pitched = 0, arr = 0;
    assert_int_equal(cuTexObjectCreate(&lin, &res, &desc, NULL), CUDA_SUCCESS);
    assert_ptr_equal(simcuda_texture_address(lin), (void *)(uintptr_t)d);
    CUDA_RESOURCE_DESC res2 = {.resType = CU_RESOURCE_TYPE_PITCH2D};
    res2.res.pitch2D.devPtr = d + 1024;
    res2.res.pitch2D.width = 16;
    res2.res.pitch2D.height = 4;
    res2.res.pitch2D.pitchInBytes = 512;
    assert_int_equal(cuTexObjectCreate(&pitched, &res2, &desc, NULL), CUDA_SUCCESS);
    assert_true(pitched != lin);
    assert_ptr_equal(simcuda_texture_address(pitched), (void *)(uintptr_t)(d + 1024));
    CUDA_RESOURCE_DESC array = {.resType = CU_RESOURCE_TYPE_ARRAY};
    assert_int_equal(cuTexObjectCreate(&arr, &array, &desc, NULL), CUDA_ERROR_NOT_SUPPORTED);
    res.res.linear.sizeInBytes = 0;
    assert_int_equal(cuTexObjectCreate(&arr, &res, &desc, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuTexObjectCreate(NULL, &res2, &desc, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuTexObjectDestroy(lin), CUDA_SUCCESS);
    assert_null(simcuda_texture_address(lin));
    assert_int_equal(cuTexObjectDestroy(lin), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuTexObjectDestroy(pitched), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void launch_errors(void **state)
{
    (void)state;
    need_ctx();
    CUfunction f = simcuda_function(k_store);
    CUdeviceptr d = 0;
    CUstream dead = NULL;
    assert_int_equal(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD32(d, 0, 1024), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&dead, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(dead), CUDA_SUCCESS);
    int *dst = (int *)(uintptr_t)d;
    int v = 42;
    void *args[] = {&dst, &v};
    simcuda_stats_t s0, s1;
    simcuda_get_stats(&s0);

    assert_int_equal(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(f, 1, 0, 1, 1, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 0, 1, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 0, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 32, 32, 2, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuLaunchKernel((CUfunction)&v, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, dead, args, NULL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuLaunchKernelEx(NULL, f, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CUlaunchConfig cfg = {.gridDimX = 1,
                          .gridDimY = 1,
                          .gridDimZ = 1,
                          .blockDimX = 2048,
                          .blockDimY = 1,
                          .blockDimZ = 1};
    assert_int_equal(cuLaunchKernelEx(&cfg, f, args, NULL), CUDA_ERROR_INVALID_VALUE);
    cfg.blockDimX = 1;
    assert_int_equal(cuLaunchKernelEx(&cfg, NULL, args, NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuLaunchCooperativeKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, args),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchCooperativeKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, args),
                     CUDA_ERROR_INVALID_HANDLE);

    /* An 'extra' list with no buffer in it (packed_parameters has more). */
    void *extra[] = {CU_LAUNCH_PARAM_END};
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra),
                     CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    simcuda_get_stats(&s1);
    assert_int_equal(s1.launches, s0.launches);
    int out = -1;
    assert_int_equal(cuMemcpyDtoH(&out, d, sizeof out), CUDA_SUCCESS);
    assert_int_equal(out, 0);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* Managed memory: the CPU writes it and a copy reads it back; only the
 * documented attach flags are taken; cuMemFree frees it. */
static void managed_memory(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAllocManaged(&d, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAllocManaged(&d, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_HOST), CUDA_SUCCESS);
    ((volatile uint32_t *)(uintptr_t)d)[7] = 0xfeedu;
    uint32_t back = 0;
    assert_int_equal(cuMemcpyDtoH(&back, d + 28, 4), CUDA_SUCCESS);
    assert_int_equal(back, 0xfeedu);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
}

/* ---- what the simulator does not implement ---- */

static void unimplemented_calls_are_refused_loudly(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = 0;
    CUgraph g = NULL;
    CUmodule m = NULL;
    CUmemPoolPtrExportData exported;
    struct capture c;
    char err[2048];
    capture_begin(&c);
    size_t pitch = 0;
    CUresult r1 = cuMemAllocPitch(&d, &pitch, 256, 16, 4);
    CUresult r2 = cuGraphCreate(&g, 0);
    CUresult r3 = cuModuleLoad(&m, "nothing.cubin");
    CUresult r4 = cuMemPoolExportPointer(&exported, d);
    capture_end(&c, err, sizeof err);
    assert_int_equal(r1, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(r1, 801);
    assert_int_equal(r2, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(r3, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(r4, CUDA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(err, "cuMemAllocPitch"));
    assert_non_null(strstr(err, "cuGraphCreate"));
    assert_non_null(strstr(err, "cuModuleLoad"));
    assert_non_null(strstr(err, "cuMemPoolExportPointer"));
    assert_int_equal(d, 0);
    assert_null(g);
    assert_null(m);
}

/* Functions cuda.h declares as deprecated are declared all the same: a program
 * that calls one must get CUDA_ERROR_NOT_SUPPORTED, not fail to load. */
static void deprecated_calls_are_refused_loudly_too(void **state)
{
    (void)state;
    need_ctx();
    void *lib = libcuda();
    static const char *const names[] = {
        "cuCtxAttach",
        "cuCtxDetach",
        "cuDeviceGetProperties",
        "cuDeviceComputeCapability",
        "cuLaunchGrid",
        "cuFuncSetBlockShape",
        "cuCtxSetSharedMemConfig",
        "cuTexRefCreate",
    };
    int missing = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        if (!dlsym(lib, names[i])) {
            print_error("%s is declared in cuda.h but libcuda.so.1 does not define it\n", names[i]);
            missing++;
        }
    }
    assert_int_equal(missing, 0);

    CUresult (*attach)(CUcontext *, unsigned) =
        (CUresult(*)(CUcontext *, unsigned))dlsym(lib, "cuCtxAttach");
    CUcontext c0 = NULL;
    struct capture c;
    char err[512];
    capture_begin(&c);
    CUresult r = attach(&c0, 0);
    capture_end(&c, err, sizeof err);
    assert_int_equal(r, CUDA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(err, "cuCtxAttach"));
    dlclose(lib);
}

int main(void)
{
    static const char *const env[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                      "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                      "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(before_init_calls_return_not_initialized),
        cmocka_unit_test(device_enumeration),
        cmocka_unit_test(device_attributes),
        cmocka_unit_test(primary_context_retain_release),
        cmocka_unit_test(set_get_push_pop_current),
        cmocka_unit_test(current_context_is_per_thread),
        cmocka_unit_test(context_synchronize_waits_for_work),
        cmocka_unit_test(error_strings_and_names),
        cmocka_unit_test(error_names_cover_other_enum_codes),
        cmocka_unit_test(proc_address_returns_the_drivers_own_functions),
        cmocka_unit_test(proc_address_version_above_driver_is_invalid_value),
        cmocka_unit_test(param_info_follows_natural_alignment),
        cmocka_unit_test(kernel_registration_errors),
        cmocka_unit_test(launches_run_the_kernel_with_its_arguments),
        cmocka_unit_test(launch_copies_argument_values_at_launch),
        cmocka_unit_test(kernel_runs_once_per_launch_on_a_worker_thread),
        cmocka_unit_test(launch_errors),
        cmocka_unit_test(packed_parameters),
        cmocka_unit_test(texture_objects),
        cmocka_unit_test(managed_memory),
        cmocka_unit_test(unimplemented_calls_are_refused_loudly),
        cmocka_unit_test(deprecated_calls_are_refused_loudly_too),
    };
    return cmocka_run_group_tests_name("sim_driver", tests, NULL, NULL);
}
