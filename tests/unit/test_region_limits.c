/* test_region_limits.c — the region registry at its limits: the freed
 * cache's size limit, trim, a full device, and VMM calls that fail (unmap,
 * building). Over the fakes of region_fakes.h.
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

/* ---- the freed cache limit ---------------------------------------------- */

static void test_cache_limit(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 4 * M;
    p.va_block = G; /* every region has its own reservation ... */
    p.va_cache = 0; /* ... which goes back as soon as its VA is freed */
    p.device_cache = 16 * M;
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a[4];
    uint64_t f[4];
    for (int i = 0; i < 4; i++)
        a[i] = xalloc(pool, 8 * M, SH_PATH_ASYNC, (uint64_t)i + 1);
    assert_int_equal(vf.n.create, 8);
    assert_int_equal(vf.n.reserve, 4);
    for (int i = 0; i < 2; i++)
        xfree(pool, a[i], (uint64_t)i + 1, f[i] = fence_new());
    /* 16 MiB freed: at the limit, nothing torn down. */
    assert_int_equal(vf.n.unmap, 0);
    assert_int_equal(ff.waits, 0);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_FREED], 2);
    assert_int_equal(st.freed_bytes, 16 * M);

    /* The third goes over: the oldest (a[0]) is torn down after its fence. */
    xfree(pool, a[2], 3, f[2] = fence_new());
    assert_true(fence_waited(f[0]) > 0);
    assert_int_equal(fence_waited(f[1]), 0);
    assert_int_equal(fence_waited(f[2]), 0);
    assert_int_equal(fence_dropped(f[0]), 1);
    assert_int_equal(vf.n.unmap, 2);
    assert_true(unmap_seq(a[0]) > fence_waited(f[0]));
    assert_false(any_mapped(a[0], 8 * M));
    assert_int_equal(vf.n.unreserve, 1); /* its VA was freed */
    struct sh_region_info ri;
    assert_int_equal(sh_pool_lookup(pool, a[0], &ri), SH_ENOTFOUND);
    assert_int_equal(info(pool, a[1]).state, SH_RS_FREED);
    /* Its chunks would be spares, but the freed regions fill the one
     * budget that covers both: they go back to the device. */
    assert_int_equal(vf.n.release, 2);
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_FREED], 2);
    assert_int_equal(st.freed_bytes, 16 * M);
    assert_int_equal(st.device_bytes, 24 * M); /* a[3] live, a[1] and a[2] freed */
    assert_int_equal(st.vmm_unmaps, 2);

    xfree(pool, a[3], 4, f[3] = fence_new());
    assert_true(fence_waited(f[1]) > 0);
    assert_true(unmap_seq(a[1]) > fence_waited(f[1]));
    assert_int_equal(fence_waited(f[2]), 0);
    assert_int_equal(vf.n.unmap, 4);
    assert_int_equal(vf.n.unreserve, 2);
    assert_int_equal(vf.n.release, 4);
    assert_int_equal(sh_pool_lookup(pool, a[1], &ri), SH_ENOTFOUND);
    assert_int_equal(pstats(pool).device_bytes, p.device_cache);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_cache_limit_releases(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 4 * M;
    p.device_cache = 8 * M;
    struct sh_pool *pool = mkpool(&p);
    uintptr_t r[3];
    for (int i = 0; i < 3; i++)
        r[i] = xalloc(pool, 8 * M, SH_PATH_MALLOC, 0);
    xfree(pool, r[0], 0, 0);
    xfree(pool, r[1], 0, 0); /* r[0] torn down; r[1] fills the cache: released */
    assert_int_equal(vf.n.unmap, 2);
    assert_int_equal(vf.n.release, 2);
    xfree(pool, r[2], 0, 0); /* r[1] torn down, released */
    assert_int_equal(vf.n.unmap, 4);
    assert_int_equal(vf.n.release, 4);
    assert_int_equal(vf.device_bytes, 8 * M);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.device_bytes, 8 * M);
    assert_int_equal(st.regions[SH_RS_FREED], 1);
    assert_int_equal(st.freed_bytes, 8 * M);
    assert_int_equal(info(pool, r[2]).state, SH_RS_FREED);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* ---- trim and a full device --------------------------------------------- */

