/* test_region_reuse.c — what the region registry does with what is freed:
 * a freed region reused by the next allocation of its mapped size with no
 * VMM call, in stream order (fences), and small sizes from the sub-allocator's
 * slabs. Over the fakes of region_fakes.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "region_fakes.h"

/* ---- reuse -------------------------------------------------------------- */

static int cmp_uptr(const void *x, const void *y)
{
    uintptr_t a = *(const uintptr_t *)x, b = *(const uintptr_t *)y;
    return a < b ? -1 : a > b;
}

static void test_reuse_same_size(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 6 * M, SH_PATH_MALLOC, 0);
    xfree(pool, a, 0, 0);
    struct calls before = calls_now();
    /* Same mapped size (6 MiB), different request: the same region. */
    uintptr_t b = xalloc(pool, 5 * M + 3, SH_PATH_MALLOC, 0);
    assert_int_equal(b, a);
    assert_calls_equal(calls_now(), before);
    struct sh_region_info ri = info(pool, a);
    assert_int_equal(ri.size, 5 * M + 3);
    assert_int_equal(ri.mapped, 6 * M);
    assert_int_equal(ri.state, SH_RS_RESIDENT);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.reuses, 1);
    assert_int_equal(st.allocs, 2);
    assert_int_equal(st.frees, 1);
    assert_int_equal(st.live_bytes, 5 * M + 3);
    assert_int_equal(st.regions[SH_RS_FREED], 0);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_other_size_builds(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 6 * M, SH_PATH_MALLOC, 0);
    xfree(pool, a, 0, 0);
    struct calls before = calls_now();
    uintptr_t b = xalloc(pool, 8 * M, SH_PATH_MALLOC, 0);
    assert_true(b != a);
    struct calls after = calls_now();
    assert_int_equal(after.map, before.map + 1);
    assert_int_equal(after.create, before.create + 1);
    assert_int_equal(info(pool, a).state, SH_RS_FREED);
    assert_int_equal(info(pool, b).state, SH_RS_RESIDENT);
    /* Smaller than a freed region is not served by it either. */
    uintptr_t d = xalloc(pool, 4 * M, SH_PATH_MALLOC, 0);
    assert_true(d != a && d != b);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.reuses, 0);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 2);
    assert_int_equal(st.regions[SH_RS_FREED], 1);
    assert_int_equal(st.freed_bytes, 6 * M);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_churn_no_vmm(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    static const size_t sizes[] = {2 * M, 3 * M + 7, 10 * M, 64 * M, 130 * M, 10 * M};
    enum { N = sizeof sizes / sizeof sizes[0], CYCLES = 2000 };
    uintptr_t first[N], va[N], sorted[N];
    struct calls warm = {0};
    for (int cyc = 0; cyc < CYCLES; cyc++) {
        for (int i = 0; i < N; i++) {
            int path = i % 3 == 0 ? SH_PATH_MALLOC : i % 3 == 1 ? SH_PATH_ASYNC : SH_PATH_PLUGGABLE;
            assert_int_equal(sh_pool_alloc(pool, sizes[i], path, 7, &va[i]), 0);
        }
        /* The same regions every time (the two of 10 MiB in either order). */
        memcpy(sorted, va, sizeof va);
        qsort(sorted, N, sizeof sorted[0], cmp_uptr);
        if (cyc == 0)
            memcpy(first, sorted, sizeof sorted);
        for (int i = 0; i < N; i++)
            assert_int_equal(sorted[i], first[i]);
        /* Frees in a varying order, the async ones behind a fence. */
        for (int k = 0; k < N; k++) {
            int i = (k + cyc) % N;
            uint64_t f = i % 3 == 0 ? 0 : fence_new();
            xfree(pool, va[i], 7, f);
            if (f)
                fence_complete(f);
        }
        if (cyc == 0)
            warm = calls_now();
    }
    assert_calls_equal(calls_now(), warm);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.reuses, (uint64_t)N * (CYCLES - 1));
    assert_int_equal(st.allocs, (uint64_t)N * CYCLES);
    assert_int_equal(st.frees, (uint64_t)N * CYCLES);
    assert_int_equal(st.regions[SH_RS_FREED], N);
    assert_int_equal(st.live_bytes, 0);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* ---- stream order ------------------------------------------------------- */

