/* test_sim_pool.c — stream-ordered memory pools on the simulated GPU: the
 * device's default and current pools, pools the program creates, and
 * their attributes with the contracts cuda.h gives them (high watermarks
 * reset only to zero, which resets them to the current figure; the
 * current figures read-only), through the runtime and the driver.
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
#include <unistd.h>

#include "tests/sim/simcuda.h"

#include "capture.h"

#define MiB (1024ull * 1024)

static uint64_t attr(cudaMemPool_t pool, enum cudaMemPoolAttr a)
{
    uint64_t v = ~0ull;
    assert_int_equal(cudaMemPoolGetAttribute(pool, a, &v), cudaSuccess);
    return v;
}

static cudaMemPool_t default_pool(void)
{
    cudaMemPool_t pool = NULL;
    assert_int_equal(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    assert_non_null(pool);
    return pool;
}

static struct cudaMemPoolProps device_props(void)
{
    struct cudaMemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = cudaMemAllocationTypePinned;
    p.location.type = cudaMemLocationTypeDevice;
    p.location.id = 0;
    return p;
}

static void the_default_pool_is_the_current_one_everywhere(void **state)
{
    (void)state;
    cudaMemPool_t pool = default_pool(), cur = NULL;
    CUmemoryPool drv = NULL, drv_cur = NULL;
    assert_int_equal(cudaDeviceGetMemPool(&cur, 0), cudaSuccess);
    assert_int_equal(cuDeviceGetDefaultMemPool(&drv, 0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGetMemPool(&drv_cur, 0), CUDA_SUCCESS);
    assert_ptr_equal(cur, pool);
    assert_ptr_equal(drv, (CUmemoryPool)pool);
    assert_ptr_equal(drv_cur, (CUmemoryPool)pool);
    assert_int_equal(cudaDeviceGetDefaultMemPool(&cur, 1), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceGetDefaultMemPool(NULL, 0), cudaErrorInvalidValue);
    assert_int_equal(cudaMemPoolDestroy(pool), cudaErrorInvalidValue); /* never the default */
}

static void async_allocations_are_counted_and_the_peaks_reset_to_the_current(void **state)
{
    (void)state;
    cudaMemPool_t pool = default_pool();
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL, *b = NULL;
    assert_int_equal(cudaMallocAsync(&a, 8 * MiB, s), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&b, 4 * MiB, s), cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrUsedMemCurrent), 12 * MiB);
    assert_int_equal(attr(pool, cudaMemPoolAttrReservedMemCurrent), 12 * MiB);
    void *plain = NULL; /* cudaMalloc memory is no pool's */
    assert_int_equal(cudaMalloc(&plain, 2 * MiB), cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrUsedMemCurrent), 12 * MiB);
    assert_int_equal(cudaFree(plain), cudaSuccess);
    assert_int_equal(cudaFreeAsync(a, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrUsedMemCurrent), 4 * MiB);
    assert_int_equal(attr(pool, cudaMemPoolAttrReservedMemCurrent), 4 * MiB);
    assert_int_equal(attr(pool, cudaMemPoolAttrUsedMemHigh), 12 * MiB);
    assert_int_equal(attr(pool, cudaMemPoolAttrReservedMemHigh), 12 * MiB);

    uint64_t v = 1;
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v),
                     cudaErrorInvalidValue);
    v = 0;
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v), cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrUsedMemHigh), 4 * MiB);
    assert_int_equal(attr(pool, cudaMemPoolAttrReservedMemHigh), 12 * MiB);
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &v),
                     cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrReservedMemHigh), 4 * MiB);

    assert_int_equal(cudaMemPoolTrimTo(pool, 0), cudaSuccess); /* nothing kept back to trim */
    assert_int_equal(attr(pool, cudaMemPoolAttrReservedMemCurrent), 4 * MiB);
    assert_int_equal(cudaFreeAsync(b, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrUsedMemCurrent), 0);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

