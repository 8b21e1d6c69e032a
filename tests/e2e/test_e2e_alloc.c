/* test_e2e_alloc.c — an unmodified program's allocations through every path
 * (cudaMalloc, cudaMallocAsync, the pluggable entry points), from several
 * threads and streams, written by kernels and read back byte for byte.
 * tests/run.sh runs it under LD_PRELOAD=libstagehand.so and again with
 * STAGEHAND_DISABLE=1; the bytes must be the same both times.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "simcuda.h"
#include "stagehand.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NTHREADS 4

/* fill(p, n, seed): p[i] = seed * 2654435761 + i */
static void fill_kernel(void **args)
{
    uint32_t *p = *(uint32_t **)args[0];
    size_t n = *(size_t *)args[1];
    uint32_t seed = *(uint32_t *)args[2];
    for (size_t i = 0; i < n; i++)
        p[i] = seed * 2654435761u + (uint32_t)i;
}

static void launch_fill(void *p, size_t bytes, uint32_t seed, cudaStream_t s)
{
    size_t n = bytes / 4;
    void *args[] = {&p, &n, &seed};
    dim3 one = {1, 1, 1};
    assert_int_equal(cudaLaunchKernel((const void *)fill_kernel, one, one, args, 0, s),
                     cudaSuccess);
}