static void test_async_stream_order(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    const size_t sz = 8 * M; /* above suballoc_max: a region */
    uintptr_t a = xalloc(pool, sz, SH_PATH_ASYNC, 1);
    uint64_t f1 = fence_new();
    xfree(pool, a, 1, f1);

    /* Stream 2 may not have it while F1 is pending. */
    struct calls before = calls_now();
    uintptr_t b = xalloc(pool, sz, SH_PATH_ASYNC, 2);
    assert_true(b != a);
    assert_int_equal(calls_now().map, before.map + 1);
    assert_int_equal(info(pool, a).state, SH_RS_FREED);
    assert_int_equal(fence_dropped(f1), 0);

    /* Once F1 is done, stream 2 gets it, without a VMM call. */
    fence_complete(f1);
    before = calls_now();
    uintptr_t c = xalloc(pool, sz, SH_PATH_ASYNC, 2);
    assert_int_equal(c, a);
    assert_calls_equal(calls_now(), before);
    assert_int_equal(fence_dropped(f1), 1);

    /* Stream 1 reuses what it freed itself at once: stream order protects it. */
    uint64_t f2 = fence_new();
    xfree(pool, a, 1, f2);
    before = calls_now();
    uintptr_t d = xalloc(pool, sz, SH_PATH_ASYNC, 1);
    assert_int_equal(d, a);
    assert_calls_equal(calls_now(), before);
    assert_int_equal(fence_dropped(f2), 1);
    assert_int_equal(fence_waited(f2), 0);

    /* The pluggable path is stream-ordered too. */
    uint64_t f3 = fence_new();
    xfree(pool, b, 2, f3);
    uintptr_t e = xalloc(pool, sz, SH_PATH_PLUGGABLE, 3);
    assert_true(e != b && e != a);
    before = calls_now();
    uintptr_t g = xalloc(pool, sz, SH_PATH_PLUGGABLE, 2);
    assert_int_equal(g, b);
    assert_calls_equal(calls_now(), before);
    assert_int_equal(info(pool, g).path, SH_PATH_PLUGGABLE);
    assert_int_equal(pstats(pool).reuses, 3);
    assert_int_equal(ff.waits, 0);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_malloc_reuses_done_only(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 8 * M, SH_PATH_MALLOC, 1);
    uint64_t f1 = fence_new();
    xfree(pool, a, 1, f1);
    /* Even on the stream it was freed on, a MALLOC alloc waits for the fence. */
    struct calls before = calls_now();
    uintptr_t b = xalloc(pool, 8 * M, SH_PATH_MALLOC, 1);
    assert_true(b != a);
    assert_int_equal(calls_now().map, before.map + 1);
    assert_int_equal(info(pool, a).state, SH_RS_FREED);
    fence_complete(f1);
    before = calls_now();
    uintptr_t c = xalloc(pool, 8 * M, SH_PATH_MALLOC, 1);
    assert_int_equal(c, a);
    assert_calls_equal(calls_now(), before);
    assert_int_equal(fence_dropped(f1), 1);
    assert_int_equal(ff.waits, 0);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* ---- small sizes -------------------------------------------------------- */

static void test_small_suballoc(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t v[100];
    for (int i = 0; i < 100; i++)
        v[i] = xalloc(pool, 4 * K, SH_PATH_ASYNC, 1);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1); /* one 2 MiB slab */
    assert_int_equal(st.slabs, 1);
    assert_int_equal(st.small_allocs, 100);
    assert_int_equal(st.vmm_maps, 1);
    assert_int_equal(calls_now().map, 1);
    struct sh_region_info ri = info(pool, v[50]);
    assert_int_equal(ri.path, SH_PATH_SLAB);
    assert_int_equal(ri.state, SH_RS_RESIDENT);
    assert_int_equal(ri.mapped, G);
    assert_true(v[50] >= ri.va && v[50] + 4 * K <= ri.va + ri.mapped);
    qsort(v, 100, sizeof v[0], cmp_uptr);
    for (int i = 1; i < 100; i++)
        assert_true(v[i] >= v[i - 1] + 4 * K);

    /* 100 KiB blocks (128 KiB class, 16 to a 2 MiB slab) on the pluggable path. */
    uintptr_t w[50];
    for (int i = 0; i < 50; i++)
        w[i] = xalloc(pool, 100 * K, SH_PATH_PLUGGABLE, 2);
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1 + 4);
    assert_int_equal(st.slabs, 1 + 4);
    assert_int_equal(st.small_allocs, 150);
    /* suballoc_max itself is small; one byte more is a region. */
    uintptr_t x = xalloc(pool, M, SH_PATH_ASYNC, 1);
    assert_int_equal(info(pool, x).path, SH_PATH_SLAB);
    uintptr_t y = xalloc(pool, M + 1, SH_PATH_ASYNC, 1);
    ri = info(pool, y);
    assert_int_equal(ri.va, y);
    assert_int_equal(ri.path, SH_PATH_ASYNC);
    assert_int_equal(ri.mapped, G);
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1 + 4 + 1 + 1);
    assert_int_equal(st.slabs, 1 + 4 + 1);
    assert_int_equal(st.small_allocs, 151);

    /* MALLOC builds a region for every small size. */
    struct calls before = calls_now();
    uintptr_t z[10];
    for (int i = 0; i < 10; i++) {
        z[i] = xalloc(pool, 4 * K, SH_PATH_MALLOC, 0);
        ri = info(pool, z[i]);
        assert_int_equal(ri.va, z[i]);
        assert_int_equal(ri.path, SH_PATH_MALLOC);
        assert_int_equal(ri.size, 4 * K);
        assert_int_equal(ri.mapped, G);
    }
    assert_int_equal(calls_now().map, before.map + 10);
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 7 + 10);
    assert_int_equal(st.small_allocs, 151);

    for (int i = 0; i < 100; i++)
        xfree(pool, v[i], 1, 0);
    for (int i = 0; i < 50; i++)
        xfree(pool, w[i], 2, 0);
    xfree(pool, x, 1, 0);
    xfree(pool, y, 1, 0);
    for (int i = 0; i < 10; i++)
        xfree(pool, z[i], 0, 0);
    st = pstats(pool);
    assert_int_equal(st.small_frees, 151);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_small_churn_no_vmm(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    /* One block at a time. */
    struct calls warm = {0};
    for (int i = 0; i < 3000; i++) {
        uintptr_t v = xalloc(pool, 4 * K, SH_PATH_ASYNC, 1);
        xfree(pool, v, 1, 0);
        if (i == 0)
            warm = calls_now();
    }
    assert_calls_equal(calls_now(), warm);

    /* A batch that spans three slabs, all freed, again and again. */
    enum { NB = 40 };
    uintptr_t v[NB];
    for (int cyc = 0; cyc < 300; cyc++) {
        for (int i = 0; i < NB; i++)
            v[i] = xalloc(pool, 128 * K, cyc % 2 ? SH_PATH_ASYNC : SH_PATH_PLUGGABLE, 2);
        for (int i = 0; i < NB; i++)
            xfree(pool, v[i], 2, 0);
        if (cyc == 0)
            warm = calls_now();
    }
    assert_calls_equal(calls_now(), warm);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.small_allocs, 3000 + 300 * NB);
    assert_int_equal(st.small_frees, 3000 + 300 * NB);
    /* Only slabs are live, and the slab count agrees. */
    assert_true(st.slabs >= 1);
    assert_int_equal(st.slabs, st.regions[SH_RS_RESIDENT]);
    assert_int_equal(st.live_bytes, st.slabs * G);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* The per-thread cache of lookups that launches and copies go through
 * (sh_pool_bases) answers as the index does, however regions come, go,
 * are reused at the same address with another size, or are dropped:
 * every address is asked again after every change, so a stale entry
 * would answer for a region that is no longer there. */
