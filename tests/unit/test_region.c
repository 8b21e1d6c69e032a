/* test_region.c — the region registry over a fake VMM and fake fences
 * (region_fakes.h): splitting sizes into chunks, creating a pool and building
 * regions, lookup, misuse, stats and destroy. The other test_region_*.c files
 * cover reuse, the cache's limits and failures, and threads.
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

/* ---- sh_pool_split ------------------------------------------------------ */

static void test_split(void **state)
{
    (void)state;
    size_t c[80];
    assert_int_equal(sh_pool_split(GB, G, 64 * M, c, 80), 16);
    for (int i = 0; i < 16; i++)
        assert_int_equal(c[i], 64 * M);
    assert_int_equal(sh_pool_split(34 * M, G, 64 * M, c, 80), 2);
    assert_int_equal(c[0], 32 * M);
    assert_int_equal(c[1], 2 * M);
    assert_int_equal(sh_pool_split(30 * M, G, 64 * M, c, 80), 4);
    assert_int_equal(c[0], 16 * M);
    assert_int_equal(c[1], 8 * M);
    assert_int_equal(c[2], 4 * M);
    assert_int_equal(c[3], 2 * M);
    assert_int_equal(sh_pool_split(100 * M, G, 32 * M, c, 80), 4);
    assert_int_equal(c[0], 32 * M);
    assert_int_equal(c[1], 32 * M);
    assert_int_equal(c[2], 32 * M);
    assert_int_equal(c[3], 4 * M);
    assert_int_equal(sh_pool_split(G, G, 64 * M, c, 80), 1);
    assert_int_equal(c[0], G);
    assert_int_equal(sh_pool_split(126 * M, G, 64 * M, c, 80), 6);
    static const size_t want126[] = {64 * M, 32 * M, 16 * M, 8 * M, 4 * M, 2 * M};
    for (int i = 0; i < 6; i++)
        assert_int_equal(c[i], want126[i]);
    /* Max chunk equal to the granularity: all granules. */
    assert_int_equal(sh_pool_split(10 * M, G, G, c, 80), 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(c[i], G);

    /* Every multiple of the granularity up to 300 MiB, against the rule. */
    for (size_t mapped = G; mapped <= 300 * M; mapped += G) {
        size_t max_chunk = 32 * M;
        unsigned n = sh_pool_split(mapped, G, max_chunk, c, 80);
        unsigned want = (unsigned)(mapped / max_chunk) +
                        (unsigned)__builtin_popcountll((mapped % max_chunk) / G);
        assert_int_equal(n, want);
        size_t sum = 0;
        for (unsigned i = 0; i < n; i++) {
            assert_true(c[i] >= G && c[i] <= max_chunk);
            assert_int_equal(c[i] & (c[i] - 1), 0);
            if (i > 0) {
                assert_true(c[i] <= c[i - 1]); /* largest first */
                if (c[i] < max_chunk)
                    assert_true(c[i] < c[i - 1]); /* greedy: one of each below max */
            }
            sum += c[i];
        }
        assert_int_equal(sum, mapped);
    }
}

static void test_split_limits(void **state)
{
    (void)state;
    size_t c[4] = {0, 0, 0, 0xdead};
    /* Not enough room: 0, and nothing written past max. */
    assert_int_equal(sh_pool_split(30 * M, G, 64 * M, c, 3), 0);
    assert_int_equal(c[3], 0xdead);
    assert_int_equal(sh_pool_split(34 * M, G, 64 * M, c, 1), 0);
    assert_int_equal(sh_pool_split(34 * M, G, 64 * M, c, 2), 2);
    /* Not a multiple of the granularity, or nothing at all. */
    assert_int_equal(sh_pool_split(3 * M, G, 64 * M, c, 4), 0);
    assert_int_equal(sh_pool_split(G + 4096, G, 64 * M, c, 4), 0);
    assert_int_equal(sh_pool_split(M, G, 64 * M, c, 4), 0);
    assert_int_equal(sh_pool_split(0, G, 64 * M, c, 4), 0);
}

/* ---- creation and building ---------------------------------------------- */

static void test_create_args(void **state)
{
    (void)state;
    struct sh_pool *pool = NULL;
    struct sh_pool_params p = defaults();
    assert_int_equal(sh_pool_create(NULL, &vmm, &fences, &pool), SH_EINVAL);
    assert_int_equal(sh_pool_create(&p, NULL, &fences, &pool), SH_EINVAL);
    assert_int_equal(sh_pool_create(&p, &vmm, NULL, &pool), SH_EINVAL);
    assert_int_equal(sh_pool_create(&p, &vmm, &fences, NULL), SH_EINVAL);
    p.granularity = 0;
    assert_int_equal(sh_pool_create(&p, &vmm, &fences, &pool), SH_EINVAL);
    p.granularity = 3 * M;
    assert_int_equal(sh_pool_create(&p, &vmm, &fences, &pool), SH_EINVAL);
    p = defaults();
    p.max_chunk = M; /* below the granularity */
    assert_int_equal(sh_pool_create(&p, &vmm, &fences, &pool), SH_EINVAL);
    p.max_chunk = 48 * M;
    assert_int_equal(sh_pool_create(&p, &vmm, &fences, &pool), SH_EINVAL);
    assert_null(pool);
    assert_calls_equal(calls_now(), (struct calls){0, 0, 0, 0, 0, 0});

    p = defaults();
    pool = mkpool(&p);
    uintptr_t va;
    assert_int_equal(sh_pool_alloc(pool, 0, SH_PATH_MALLOC, 0, &va), SH_EINVAL);
    assert_int_equal(sh_pool_alloc(pool, G, SH_PATH_MALLOC, 0, NULL), SH_EINVAL);
    assert_calls_equal(calls_now(), (struct calls){0, 0, 0, 0, 0, 0});
    sh_pool_destroy(pool);
    sh_pool_destroy(NULL);
    assert_books_balanced();
}

static void test_build_region(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);

    uintptr_t a = xalloc(pool, GB, SH_PATH_MALLOC, 0);
    struct calls c = calls_now();
    assert_int_equal(c.create, 16);
    assert_int_equal(c.map, 16);
    assert_int_equal(c.reserve, 1);
    assert_int_equal(a % G, 0);
    for (size_t off = 0; off < GB; off += 64 * M)
        assert_int_equal(mapping_at(a + off), 64 * M);
    struct sh_region_info ri = info(pool, a);
    assert_int_equal(ri.va, a);
    assert_int_equal(ri.size, GB);
    assert_int_equal(ri.mapped, GB);
    assert_int_equal(ri.nchunks, 16);
    assert_int_equal(ri.id, 1);
    assert_int_equal(ri.state, SH_RS_RESIDENT);
    assert_int_equal(ri.path, SH_PATH_MALLOC);

    uintptr_t b = xalloc(pool, 34 * M, SH_PATH_MALLOC, 0);
    assert_int_equal(mapping_at(b), 32 * M);
    assert_int_equal(mapping_at(b + 32 * M), 2 * M);
    ri = info(pool, b + 33 * M);
    assert_int_equal(ri.va, b);
    assert_int_equal(ri.nchunks, 2);
    assert_int_equal(ri.id, 2);

    /* Rounded up to the granularity: 5 MiB + 1 maps 6 = 4 + 2. */
    uintptr_t d = xalloc(pool, 5 * M + 1, SH_PATH_MALLOC, 0);
    assert_int_equal(mapping_at(d), 4 * M);
    assert_int_equal(mapping_at(d + 4 * M), 2 * M);
    ri = info(pool, d);
    assert_int_equal(ri.size, 5 * M + 1);
    assert_int_equal(ri.mapped, 6 * M);
    assert_int_equal(ri.nchunks, 2);

    assert_false(overlaps(a, GB, b, 34 * M));
    assert_false(overlaps(b, 34 * M, d, 6 * M));
    c = calls_now();
    assert_int_equal(c.create, 20);
    assert_int_equal(c.map, 20);
    assert_int_equal(c.unmap + c.release + c.unreserve, 0);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.device_bytes, GB + 40 * M);
    assert_int_equal(vf.device_bytes, GB + 40 * M);
    assert_int_equal(st.vmm_maps, 20);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 3);
    sh_pool_destroy(pool);
    assert_books_balanced();
    assert_int_equal(vf.n.unmap, 20);
}