static void test_trim(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.device_cache = 16 * M;
    struct sh_pool *pool = mkpool(&p);
    uintptr_t live = xalloc(pool, 4 * M, SH_PATH_MALLOC, 0);
    uintptr_t r[3];
    for (int i = 0; i < 3; i++)
        r[i] = xalloc(pool, 8 * M, SH_PATH_MALLOC, 0);
    for (int i = 0; i < 3; i++)
        xfree(pool, r[i], 0, 0);
    /* r[0] went over the limit, and its chunk with it: the two freed
     * regions fill the one budget for freed regions and spares. */
    assert_int_equal(vf.device_bytes, 20 * M);
    assert_int_equal(pstats(pool).regions[SH_RS_FREED], 2);

    assert_int_equal(sh_pool_trim(pool, 0), 0);
    assert_int_equal(vf.device_bytes, 20 * M);
    /* 8 MiB back to the device, no more. */
    assert_int_equal(sh_pool_trim(pool, 8 * M), 8 * M);
    assert_int_equal(vf.device_bytes, 12 * M);
    assert_int_equal(pstats(pool).device_bytes, 12 * M);
    /* Everything cached goes; the live region stays. */
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 8 * M);
    assert_int_equal(vf.device_bytes, 4 * M);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.device_bytes, 4 * M);
    assert_int_equal(st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.freed_bytes, 0);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1);
    assert_int_equal(st.live_bytes, 4 * M);
    for (int i = 0; i < 3; i++)
        assert_false(any_mapped(r[i], 8 * M));
    assert_int_equal(info(pool, live).state, SH_RS_RESIDENT);
    assert_true(covered(live, 4 * M));
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 0);
    assert_int_equal(vf.n.create, vf.n.release + 1);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_trim_waits_fences(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 8 * M, SH_PATH_ASYNC, 1);
    uint64_t f = fence_new();
    xfree(pool, a, 1, f);
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 8 * M);
    assert_true(fence_waited(f) > 0);
    assert_true(unmap_seq(a) > fence_waited(f));
    assert_int_equal(fence_dropped(f), 1);
    assert_int_equal(vf.device_bytes, 0);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

static void test_device_full(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 16 * M;
    p.va_block = G;
    p.va_cache = 0;
    struct sh_pool *pool = mkpool(&p);
    vf.device_limit = 32 * M;
    uintptr_t a = xalloc(pool, 32 * M, SH_PATH_MALLOC, 0);
    uintptr_t x;
    assert_int_equal(sh_pool_alloc(pool, 2 * M, SH_PATH_MALLOC, 0, &x), SH_ENOMEM);
    /* Nothing leaked by the failure. */
    assert_int_equal(vf.nres, 1);
    assert_int_equal(vf.n.reserve, vf.n.unreserve + 1);
    assert_int_equal(vf.nmaps, 2);
    assert_int_equal(vf.device_bytes, 32 * M);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1);
    assert_int_equal(st.live_bytes, 32 * M);
    assert_int_equal(st.allocs, 1);
    assert_int_equal(st.device_bytes, 32 * M);
    /* Nothing cached to drop while it is live. */
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 0);
    assert_true(covered(a, 32 * M));

    /* Freed: a trim gives the device its memory back; then it fits. */
    xfree(pool, a, 0, 0);
    assert_int_equal(sh_pool_trim(pool, 32 * M), 32 * M);
    assert_int_equal(vf.device_bytes, 0);
    uintptr_t b = xalloc(pool, 8 * M, SH_PATH_MALLOC, 0);
    uintptr_t c = xalloc(pool, 24 * M, SH_PATH_MALLOC, 0);
    assert_int_equal(vf.device_bytes, 32 * M);
    assert_int_equal(sh_pool_alloc(pool, 2 * M, SH_PATH_MALLOC, 0, &x), SH_ENOMEM);

    /* Freed regions of other sizes stand in the way: the alloc drops them. */
    xfree(pool, b, 0, 0);
    xfree(pool, c, 0, 0);
    uintptr_t d = xalloc(pool, 16 * M, SH_PATH_MALLOC, 0);
    assert_true(covered(d, 16 * M));
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1);
    assert_int_equal(st.live_bytes, 16 * M);
    assert_true(vf.device_bytes <= 32 * M);
    assert_int_equal(st.device_bytes, vf.device_bytes);
    /* Still too big with everything dropped. */
    assert_int_equal(sh_pool_alloc(pool, 32 * M, SH_PATH_MALLOC, 0, &x), SH_ENOMEM);
    assert_int_equal(info(pool, d).state, SH_RS_RESIDENT);
    assert_true(covered(d, 16 * M));
    assert_int_equal(pstats(pool).regions[SH_RS_RESIDENT], 1);
    assert_int_equal(vf.nres, 1);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* Unmapping a freed region: two failures in a row are tried again and
 * nothing is left; an unmap that keeps failing leaves its memory and its
 * address out of use (never released or handed out while mapped). */
