/* test_e2e_mempool.c — the memory pool's attributes and trim under the
 * library, as PyTorch's cudaMallocAsync backend uses them.
 *
 * torch.cuda.memory_allocated/reserved and their peaks read the device's
 * default pool (cudaMemPoolGetAttribute), resetting the peaks sets them to
 * zero, and empty_cache trims the pool. Under the library cudaMallocAsync's
 * memory is the library's, so the pool must report the library's figures
 * (the same allocations give the same used bytes as on the simulated GPU
 * alone), through the runtime and the driver alike, and a trim must
 * release the library's cache. Other pools pass through.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"
#include "stagehand.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB     (1024ull * 1024)
#define BIG     (8 * MiB) /* a region each */
#define NBIG    3
#define SMALL   4096 /* a sub-allocated block each, of exactly this class */
#define NSMALL  10
#define ALLOCED (NBIG * BIG + NSMALL * SMALL)

static int preloaded;
static cudaStream_t s;

static void stats(stagehand_stats_t *st)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    memset(st, 0, sizeof *st);
    if (get)
        get(st, sizeof *st);
}

static cudaMemPool_t default_pool(void)
{
    cudaMemPool_t pool = NULL;
    assert_int_equal(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    return pool;
}

struct figures {
    uint64_t reserved, reserved_high, used, used_high;
};

/* The four figures through the runtime, checked against the driver's. */
static struct figures read_pool(cudaMemPool_t pool)
{
    static const enum cudaMemPoolAttr attrs[] = {
        cudaMemPoolAttrReservedMemCurrent, cudaMemPoolAttrReservedMemHigh,
        cudaMemPoolAttrUsedMemCurrent, cudaMemPoolAttrUsedMemHigh};
    uint64_t v[4], d[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cudaMemPoolGetAttribute(pool, attrs[i], &v[i]), cudaSuccess);
        assert_int_equal(
            cuMemPoolGetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attrs[i], &d[i]),
            CUDA_SUCCESS);
        assert_int_equal(v[i], d[i]); /* the runtime's call into the driver adds nothing */
    }
    return (struct figures){v[0], v[1], v[2], v[3]};
}

static size_t device_in_use(void)
{
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    return sim.device_bytes_in_use;
}

static void set_zero(cudaMemPool_t pool, enum cudaMemPoolAttr attr)
{
    uint64_t zero = 0;
    assert_int_equal(cudaMemPoolSetAttribute(pool, attr, &zero), cudaSuccess);
}