/* ---- lookup ------------------------------------------------------------- */

static void test_lookup(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 6 * M, SH_PATH_ASYNC, 3);
    static const size_t offs[] = {0, 1, 3 * M, 6 * M - 1};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        struct sh_region_info ri = info(pool, a + offs[i]);
        assert_int_equal(ri.va, a);
        assert_int_equal(ri.size, 6 * M);
        assert_int_equal(ri.mapped, 6 * M);
        assert_int_equal(ri.id, 1);
        assert_int_equal(ri.state, SH_RS_RESIDENT);
        assert_int_equal(ri.path, SH_PATH_ASYNC);
        assert_int_equal(ri.nchunks, 2);
    }
    struct sh_region_info ri;
    assert_int_equal(sh_pool_lookup(pool, a + 6 * M, &ri), SH_ENOTFOUND);
    assert_int_equal(sh_pool_lookup(pool, a - 1, &ri), SH_ENOTFOUND);
    assert_int_equal(sh_pool_lookup(pool, 0, &ri), SH_ENOTFOUND);
    assert_int_equal(sh_pool_lookup(pool, a + 2 * M, NULL), 0);

    uintptr_t b = xalloc(pool, 3 * M + 100, SH_PATH_PLUGGABLE, 3);
    ri = info(pool, b + 3 * M + 99);
    assert_int_equal(ri.va, b);
    assert_int_equal(ri.size, 3 * M + 100);
    assert_int_equal(ri.mapped, 4 * M);
    assert_int_equal(ri.id, 2);
    assert_int_equal(ri.path, SH_PATH_PLUGGABLE);
    assert_int_equal(ri.nchunks, 1);
    assert_int_equal(info(pool, a + 6 * M - 1).va, a);

    xfree(pool, a, 3, 0);
    ri = info(pool, a + 3 * M);
    assert_int_equal(ri.va, a);
    assert_int_equal(ri.state, SH_RS_FREED);
    assert_int_equal(info(pool, b).state, SH_RS_RESIDENT);
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 6 * M);
    assert_int_equal(sh_pool_lookup(pool, a + 3 * M, &ri), SH_ENOTFOUND);
    assert_int_equal(sh_pool_lookup(pool, a, &ri), SH_ENOTFOUND);
    assert_int_equal(info(pool, b).va, b);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* ---- misuse ------------------------------------------------------------- */