static void test_unmap_failures(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 4 * M;
    p.va_cache = 0;
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 8 * M, SH_PATH_MALLOC, 0);
    xfree(pool, a, 0, 0);
    vf.fail_unmaps = 2;
    sh_pool_trim(pool, SIZE_MAX);
    assert_int_equal(vf.fail_unmaps, 0); /* the failures were hit */
    assert_int_equal(vf.nmaps, 0);
    assert_int_equal(vf.bad, 0);
    assert_int_equal(pstats(pool).vmm_unmaps, 2);

    uintptr_t b = xalloc(pool, 4 * M, SH_PATH_MALLOC, 0);
    xfree(pool, b, 0, 0);
    vf.fail_unmaps = 3; /* every try */
    sh_pool_trim(pool, SIZE_MAX);
    assert_int_equal(vf.fail_unmaps, 0);
    assert_int_equal(vf.nmaps, 1);
    assert_int_equal(vf.bad, 0); /* its handle was not released while mapped */
    uintptr_t c = xalloc(pool, 4 * M, SH_PATH_MALLOC, 0);
    assert_true(c != b); /* nor its address handed out again */
    assert_int_equal(vf.bad, 0);
    xfree(pool, c, 0, 0);
    sh_pool_destroy(pool);
}

static void test_build_failures_leak_nothing(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 4 * M;
    p.va_block = G;
    p.va_cache = 0;
    struct sh_pool *pool = mkpool(&p);
    uintptr_t x;

    /* The third of four maps (4+4+4+2 MiB) fails. */
    vf.fail_map_at = 3;
    assert_int_equal(sh_pool_alloc(pool, 14 * M, SH_PATH_MALLOC, 0, &x), SH_EDRIVER);
    assert_int_equal(vf.n.map, 3);
    assert_int_equal(vf.n.unmap, 2);
    assert_int_equal(vf.nmaps, 0);
    assert_int_equal(vf.n.create, 3);
    for (uint64_t h = 1; h <= vf.next_handle; h++)
        assert_int_equal(vf.hmapped[h], 0);
    assert_int_equal(vf.n.reserve, 1);
    assert_int_equal(vf.n.unreserve, 1);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT] + st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.allocs, 0);
    assert_int_equal(st.live_bytes, 0);
    assert_int_equal(st.vmm_maps, 2);
    assert_int_equal(st.vmm_unmaps, 2);
    assert_int_equal(st.device_bytes, vf.device_bytes); /* the handles are cached */
    assert_int_equal(vf.n.release + (long)(vf.device_bytes / (4 * M)), 3);

    /* The next try works and reuses the cached handles. */
    uintptr_t a = xalloc(pool, 14 * M, SH_PATH_MALLOC, 0);
    assert_int_equal(vf.n.create - vf.n.release, 4);
    assert_int_equal(mapping_at(a + 12 * M), 2 * M);
    xfree(pool, a, 0, 0);
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 14 * M);
    assert_int_equal(vf.device_bytes, 0);

    /* The very first map fails. */
    vf.fail_map_at = vf.n.map + 1;
    assert_int_equal(sh_pool_alloc(pool, 4 * M, SH_PATH_MALLOC, 0, &x), SH_EDRIVER);
    assert_int_equal(vf.nmaps, 0);
    assert_int_equal(vf.nres, 0);
    vf.fail_map_at = 0;

    /* The device fills up in the middle: the third chunk cannot be created. */
    sh_pool_trim(pool, SIZE_MAX);
    vf.device_limit = 10 * M;
    struct calls before = calls_now();
    assert_int_equal(sh_pool_alloc(pool, 14 * M, SH_PATH_MALLOC, 0, &x), SH_ENOMEM);
    struct calls after = calls_now();
    assert_int_equal(after.map - before.map, 2);
    assert_int_equal(after.unmap - before.unmap, 2);
    assert_int_equal(vf.nmaps, 0);
    assert_int_equal(vf.nres, 0);
    assert_true(vf.device_bytes <= 8 * M);
    assert_int_equal(pstats(pool).device_bytes, vf.device_bytes);
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT] + st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.vmm_maps, st.vmm_unmaps);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_unmap_failures, setup),
        cmocka_unit_test_setup(test_cache_limit, setup),
        cmocka_unit_test_setup(test_cache_limit_releases, setup),
        cmocka_unit_test_setup(test_trim, setup),
        cmocka_unit_test_setup(test_trim_waits_fences, setup),
        cmocka_unit_test_setup(test_device_full, setup),
        cmocka_unit_test_setup(test_build_failures_leak_nothing, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
