/* test_sim_contexts.c — contexts a program creates (cuCtxCreate in its
 * versions, cuCtxDestroy) on the simulated GPU: a created context is
 * pushed, has streams of its own (its legacy stream included), and the
 * primary context's cuCtxSynchronize does not wait for them, as on a GPU;
 * its own synchronisation does. Destroying it waits for its work, pops
 * it, invalidates its streams and events, and a thread it is still current
 * to gets
 * CUDA_ERROR_CONTEXT_IS_DESTROYED. cuGetProcAddress hands out the version
 * a caller's CUDA version asks for.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

#include "tests/sim/simcuda.h"

/* The older versions, which cuda.h declares only for the driver's own build. */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                        CUdevice dev);

#define SLOW_US 300000

static atomic_int done;

/* (atomic_int *flag): sets it when the kernel's time is up */
static void k_set(void **args)
{
    atomic_int *f = *(atomic_int **)args[0];
    atomic_store(f, 1);
}

static int setup(void **state)
{
    (void)state;
    size_t sizes[] = {sizeof(void *)};
    if (cuInit(0) != CUDA_SUCCESS || simcuda_register_kernel(k_set, "set", 1, sizes, SLOW_US))
        return -1;
    return 0;
}

static CUcontext current(void)
{
    CUcontext c = NULL;
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    return c;
}

static void launch_slow(CUstream s)
{
    atomic_int *flag = &done;
    void *args[] = {&flag};
    atomic_store(&done, 0);
    assert_int_equal(cuLaunchKernel(simcuda_function(k_set), 1, 1, 1, 1, 1, 1, 0, s, args, NULL),
                     CUDA_SUCCESS);
}