static void test_free_errors(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    uintptr_t a = xalloc(pool, 6 * M, SH_PATH_MALLOC, 0);
    assert_int_equal(sh_pool_free(pool, VBASE - GB, 0, 0), SH_ENOTFOUND);
    assert_int_equal(sh_pool_free(pool, 0, 0, 0), SH_ENOTFOUND);
    assert_int_equal(sh_pool_free(pool, a + G, 0, 0), SH_ENOTFOUND); /* interior */
    assert_int_equal(sh_pool_free(pool, a + 1, 0, 0), SH_ENOTFOUND);
    assert_int_equal(sh_pool_free(pool, a + 6 * M, 0, 0), SH_ENOTFOUND);
    assert_int_equal(info(pool, a).state, SH_RS_RESIDENT);
    assert_int_equal(pstats(pool).frees, 0);
    xfree(pool, a, 0, 0);
    /* A double free is the caller's error: refused as such, never reported
     * as the library's own bug. */
    uint64_t f = fence_new();
    assert_int_equal(sh_pool_free(pool, a, 5, f), SH_EINVAL);
    assert_int_equal(info(pool, a).state, SH_RS_FREED);
    struct sh_pool_stats st = pstats(pool);
    assert_int_equal(st.frees, 1);
    assert_int_equal(st.regions[SH_RS_FREED], 1);
    assert_int_equal(st.freed_bytes, 6 * M);
    /* The region was listed once: only one alloc gets it. */
    assert_int_equal(xalloc(pool, 6 * M, SH_PATH_MALLOC, 0), a);
    assert_true(xalloc(pool, 6 * M, SH_PATH_MALLOC, 0) != a);
    assert_int_equal(sh_pool_free(NULL, a, 0, 0), SH_EINVAL);
    sh_pool_destroy(pool);
    /* The refused fence was never taken: hand it back by hand. */
    assert_int_equal(fence_dropped(f), 0);
    f_drop(&ff, f);
    assert_books_balanced();
}

/* ---- stats -------------------------------------------------------------- */