static void check_bytes(const void *d, size_t bytes, uint32_t seed, cudaStream_t s)
{
    uint32_t *h = malloc(bytes);
    assert_non_null(h);
    assert_int_equal(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    for (size_t i = 0; i < bytes / 4; i++)
        if (h[i] != seed * 2654435761u + (uint32_t)i)
            fail_msg("byte mismatch at word %zu of %zu (seed %u)", i, bytes / 4, seed);
    free(h);
}

/* The library's control API, when it is preloaded. */
static int (*get_stats)(stagehand_stats_t *, size_t);
static void *(*pl_malloc)(ssize_t, int, void *);
static void (*pl_free)(void *, ssize_t, int, void *);

static int managed(void)
{
    stagehand_stats_t st;
    return get_stats && get_stats(&st, sizeof st) == 0 && st.active;
}

static int setup(void **state)
{
    (void)state;
    size_t sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    assert_int_equal(simcuda_register_kernel(fill_kernel, "fill", 3, sizes, 0), 0);
    get_stats = (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    pl_malloc = (void *(*)(ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_malloc");
    pl_free = (void (*)(void *, ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_free");
    return 0;
}

static void test_malloc_path(void **state)
{
    (void)state;
    static const size_t sizes[] = {4 << 10, 2 << 20, 3 << 20, 34 << 20, 2 << 20};
    void *p[5];
    for (int i = 0; i < 5; i++) {
        assert_int_equal(cudaMalloc(&p[i], sizes[i]), cudaSuccess);
        launch_fill(p[i], sizes[i], (uint32_t)i + 1, NULL);
    }
    for (int i = 0; i < 5; i++)
        check_bytes(p[i], sizes[i], (uint32_t)i + 1, NULL);
    /* Pointer arithmetic into a region reaches the same bytes. */
    uint32_t word;
    assert_int_equal(cudaMemcpy(&word, (char *)p[3] + 4096, 4, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    assert_int_equal(word, 4u * 2654435761u + 1024u);
    for (int i = 0; i < 5; i++)
        assert_int_equal(cudaFree(p[i]), cudaSuccess);
    if (managed()) {
        stagehand_stats_t st;
        get_stats(&st, sizeof st);
        assert_true(st.allocs >= 4); /* 4 of the 5 sizes are above min_region */
        assert_int_equal(st.regions_live, 0);
    }
}

static void test_reuse_after_free(void **state)
{
    (void)state;
    void *a, *b;
    assert_int_equal(cudaMalloc(&a, 8 << 20), cudaSuccess);
    launch_fill(a, 8 << 20, 7, NULL);
    check_bytes(a, 8 << 20, 7, NULL);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaMalloc(&b, 8 << 20), cudaSuccess);
    launch_fill(b, 8 << 20, 8, NULL);
    check_bytes(b, 8 << 20, 8, NULL);
    if (managed())
        assert_ptr_equal(a, b); /* a freed region is reused, mapped */
    assert_int_equal(cudaFree(b), cudaSuccess);
}

struct worker {
    int id;
    int failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    cudaStream_t s[2];
    for (int i = 0; i < 2; i++)
        if (cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) != cudaSuccess)
            w->failures++;
    for (int round = 0; round < 20; round++) {
        size_t sizes[] = {512, 64 << 10, 1 << 20, 5 << 20};
        void *p[4] = {0};
        for (int i = 0; i < 4; i++) {
            cudaStream_t st = s[i & 1];
            uint32_t seed = (uint32_t)(w->id * 1000 + round * 10 + i);
            int pluggable = pl_malloc && (i & 2);
            if (pluggable)
                p[i] = pl_malloc((ssize_t)sizes[i], 0, st);
            else if (cudaMallocAsync(&p[i], sizes[i], st) != cudaSuccess)
                p[i] = NULL;
            if (!p[i]) {
                w->failures++;
                continue;
            }
            size_t n = sizes[i] / 4;
            void *args[] = {&p[i], &n, &seed};
            dim3 one = {1, 1, 1};
            if (cudaLaunchKernel((const void *)fill_kernel, one, one, args, 0, st) != cudaSuccess)
                w->failures++;
            uint32_t *h = malloc(sizes[i]);
            cudaMemcpyAsync(h, p[i], sizes[i], cudaMemcpyDeviceToHost, st);
            cudaStreamSynchronize(st);
            for (size_t k = 0; k < n; k++)
                if (h[k] != seed * 2654435761u + (uint32_t)k) {
                    w->failures++;
                    break;
                }
            free(h);
        }
        for (int i = 0; i < 4; i++) {
            if (!p[i])
                continue;
            if (pl_free && (i & 2))
                pl_free(p[i], (ssize_t)sizes[i], 0, s[i & 1]);
            else if (cudaFreeAsync(p[i], s[i & 1]) != cudaSuccess)
                w->failures++;
        }
    }
    for (int i = 0; i < 2; i++) {
        cudaStreamSynchronize(s[i]);
        cudaStreamDestroy(s[i]);
    }
    return NULL;
}

static void test_threads_streams_async(void **state)
{
    (void)state;
    pthread_t t[NTHREADS];
    struct worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (struct worker){.id = i};
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    if (managed()) {
        stagehand_stats_t st;
        get_stats(&st, sizeof st);
        assert_true(st.small_allocs > 0);
        assert_int_equal(st.regions_live, 0);
    }
}

static void test_mem_get_info(void **state)
{
    (void)state;
    size_t free_b = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    assert_true(total > 0);
    assert_true(free_b <= total);
    if (managed()) {
        stagehand_stats_t st;
        get_stats(&st, sizeof st);
        assert_int_equal(total, st.budget_bytes);
    }
}

/* cudaFree takes any pointer cudaMallocAsync returned, small blocks in the
 * middle of a slab included; freeing one twice is the program's error. */
static void test_free_small_blocks(void **state)
{
    (void)state;
    void *p[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cudaMallocAsync(&p[i], 4096, 0), cudaSuccess);
        launch_fill(p[i], 4096, 700 + (uint32_t)i, 0);
    }
    assert_int_equal(cudaStreamSynchronize(0), cudaSuccess);
    assert_int_equal(cudaFree(p[1]), cudaSuccess);
    assert_int_not_equal(cudaFree(p[1]), cudaSuccess);
    cudaGetLastError();
    check_bytes(p[0], 4096, 700, 0);
    check_bytes(p[2], 4096, 702, 0);
    void *q;
    assert_int_equal(cudaMallocAsync(&q, 4096, 0), cudaSuccess);
    launch_fill(q, 4096, 710, 0);
    check_bytes(q, 4096, 710, 0);
    check_bytes(p[0], 4096, 700, 0);
    check_bytes(p[2], 4096, 702, 0);
    assert_int_equal(cudaFree(q), cudaSuccess);
    assert_int_equal(cudaFree(p[2]), cudaSuccess);
    assert_int_equal(cudaFree(p[0]), cudaSuccess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malloc_path),           cmocka_unit_test(test_reuse_after_free),
        cmocka_unit_test(test_threads_streams_async), cmocka_unit_test(test_mem_get_info),
        cmocka_unit_test(test_free_small_blocks),
    };
    return cmocka_run_group_tests_name(getenv("STAGEHAND_DISABLE") ? "e2e_alloc (disabled)"
                                                                   : "e2e_alloc (preloaded)",
                                       tests, setup, NULL);
}