static void settings_round_trip_and_bad_calls_are_refused(void **state)
{
    (void)state;
    cudaMemPool_t pool = default_pool();
    uint64_t threshold = UINT64_MAX; /* what PyTorch's cudaMallocAsync backend sets */
    assert_int_equal(attr(pool, cudaMemPoolAttrReleaseThreshold), 0);
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                     cudaSuccess);
    assert_int_equal(attr(pool, cudaMemPoolAttrReleaseThreshold), UINT64_MAX);
    int flag = -1;
    assert_int_equal(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag),
                     cudaSuccess);
    assert_int_equal(flag, 1);
    flag = 0;
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag),
                     cudaSuccess);
    flag = -1;
    assert_int_equal(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag),
                     cudaSuccess);
    assert_int_equal(flag, 0);
    uint64_t v = 0;
    assert_int_equal(cudaMemPoolGetAttribute(pool, (enum cudaMemPoolAttr)99, &v),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, NULL),
                     cudaErrorInvalidValue);
    assert_int_equal(cuMemPoolGetAttribute((CUmemoryPool)&v, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemPoolTrimTo((CUmemoryPool)&v, 0), CUDA_ERROR_INVALID_VALUE);
}

static void a_created_pool_counts_its_own_and_can_be_current(void **state)
{
    (void)state;
    cudaMemPool_t dflt = default_pool(), mine = NULL, cur = NULL;
    struct cudaMemPoolProps props = device_props();
    assert_int_equal(cudaMemPoolCreate(&mine, &props), cudaSuccess);
    assert_ptr_not_equal(mine, dflt);
    void *a = NULL, *b = NULL;
    assert_int_equal(cudaMallocFromPoolAsync(&a, 6 * MiB, mine, NULL), cudaSuccess);
    assert_int_equal(attr(mine, cudaMemPoolAttrUsedMemCurrent), 6 * MiB);
    assert_int_equal(attr(dflt, cudaMemPoolAttrUsedMemCurrent), 0);
    /* cudaMallocAsync draws from the current pool. */
    assert_int_equal(cudaDeviceSetMemPool(0, mine), cudaSuccess);
    assert_int_equal(cudaDeviceGetMemPool(&cur, 0), cudaSuccess);
    assert_ptr_equal(cur, mine);
    assert_int_equal(cudaMallocAsync(&b, 2 * MiB, NULL), cudaSuccess);
    assert_int_equal(attr(mine, cudaMemPoolAttrUsedMemCurrent), 8 * MiB);
    assert_int_equal(attr(dflt, cudaMemPoolAttrUsedMemCurrent), 0);
    /* Destroyed, it is no one's current pool, and what it lent comes back. */
    assert_int_equal(cudaMemPoolDestroy(mine), cudaSuccess);
    assert_int_equal(cudaDeviceGetMemPool(&cur, 0), cudaSuccess);
    assert_ptr_equal(cur, dflt);
    uint64_t v = 0;
    assert_int_equal(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &v),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemPoolDestroy(mine), cudaErrorInvalidValue);
    assert_int_equal(cudaFreeAsync(a, NULL), cudaSuccess);
    assert_int_equal(cudaFreeAsync(b, NULL), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(NULL), cudaSuccess);
    simcuda_stats_t st;
    simcuda_get_stats(&st);
    assert_int_equal(st.device_bytes_in_use, 0);
}

static void pools_the_simulator_lacks_are_refused_loudly(void **state)
{
    (void)state;
    cudaMemPool_t pool = NULL;
    struct cudaMemPoolProps props = device_props();
    props.reserved[0] = 1; /* "must be 0" */
    assert_int_equal(cudaMemPoolCreate(&pool, &props), cudaErrorInvalidValue);
    props = device_props();
    props.location.type = cudaMemLocationTypeHost;
    struct capture c;
    char err[1024];
    capture_begin(&c);
    cudaError_t e = cudaMemPoolCreate(&pool, &props);
    capture_end(&c, err, sizeof err);
    assert_int_equal(e, cudaErrorNotSupported);
    assert_non_null(strstr(err, "cuMemPoolCreate"));
    assert_int_equal(cudaMemPoolCreate(&pool, NULL), cudaErrorInvalidValue);
    (void)cudaGetLastError();
}

int main(void)
{
    setenv("SIMCUDA_VRAM_MB", "64", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_default_pool_is_the_current_one_everywhere),
        cmocka_unit_test(async_allocations_are_counted_and_the_peaks_reset_to_the_current),
        cmocka_unit_test(settings_round_trip_and_bad_calls_are_refused),
        cmocka_unit_test(a_created_pool_counts_its_own_and_can_be_current),
        cmocka_unit_test(pools_the_simulator_lacks_are_refused_loudly),
    };
    return cmocka_run_group_tests_name("sim_pool", tests, NULL, NULL);
}