static void test_stats(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    struct sh_pool_stats st = pstats(pool);
    for (int s = 0; s < SH_RS_COUNT; s++)
        assert_int_equal(st.regions[s], 0);
    assert_int_equal(st.live_bytes + st.device_bytes + st.freed_bytes, 0);
    assert_int_equal(st.allocs + st.frees + st.reuses + st.vmm_maps + st.vmm_unmaps, 0);
    assert_int_equal(st.small_allocs + st.small_frees, 0);

    uintptr_t a = xalloc(pool, 6 * M + 1, SH_PATH_ASYNC, 1); /* 8 MiB: one chunk */
    uintptr_t b = xalloc(pool, 20 * M, SH_PATH_MALLOC, 0);   /* 16 + 4 */
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 2);
    assert_int_equal(st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.live_bytes, 26 * M + 1);
    assert_int_equal(st.device_bytes, 28 * M);
    assert_int_equal(st.freed_bytes, 0);
    assert_int_equal(st.allocs, 2);
    assert_int_equal(st.vmm_maps, 3);
    assert_int_equal(st.vmm_unmaps, 0);

    xfree(pool, a, 1, 0);
    st = pstats(pool);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1);
    assert_int_equal(st.regions[SH_RS_FREED], 1);
    assert_int_equal(st.live_bytes, 20 * M);
    assert_int_equal(st.freed_bytes, 8 * M);
    assert_int_equal(st.device_bytes, 28 * M);
    assert_int_equal(st.frees, 1);

    uintptr_t c = xalloc(pool, 7 * M, SH_PATH_ASYNC, 2);
    assert_int_equal(c, a);
    st = pstats(pool);
    assert_int_equal(st.reuses, 1);
    assert_int_equal(st.allocs, 3);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 2);
    assert_int_equal(st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.live_bytes, 27 * M);
    assert_int_equal(st.freed_bytes, 0);
    assert_int_equal(st.vmm_maps, 3);

    xfree(pool, b, 0, 0);
    assert_int_equal(sh_pool_trim(pool, SIZE_MAX), 20 * M);
    st = pstats(pool);
    assert_int_equal(st.vmm_unmaps, 2);
    assert_int_equal(st.device_bytes, 8 * M);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1);
    assert_int_equal(st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.live_bytes, 7 * M);
    assert_int_equal(st.frees, 2);

    uintptr_t s = xalloc(pool, 4 * K, SH_PATH_ASYNC, 1);
    st = pstats(pool);
    assert_int_equal(st.small_allocs, 1);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 2); /* + the slab */
    assert_int_equal(st.device_bytes, 10 * M);
    assert_int_equal(st.vmm_maps, 4);
    xfree(pool, s, 1, 0);
    st = pstats(pool);
    assert_int_equal(st.small_frees, 1);
    assert_int_equal(st.small_allocs, 1);
    for (int k = SH_RS_EVICTING; k <= SH_RS_RESTORING; k++)
        assert_int_equal(st.regions[k], 0);
    assert_int_equal(st.regions[SH_RS_DEAD], 0);
    sh_pool_destroy(pool);
    assert_books_balanced();
}

/* ---- destroy ------------------------------------------------------------ */

static void test_destroy(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    struct sh_pool *pool = mkpool(&p);
    /* Live regions, a freed one behind a pending fence. */
    uintptr_t a = xalloc(pool, 8 * M, SH_PATH_MALLOC, 0);
    uintptr_t b = xalloc(pool, 12 * M, SH_PATH_ASYNC, 1);
    uint64_t fb = fence_new();
    xfree(pool, b, 1, fb);
    /* 512 KiB blocks, four to a slab: a full slab emptied, and one block
     * still in use at the start of the second slab. */
    uintptr_t s[5];
    for (int i = 0; i < 5; i++)
        s[i] = xalloc(pool, 512 * K, SH_PATH_ASYNC, 2);
    for (int i = 0; i < 4; i++)
        xfree(pool, s[i], 2, 0);
    /* A small block freed behind a pending fence. */
    uintptr_t t = xalloc(pool, 4 * K, SH_PATH_ASYNC, 3);
    uint64_t ft = fence_new();
    xfree(pool, t, 3, ft);
    struct sh_region_info slab = info(pool, t);
    assert_int_equal(slab.path, SH_PATH_SLAB);
    assert_true(covered(a, 8 * M));

    sh_pool_destroy(pool);
    assert_true(fence_waited(fb) > 0);
    assert_true(unmap_seq(b) > fence_waited(fb));
    /* The device may still be using the freed block until its fence is done. */
    assert_true(fence_waited(ft) > 0);
    assert_true(unmap_seq(slab.va) > fence_waited(ft));
    assert_books_balanced();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_split, setup),
        cmocka_unit_test_setup(test_split_limits, setup),
        cmocka_unit_test_setup(test_create_args, setup),
        cmocka_unit_test_setup(test_build_region, setup),
        cmocka_unit_test_setup(test_lookup, setup),
        cmocka_unit_test_setup(test_free_errors, setup),
        cmocka_unit_test_setup(test_stats, setup),
        cmocka_unit_test_setup(test_destroy, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
