/* test_e2e_contexts.c — a program that creates its own context on the
 * managed device (cuCtxCreate) and runs a slow kernel there, writing a
 * region, while allocations in the primary context evict the region.
 *
 * The kernel reaches the region (a mapping's access is per device), but
 * the primary context's cuCtxSynchronize, which a remap window's drain
 * calls, does not wait for another context's work, on a GPU as on the
 * simulated one. So the eviction must wait for the created context too:
 * without it the simulated GPU faults the kernel whose memory was remapped
 * while it ran, and its writes are lost. Each case runs with the default
 * drain and the tracked one; with nothing off the device before the
 * launch (an unscanned launch) and with something off (a scanned one);
 * with the context created by every route a program has to cuCtxCreate
 * (a direct call, cuGetProcAddress at 12.0 and at the driver's version,
 * cudaGetDriverEntryPointByVersion, dlsym); twice in a row, the first
 * context destroyed before the second is made; and with two devices, the
 * managed one being device 1. A region last written from a context since
 * destroyed still moves (a tracked drain forgets that context's events).
 *
 * Every case runs in a child of its own (this program again, the case
 * named in E2E_CTX_CASE): a fault is sticky to its device.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define MiB       (1ull << 20)
#define REGION_MB 8
#define WORDS     ((REGION_MB * MiB) / 4)
#define SLOW_US   300000 /* far longer than the allocations that evict */
#define MAX_FILL  64

static int preloaded;
static char **saved_argv;