static void test_create_and_destroy(void **state)
{
    (void)state;
    CUcontext p = NULL, c = NULL, c2 = NULL;
    CUdevice dev = -1;
    assert_int_equal(cuDevicePrimaryCtxRetain(&p, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(p), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate_v4(&c, NULL, 0, 0), CUDA_SUCCESS);
    assert_ptr_not_equal(c, p);
    assert_ptr_equal(current(), c); /* pushed */
    assert_int_equal(cuCtxGetDevice(&dev), CUDA_SUCCESS);
    assert_int_equal(dev, 0);
    CUctxCreateParams none = {0};
    assert_int_equal(cuCtxCreate_v4(&c2, &none, CU_CTX_SCHED_BLOCKING_SYNC, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxDestroy_v2(c2), CUDA_SUCCESS);
    assert_ptr_equal(current(), c); /* popped */
    assert_int_equal(cuCtxDestroy_v2(c2), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPushCurrent_v2(c2), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxDestroy_v2(c), CUDA_SUCCESS);
    assert_ptr_equal(current(), p);
    assert_int_equal(cuCtxDestroy_v2(p), CUDA_ERROR_INVALID_CONTEXT); /* a primary one */
    /* refusals */
    assert_int_equal(cuCtxCreate_v4(NULL, NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCtxCreate_v4(&c, NULL, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCtxCreate_v4(&c, NULL, 0, 5), CUDA_ERROR_INVALID_DEVICE);
    CUexecAffinityParam aff = {CU_EXEC_AFFINITY_TYPE_SM_COUNT, {{4}}};
    CUctxCreateParams with = {&aff, 1, NULL};
    assert_int_equal(cuCtxCreate_v4(&c, &with, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(cuCtxCreate_v3(&c, NULL, 1, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_ptr_equal(current(), p);
    /* the older versions */
    assert_int_equal(cuCtxCreate_v3(&c, NULL, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxDestroy_v2(c), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate_v2(&c, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxDestroy_v2(c), CUDA_SUCCESS);
    assert_ptr_equal(current(), p);
}

/* The primary context's synchronisation does not wait for a created
 * context's streams, its legacy stream included; the created one's does. */
static void test_primary_sync_skips_created(void **state)
{
    (void)state;
    CUcontext p = NULL, c = NULL, got = NULL;
    CUstream s;
    assert_int_equal(cuDevicePrimaryCtxRetain(&p, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(p), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate_v4(&c, NULL, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamGetCtx(s, &got), CUDA_SUCCESS);
    assert_ptr_equal(got, c);
    for (int legacy = 0; legacy < 2; legacy++) {
        launch_slow(legacy ? NULL : s);
        assert_int_equal(cuCtxPushCurrent_v2(p), CUDA_SUCCESS);
        assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_int_equal(atomic_load(&done), 0); /* still running */
        CUcontext popped;
        assert_int_equal(cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
        assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_int_equal(atomic_load(&done), 1);
    }
    /* destroying it lets its work end first; its streams and events go */
    CUevent ev;
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    launch_slow(s);
    assert_int_equal(cuEventRecord(ev, s), CUDA_SUCCESS);
    assert_int_equal(cuCtxDestroy_v2(c), CUDA_SUCCESS);
    assert_int_equal(atomic_load(&done), 1);
    assert_int_equal(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventSynchronize(ev), CUDA_ERROR_INVALID_HANDLE);
}

static CUcontext shared;
static pthread_barrier_t bar;

static void *other_thread(void *arg)
{
    CUresult *r = arg;
    CUcontext popped;
    cuCtxSetCurrent(shared);
    pthread_barrier_wait(&bar); /* it is destroyed meanwhile */
    pthread_barrier_wait(&bar);
    r[0] = cuCtxSynchronize();
    r[1] = cuCtxPopCurrent_v2(&popped);
    return NULL;
}

static void test_destroyed_elsewhere(void **state)
{
    (void)state;
    pthread_t t;
    CUresult r[2] = {CUDA_SUCCESS, CUDA_ERROR_UNKNOWN};
    assert_int_equal(cuCtxCreate_v4(&shared, NULL, 0, 0), CUDA_SUCCESS);
    pthread_barrier_init(&bar, NULL, 2);
    assert_int_equal(pthread_create(&t, NULL, other_thread, r), 0);
    pthread_barrier_wait(&bar);
    assert_int_equal(cuCtxDestroy_v2(shared), CUDA_SUCCESS);
    pthread_barrier_wait(&bar);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&bar);
    assert_int_equal(r[0], CUDA_ERROR_CONTEXT_IS_DESTROYED);
    assert_int_equal(r[1], CUDA_SUCCESS);
}

/* cudaTypedefs.h: PFN_cuCtxCreate_v3020, _v11040, _v12050. */
static void test_proc_address_versions(void **state)
{
    (void)state;
    void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(self);
    static const struct {
        int version;
        const char *name;
    } want[] = {{13000, "cuCtxCreate_v4"},
                {12050, "cuCtxCreate_v4"},
                {12040, "cuCtxCreate_v3"},
                {11040, "cuCtxCreate_v3"},
                {11000, "cuCtxCreate_v2"}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        void *f = NULL;
        CUdriverProcAddressQueryResult q;
        assert_int_equal(
            cuGetProcAddress("cuCtxCreate", &f, want[i].version, CU_GET_PROC_ADDRESS_DEFAULT, &q),
            CUDA_SUCCESS);
        assert_int_equal(q, CU_GET_PROC_ADDRESS_SUCCESS);
        assert_ptr_equal(f, dlsym(self, want[i].name));
    }
    void *f = NULL;
    CUdriverProcAddressQueryResult q;
    assert_int_equal(cuGetProcAddress("cuCtxDestroy", &f, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q),
                     CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(self, "cuCtxDestroy_v2"));
    dlclose(self);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_destroy),
        cmocka_unit_test(test_primary_sync_skips_created),
        cmocka_unit_test(test_destroyed_elsewhere),
        cmocka_unit_test(test_proc_address_versions),
    };
    return cmocka_run_group_tests_name("sim_contexts", tests, setup, NULL);
}