static void test_lookup_cache_follows_the_index(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    enum { SLOTS = 12, ROUNDS = 300, PROBES = 3 };
    uintptr_t live[SLOTS] = {0}, seen[4 * SLOTS] = {0};
    size_t nseen = 0;
    unsigned rng = 12345;
    for (int round = 0; round < ROUNDS; round++) {
        rng = rng * 1103515245u + 12345u;
        int k = (int)((rng >> 16) % SLOTS);
        if (live[k]) {
            xfree(pool, live[k], 0, 0);
            live[k] = 0;
            if ((rng >> 8) % 3 == 0)
                sh_pool_trim(pool, SIZE_MAX); /* dropped from the index */
        } else {
            live[k] = xalloc(pool, (size_t)(1 + (rng >> 4) % 4) * G, SH_PATH_MALLOC, 0);
            if (nseen < sizeof seen / sizeof seen[0])
                seen[nseen++] = live[k];
        }
        for (size_t i = 0; i < nseen; i++)
            for (int o = 0; o < PROBES; o++) {
                uintptr_t a = seen[i] + (size_t)o * G + 8, base = 0;
                struct sh_region_info ri;
                int found = sh_pool_lookup(pool, a, &ri) == 0 && ri.path != SH_PATH_SLAB;
                assert_int_equal(sh_pool_bases(pool, &a, 1, &base), found);
                if (found)
                    assert_int_equal(base, ri.va);
            }
    }
    for (int k = 0; k < SLOTS; k++)
        if (live[k])
            xfree(pool, live[k], 0, 0);
    sh_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_reuse_same_size, setup),
        cmocka_unit_test_setup(test_lookup_cache_follows_the_index, setup),
        cmocka_unit_test_setup(test_other_size_builds, setup),
        cmocka_unit_test_setup(test_churn_no_vmm, setup),
        cmocka_unit_test_setup(test_async_stream_order, setup),
        cmocka_unit_test_setup(test_malloc_reuses_done_only, setup),
        cmocka_unit_test_setup(test_small_suballoc, setup),
        cmocka_unit_test_setup(test_small_churn_no_vmm, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