typedef CUresult (*create_v2_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*create_v3_fn)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
typedef CUresult (*create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult (*destroy_fn)(CUcontext);

/* ---- kernels ---- */

/* fill(p, n, v): p[i] = v + i */
static void k_fill(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t v = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = v + (uint32_t)i;
}

static void k_fill_slow(void **a)
{
    k_fill(a);
}

static int register_kernels(void)
{
    size_t fill[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    if (simcuda_register_kernel(k_fill, "fill", 3, fill, 0) != 0)
        return -1;
    return simcuda_register_kernel(k_fill_slow, "fill_slow", 3, fill, SLOW_US);
}

static CUresult fill(simcuda_kernel_fn k, void *p, uint32_t v, CUstream s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &v};
    return cuLaunchKernel(simcuda_function(k), 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

/* ---- the library's control API, looked up ---- */

static int residency(const void *p)
{
    int (*get)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    assert_non_null(get);
    return get(p);
}

/* ---- cuCtxCreate and cuCtxDestroy, by the route E2E_CTX_ROUTE names ---- */

static void *lookup(const char *route, const char *name, int version)
{
    void *f = NULL;
    if (strcmp(route, "proc") == 0 || strcmp(route, "proc13") == 0) {
        CUdriverProcAddressQueryResult q;
        assert_int_equal(cuGetProcAddress(name, &f, version, CU_GET_PROC_ADDRESS_DEFAULT, &q),
                         CUDA_SUCCESS);
    } else if (strcmp(route, "entry") == 0) {
        enum cudaDriverEntryPointQueryResult q;
        assert_int_equal(cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q),
                         cudaSuccess);
    } else {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        assert_non_null(h);
        f = dlsym(h, name);
    }
    assert_non_null(f);
    return f;
}

static int driver_version(void)
{
    int v = 0;
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
    return v;
}

/* A new context on dev, current (pushed) as cuCtxCreate leaves it. At
 * 12.0 cuGetProcAddress gives the _v3 form, from 12.5 the _v4 one
 * (proc13: at the driver's own version). */
static CUcontext create(const char *route, int dev)
{
    CUcontext c = NULL;
    CUresult r;
    int v = driver_version();
    if (strcmp(route, "driver") == 0)
        r = cuCtxCreate(&c, NULL, 0, dev);
    else if (strcmp(route, "proc13") == 0 && v >= 12050)
        r = ((create_v4_fn)lookup(route, "cuCtxCreate", v))(&c, NULL, 0, dev);
    else if (strcmp(route, "proc13") == 0)
        r = ((create_v3_fn)lookup(route, "cuCtxCreate", v))(&c, NULL, 0, 0, dev);
    else if (strcmp(route, "dlsym") == 0)
        r = ((create_v2_fn)lookup(route, "cuCtxCreate_v2", 0))(&c, 0, dev);
    else
        r = ((create_v3_fn)lookup(route, "cuCtxCreate", 12000))(&c, NULL, 0, 0, dev);
    assert_int_equal(r, CUDA_SUCCESS);
    assert_non_null(c);
    return c;
}

static void destroy(const char *route, CUcontext c)
{
    destroy_fn f = strcmp(route, "driver") == 0  ? cuCtxDestroy
                   : strcmp(route, "dlsym") == 0 ? (destroy_fn)lookup(route, "cuCtxDestroy_v2", 0)
                                                 : (destroy_fn)lookup(route, "cuCtxDestroy", 12000);
    assert_int_equal(f(c), CUDA_SUCCESS);
}

/* ---- helpers ---- */

static void check(const void *d, uint32_t v)
{
    uint32_t *h = malloc(WORDS * 4);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, WORDS * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != v + (uint32_t)i;
    free(h);
    assert_int_equal(bad, 0);
}

/* After a fault the context is unusable, but the simulated GPU's memory is
 * this process's: says how many of the kernel's words were lost. */
static void report_lost(const void *d, uint32_t v)
{
    const uint32_t *h = d;
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != v + (uint32_t)i;
    print_error("the kernel failed; %zu of %zu words lost\n", bad, (size_t)WORDS);
}

/* Allocates regions until a is evicted; they go to more[]. */
static int push_out(const void *a, void **more)
{
    int n = 0;
    while (n < MAX_FILL && residency(a) == 1) {
        assert_int_equal(cudaMalloc(&more[n], REGION_MB * MiB), cudaSuccess);
        n++;
    }
    assert_int_equal(residency(a), 0);
    return n;
}

static void free_all(void **more, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(cudaFree(more[i]), cudaSuccess);
}

static void *region(uint32_t v)
{
    void *r = NULL;
    assert_int_equal(cudaMalloc(&r, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(residency(r), 1);
    assert_int_equal(fill(k_fill, r, v, NULL), CUDA_SUCCESS);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    return r;
}

/* ---- the case (a child) ---- */

/* A slow kernel in a context of the program's writes r while allocations
 * in the primary context evict it. scanned: another region is off the
 * device first, so the launch is scanned. */
static void in_flight(const char *route, int dev, int scanned, uint32_t v)
{
    void *more[MAX_FILL], *first[MAX_FILL], *old = NULL;
    int nfirst = 0;
    CUstream s;
    CUcontext popped;
    if (scanned) {
        old = region(1);
        nfirst = push_out(old, first);
    }
    void *r = region(2);
    CUcontext c = create(route, dev);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(fill(k_fill_slow, r, v, s), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    assert_ptr_equal(popped, c);
    int n = push_out(r, more); /* the kernel is still running */
    assert_int_equal(cuCtxPushCurrent(c), CUDA_SUCCESS);
    CUresult done = cuCtxSynchronize();
    if (done != CUDA_SUCCESS)
        report_lost(r, v);
    assert_int_equal(done, CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    destroy(route, c); /* pops it */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    check(r, v);
    if (scanned)
        check(old, 1);
    free_all(more, n);
    free_all(first, nfirst);
    assert_int_equal(cudaFree(r), cudaSuccess);
    if (old)
        assert_int_equal(cudaFree(old), cudaSuccess);
}

/* A region written from a stream of a context since destroyed, then
 * evicted: with a tracked drain it remembers that stream, whose event went
 * with its context; the move must neither wait on it nor lose bytes. */
static void after_destroy(const char *route, int dev)
{
    void *more[MAX_FILL], *first[MAX_FILL];
    CUstream s;
    void *old = region(1);
    int nfirst = push_out(old, first); /* launches are scanned from here */
    void *r = region(2);
    CUcontext c = create(route, dev);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(fill(k_fill, r, 5, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    destroy(route, c);
    /* regions used after r, so that r is the least recently used */
    int n = 0;
    while (n < MAX_FILL && residency(r) == 1) {
        assert_int_equal(cudaMalloc(&more[n], REGION_MB * MiB), cudaSuccess);
        assert_int_equal(fill(k_fill, more[n], 0, NULL), CUDA_SUCCESS);
        n++;
    }
    assert_int_equal(residency(r), 0);
    check(r, 5);
    check(old, 1);
    free_all(more, n);
    free_all(first, nfirst);
    assert_int_equal(cudaFree(r), cudaSuccess);
    assert_int_equal(cudaFree(old), cudaSuccess);
}

static void run_case(const char *name, const char *route)
{
    int dev = getenv("STAGEHAND_GENERAL_DEVICE") ? 1 : 0;
    assert_int_equal(register_kernels(), 0);
    assert_int_equal(cudaSetDevice(dev), cudaSuccess);
    if (strcmp(name, "in-flight") == 0 || strcmp(name, "in-flight-scanned") == 0) {
        in_flight(route, dev, strcmp(name, "in-flight-scanned") == 0, 99);
    } else if (strcmp(name, "after-destroy") == 0) {
        after_destroy(route, dev);
    } else if (strcmp(name, "twice") == 0) {
        in_flight(route, dev, 0, 7); /* its context destroyed ... */
        in_flight(route, dev, 0, 8); /* ... before this one is made */
    } else {
        fail_msg("no case %s", name);
    }
}

static void test_case(void **state)
{
    (void)state;
    const char *name = getenv("E2E_CTX_CASE");
    if (!preloaded || !name)
        skip();
    run_case(name, getenv("E2E_CTX_ROUTE"));
}

/* ---- the parent ---- */

static int rerun(const char *name, const char *drain, const char *route, int several)
{
    char c[64], d[64], r[64];
    snprintf(c, sizeof c, "E2E_CTX_CASE=%s", name);
    snprintf(d, sizeof d, "STAGEHAND_TRANSFER_DRAIN_MODE=%s", drain);
    snprintf(r, sizeof r, "E2E_CTX_ROUTE=%s", route);
    /* after-destroy: least recently used, so the region goes first */
    const char *env[] = {c,
                         d,
                         r,
                         strcmp(name, "after-destroy") == 0 ? "STAGEHAND_POLICY_EVICTION=lru"
                                                            : "STAGEHAND_POLICY_EVICTION=learned",
                         several ? "SIMCUDA_DEVICES=2" : "SIMCUDA_DEVICES=1",
                         several ? "STAGEHAND_GENERAL_DEVICE=1" : NULL,
                         NULL};
    return e2e_rerun(saved_argv, env);
}

static const char *const drains[] = {"device", "tracked"};
static const char *const routes[] = {"driver", "proc", "proc13", "entry", "dlsym"};

#define PARENT()                                                                                   \
    do {                                                                                           \
        if (!preloaded || getenv("E2E_CTX_CASE"))                                                  \
            skip();                                                                                \
    } while (0)

static void test_kernel_in_own_context(void **state)
{
    (void)state;
    PARENT();
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(rerun("in-flight", drains[i], "driver", 0), 0);
        assert_int_equal(rerun("in-flight-scanned", drains[i], "driver", 0), 0);
    }
}

static void test_every_route(void **state)
{
    (void)state;
    PARENT();
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        assert_int_equal(rerun("in-flight", "device", routes[i], 0), 0);
}

static void test_destroyed_then_another(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("twice", "device", "driver", 0), 0);
    assert_int_equal(rerun("twice", "tracked", "proc", 0), 0);
    assert_int_equal(rerun("after-destroy", "tracked", "driver", 0), 0);
    assert_int_equal(rerun("after-destroy", "device", "driver", 0), 0);
}

static void test_several_devices(void **state)
{
    (void)state;
    PARENT();
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(rerun("in-flight", drains[i], "driver", 1), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_CTX_CONFIGURED")) {
        setenv("E2E_CTX_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_CONFIG", "/dev/null", 1); /* the built-in defaults */
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_case),
        cmocka_unit_test(test_kernel_in_own_context),
        cmocka_unit_test(test_every_route),
        cmocka_unit_test(test_destroyed_then_another),
        cmocka_unit_test(test_several_devices),
    };
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_contexts (preloaded)" : "e2e_contexts (disabled)", tests, NULL, NULL);
}