static void test_figures_follow_allocations_and_trim_releases(void **state)
{
    (void)state;
    cudaMemPool_t pool = default_pool();
    struct figures f0 = read_pool(pool);
    void *big[NBIG], *small[NSMALL];
    for (int i = 0; i < NBIG; i++)
        assert_int_equal(cudaMallocAsync(&big[i], BIG, s), cudaSuccess);
    for (int i = 0; i < NSMALL; i++)
        assert_int_equal(cudaMallocAsync(&small[i], SMALL, s), cudaSuccess);
    struct figures f1 = read_pool(pool);
    assert_int_equal(f1.used - f0.used, ALLOCED);
    assert_true(f1.used_high >= f1.used);
    assert_true(f1.reserved >= f1.used);
    assert_true(f1.reserved_high >= f1.reserved);

    /* Freed, two regions stay with the library, cached for reuse. */
    for (int i = 0; i < 2; i++)
        assert_int_equal(cudaFreeAsync(big[i], s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    struct figures f2 = read_pool(pool);
    assert_int_equal(f1.used - f2.used, 2 * BIG);
    assert_int_equal(f2.used_high, f1.used_high);
    stagehand_stats_t st2;
    stats(&st2);
    if (preloaded) {
        assert_true(st2.cached_bytes >= 2 * BIG);
        assert_int_equal(f2.reserved, f2.used + st2.cached_bytes);
    }

    /* torch.cuda.reset_peak_memory_stats: the peaks restart at the figures now. */
    uint64_t one = 1;
    assert_int_equal(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &one),
                     cudaErrorInvalidValue);
    (void)cudaGetLastError();
    set_zero(pool, cudaMemPoolAttrUsedMemHigh);
    set_zero(pool, cudaMemPoolAttrReservedMemHigh);
    struct figures f3 = read_pool(pool);
    assert_int_equal(f3.used_high, f3.used);
    assert_int_equal(f3.reserved_high, f3.reserved);

    /* torch.cuda.empty_cache: the library's cache goes back to the driver;
     * what allocations use stays. */
    size_t dev_before = device_in_use();
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
    struct figures f4 = read_pool(pool);
    stagehand_stats_t st4;
    stats(&st4);
    assert_int_equal(f4.used, f3.used);
    if (preloaded) {
        assert_true(st4.cached_bytes < 2 * MiB); /* at most the live small blocks' slab */
        assert_true(dev_before - device_in_use() >= 2 * BIG);
        assert_int_equal(f4.reserved, f4.used + st4.cached_bytes);
        assert_int_equal(f4.reserved_high, f3.reserved_high); /* a trim lowers no peak */
    }
    assert_int_equal(cudaFreeAsync(big[2], s), cudaSuccess);
    for (int i = 0; i < NSMALL; i++)
        assert_int_equal(cudaFreeAsync(small[i], s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(read_pool(pool).used, f0.used);
}

/* A trim that keeps more than the pool holds releases nothing; one to
 * zero with nothing allocated leaves nothing cached, empty small-block
 * slabs included. */
static void test_trim_keeps_what_it_is_told(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    cudaMemPool_t pool = default_pool();
    void *p = NULL, *small[NSMALL];
    assert_int_equal(cudaMallocAsync(&p, BIG, s), cudaSuccess);
    for (int i = 0; i < NSMALL; i++)
        assert_int_equal(cudaMallocAsync(&small[i], SMALL, s), cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, s), cudaSuccess);
    for (int i = 0; i < NSMALL; i++)
        assert_int_equal(cudaFreeAsync(small[i], s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    stagehand_stats_t a, b;
    stats(&a);
    assert_true(a.cached_bytes >= BIG);
    struct figures f = read_pool(pool);
    assert_int_equal(cuMemPoolTrimTo((CUmemoryPool)pool, f.reserved), CUDA_SUCCESS);
    stats(&b);
    assert_int_equal(b.cached_bytes, a.cached_bytes);
    assert_int_equal(cuMemPoolTrimTo((CUmemoryPool)pool, 0), CUDA_SUCCESS);
    stats(&b);
    assert_int_equal(b.cached_bytes, 0);
    assert_int_equal(read_pool(pool).reserved, read_pool(pool).used);
}

/* A pool the program made is the driver's alone; it becomes the library's
 * to report once it is the pool cudaMallocAsync draws from. */
static void test_other_pools_pass_through(void **state)
{
    (void)state;
    cudaMemPool_t dflt = default_pool(), mine = NULL;
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    assert_int_equal(cudaMemPoolCreate(&mine, &props), cudaSuccess);
    struct figures d0 = read_pool(dflt), m0 = read_pool(mine);
    assert_int_equal(m0.used, 0);
    void *p = NULL, *q = NULL;
    assert_int_equal(cudaMallocFromPoolAsync(&p, 4 * MiB, mine, s), cudaSuccess);
    assert_int_equal(read_pool(mine).used, 4 * MiB);
    assert_int_equal(read_pool(mine).reserved, 4 * MiB);
    assert_int_equal(read_pool(dflt).used, d0.used);
    stagehand_stats_t a, b;
    stats(&a);
    assert_int_equal(cudaMemPoolTrimTo(mine, 0), cudaSuccess);
    stats(&b);
    assert_int_equal(b.cached_bytes, a.cached_bytes); /* not the library's to trim */

    assert_int_equal(cudaDeviceSetMemPool(0, mine), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&q, BIG, s), cudaSuccess);
    assert_int_equal(read_pool(mine).used, 4 * MiB + BIG);
    assert_int_equal(read_pool(dflt).used, d0.used);
    assert_int_equal(cudaFreeAsync(q, s), cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaDeviceSetMemPool(0, dflt), cudaSuccess);
    assert_int_equal(cudaMemPoolDestroy(mine), cudaSuccess);
    assert_int_equal(read_pool(dflt).used, d0.used);
}

static int setup(void **state)
{
    (void)state;
    void *p = NULL; /* the library comes up at its first allocation */
    assert_int_equal(cudaMalloc(&p, 2 * MiB), cudaSuccess);
    assert_int_equal(cudaFree(p), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_MEMPOOL_CONFIGURED")) {
        setenv("E2E_MEMPOOL_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "512", 1);
        setenv("STAGEHAND_POOL_SLABS_PER_CLASS", "0", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "0", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_figures_follow_allocations_and_trim_releases),
        cmocka_unit_test(test_trim_keeps_what_it_is_told),
        cmocka_unit_test(test_other_pools_pass_through),
    };
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_mempool (preloaded)" : "e2e_mempool (disabled)", tests, setup, NULL);
}
