/* test_vaarena.c — VA arena over a fake VMM that counts every call: block
 * reservation, best fit, coalescing, the cache limit, errors, threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool_parts.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define G      ((size_t)2 << 20) /* granularity */
#define BASE   ((uintptr_t)1 << 40)
#define MAXRES 256

/* ---- fake VMM: hands out addresses, never memory ----------------------------- */

struct fake {
    pthread_mutex_t mu;
    uintptr_t next;
    size_t gap;        /* VA left between reservations (0: adjacent) */
    size_t fail_above; /* reserve fails for sizes above this; 0: never */
    int fail_all;
    int reserves, unreserves, bad;
    struct {
        uintptr_t va;
        size_t size;
    } live[MAXRES];
    int nlive;
};

static uintptr_t up(uintptr_t x, size_t a)
{
    return (x + a - 1) & ~(uintptr_t)(a - 1);
}

static int f_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->reserves++;
    int err = 0;
    if (f->fail_all || (f->fail_above && size > f->fail_above) || f->nlive == MAXRES || size % G ||
        align % G) {
        err = SH_ENOMEM;
    } else {
        *va = up(f->next, align);
        f->next = *va + size + f->gap;
        f->live[f->nlive].va = *va;
        f->live[f->nlive++].size = size;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int f_unreserve(void *ctx, uintptr_t va, size_t size)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->unreserves++;
    int i = 0;
    while (i < f->nlive && (f->live[i].va != va || f->live[i].size != size))
        i++;
    if (i == f->nlive)
        f->bad++; /* not a reservation, or not all of one */
    else
        f->live[i] = f->live[--f->nlive];
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static struct fake fk;
static struct sh_vmm_ops ops = {.ctx = &fk, .reserve = f_reserve, .unreserve = f_unreserve};

static int setup(void **state)
{
    (void)state;
    pthread_mutex_destroy(&fk.mu);
    fk = (struct fake){.next = BASE, .gap = G};
    pthread_mutex_init(&fk.mu, NULL);
    return 0;
}

static struct sh_vaarena *mk(size_t block, size_t limit)
{
    struct sh_vaarena *a = NULL;
    assert_int_equal(sh_vaarena_create(&ops, G, block, limit, &a), 0);
    return a;
}

static struct sh_vaarena_stats stats(struct sh_vaarena *a)
{
    struct sh_vaarena_stats st;
    sh_vaarena_stats(a, &st);
    return st;
}

static void finish(struct sh_vaarena *a)
{
    sh_vaarena_destroy(a);
    assert_int_equal(fk.nlive, 0); /* everything unreserved */
    assert_int_equal(fk.bad, 0);
}

static uintptr_t get(struct sh_vaarena *a, size_t size, size_t align)
{
    uintptr_t va = 0;
    assert_int_equal(sh_vaarena_alloc(a, size, align, &va), 0);
    assert_int_equal(va % (align > G ? align : G), 0);
    return va;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_bad_args(void **state)
{
    (void)state;
    struct sh_vaarena *a = NULL;
    assert_int_equal(sh_vaarena_create(&ops, 0, 0, 0, &a), SH_EINVAL);
    assert_int_equal(sh_vaarena_create(&ops, 3 << 20, 0, 0, &a), SH_EINVAL);
    assert_int_equal(sh_vaarena_create(NULL, G, 0, 0, &a), SH_EINVAL);
    a = mk(16 * G, 0);
    uintptr_t va;
    assert_int_equal(sh_vaarena_alloc(a, 0, 0, &va), SH_EINVAL);
    assert_int_equal(sh_vaarena_alloc(a, G + 4096, 0, &va), SH_EINVAL);
    assert_int_equal(sh_vaarena_alloc(a, G, 3 * G, &va), SH_EINVAL);
    assert_int_equal(sh_vaarena_alloc(a, G, 0, NULL), SH_EINVAL);
    assert_int_equal(fk.reserves, 0);
    finish(a);
}

static void test_block_carving(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(16 * G, 1ull << 40);
    uintptr_t v1 = get(a, G, 0);
    assert_int_equal(fk.reserves, 1);
    assert_int_equal(fk.live[0].size, 16 * G); /* a whole block, not just G */
    uintptr_t v2 = get(a, 3 * G, 0);
    uintptr_t v3 = get(a, 12 * G, 0);
    assert_int_equal(fk.reserves, 1);
    assert_true(v1 + G <= v2 || v2 + 3 * G <= v1);
    assert_true(v3 >= fk.live[0].va && v3 + 12 * G <= fk.live[0].va + 16 * G);
    struct sh_vaarena_stats st = stats(a);
    assert_int_equal(st.reserved_bytes, 16 * G);
    assert_int_equal(st.in_use_bytes, 16 * G);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.free_ranges, 0);
    get(a, G, 0); /* full: a second block */
    assert_int_equal(fk.reserves, 2);
    assert_int_equal(stats(a).reserve_calls, 2);
    finish(a);
}

static void test_alignment(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(64 * G, 1ull << 40);
    get(a, G, 0); /* the block start is taken: later aligned requests must skip */
    for (size_t align = G; align <= 16 * G; align *= 2) {
        uintptr_t va = get(a, G, align);
        assert_int_equal(va % align, 0);
    }
    get(a, G, 4096); /* smaller than the granularity: the granularity */
    uintptr_t big = get(a, 2 * G, (size_t)1 << 32);
    assert_int_equal(big % ((size_t)1 << 32), 0);
    finish(a);
}

/* Alloc/free in a loop must never reach the driver once warm. */
static void test_steady_state(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(1024 * G, 1ull << 40);
    uintptr_t live[64];
    size_t sz[64];
    int n = 0;
    uint64_t r = 12345;
    for (int i = 0; i < 50000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        if (n < 64 && (n == 0 || (r >> 33) % 2)) {
            sz[n] = (1 + (r >> 40) % 8) * G;
            live[n] = get(a, sz[n], G << ((r >> 50) % 3));
            n++;
        } else {
            int k = (int)((r >> 20) % (uint64_t)n);
            assert_int_equal(sh_vaarena_free(a, live[k], sz[k]), 0);
            live[k] = live[--n];
            sz[k] = sz[n];
        }
    }
    while (n--)
        assert_int_equal(sh_vaarena_free(a, live[n], sz[n]), 0);
    struct sh_vaarena_stats st = stats(a);
    assert_int_equal(fk.reserves, 1);
    assert_int_equal(fk.unreserves, 0);
    assert_int_equal(st.in_use_bytes, 0);
    assert_int_equal(st.free_ranges, 1); /* everything merged back */
    finish(a);
}

/* Three ranges filling one block, freed in every order, merge back into one
 * hole that a block-sized request reuses. */
static void test_coalescing(void **state)
{
    (void)state;
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    static const size_t sz[3] = {2 * G, 3 * G, 3 * G};
    struct sh_vaarena *a = mk(8 * G, 1ull << 40);
    for (int o = 0; o < 6; o++) {
        uintptr_t v[3];
        for (int i = 0; i < 3; i++)
            v[i] = get(a, sz[i], 0);
        assert_int_equal(v[1], v[0] + sz[0]);
        assert_int_equal(v[2], v[1] + sz[1]);
        for (int i = 0; i < 3; i++)
            assert_int_equal(sh_vaarena_free(a, v[orders[o][i]], sz[orders[o][i]]), 0);
        assert_int_equal(stats(a).free_ranges, 1);
        uintptr_t all = get(a, 8 * G, 0);
        assert_int_equal(all, v[0]);
        assert_int_equal(sh_vaarena_free(a, all, 8 * G), 0);
    }
    assert_int_equal(fk.reserves, 1);
    /* Freeing A and C leaves two holes, not one. */
    uintptr_t x = get(a, 2 * G, 0), y = get(a, 3 * G, 0), z = get(a, 3 * G, 0);
    assert_int_equal(sh_vaarena_free(a, x, 2 * G), 0);
    assert_int_equal(sh_vaarena_free(a, z, 3 * G), 0);
    assert_int_equal(stats(a).free_ranges, 2);
    assert_int_equal(sh_vaarena_free(a, y, 3 * G), 0);
    assert_int_equal(stats(a).free_ranges, 1);
    finish(a);
}

/* Two reservations that happen to be adjacent are still separate blocks. */
static void test_no_merge_across_blocks(void **state)
{
    (void)state;
    fk.gap = 0;
    struct sh_vaarena *a = mk(4 * G, 1ull << 40);
    uintptr_t v1 = get(a, 4 * G, 0), v2 = get(a, 4 * G, 0);
    assert_int_equal(v2, v1 + 4 * G);
    assert_int_equal(sh_vaarena_free(a, v1, 4 * G), 0);
    assert_int_equal(sh_vaarena_free(a, v2, 4 * G), 0);
    assert_int_equal(stats(a).free_ranges, 2);
    get(a, 8 * G, 0);
    assert_int_equal(fk.reserves, 3);
    finish(a);
}

static void test_best_fit(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(16 * G, 1ull << 40);
    uintptr_t v[16];
    for (int i = 0; i < 16; i++)
        v[i] = get(a, G, 0);
    for (int i = 1; i < 16; i++)
        assert_int_equal(v[i], v[0] + (uintptr_t)i * G);
    /* Holes: [1,4) 3G, [6] 1G, [9,11) 2G. */
    for (int i = 1; i < 4; i++)
        assert_int_equal(sh_vaarena_free(a, v[i], G), 0);
    assert_int_equal(sh_vaarena_free(a, v[6], G), 0);
    assert_int_equal(sh_vaarena_free(a, v[9], G), 0);
    assert_int_equal(sh_vaarena_free(a, v[10], G), 0);
    assert_int_equal(stats(a).free_ranges, 3);
    assert_int_equal(get(a, G, 0), v[6]);
    assert_int_equal(get(a, 2 * G, 0), v[9]);
    assert_int_equal(get(a, 2 * G, 0), v[1]);
    assert_int_equal(get(a, G, 0), v[3]);
    assert_int_equal(fk.reserves, 1);
    finish(a);
}

/* No exact fit: the smallest hole that fits wins, whatever the list order. */
static void test_best_fit_inexact(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(32 * G, 1ull << 40);
    uintptr_t v[32];
    for (int i = 0; i < 32; i++)
        v[i] = get(a, G, 0);
    /* Holes freed smallest first, so the smallest is the last one listed:
     * [1,5) 4G, [6,11) 5G, [12,19) 7G. */
    for (int i = 1; i < 5; i++)
        assert_int_equal(sh_vaarena_free(a, v[i], G), 0);
    for (int i = 6; i < 11; i++)
        assert_int_equal(sh_vaarena_free(a, v[i], G), 0);
    for (int i = 12; i < 19; i++)
        assert_int_equal(sh_vaarena_free(a, v[i], G), 0);
    assert_int_equal(stats(a).free_ranges, 3);
    assert_int_equal(get(a, 3 * G, 0), v[1]);
    assert_int_equal(get(a, 3 * G, 0), v[6]);
    assert_int_equal(get(a, 3 * G, 0), v[12]);
    assert_int_equal(fk.reserves, 1);
    finish(a);
}

static void test_cache_limit(void **state)
{
    (void)state;
    /* Limit 0: a wholly free block goes back at once. */
    struct sh_vaarena *a = mk(4 * G, 0);
    uintptr_t x = get(a, G, 0), y = get(a, G, 0);
    assert_int_equal(sh_vaarena_free(a, x, G), 0);
    assert_int_equal(fk.unreserves, 0); /* y still holds the block */
    assert_int_equal(sh_vaarena_free(a, y, G), 0);
    assert_int_equal(fk.unreserves, 1);
    struct sh_vaarena_stats st = stats(a);
    assert_int_equal(st.reserved_bytes, 0);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.unreserve_calls, 1);
    get(a, G, 0);
    assert_int_equal(fk.reserves, 2);
    finish(a);

    /* Limit one block: the first free block is kept, the second is not. */
    setup(NULL);
    a = mk(4 * G, 4 * G);
    uintptr_t b1 = get(a, 4 * G, 0), b2 = get(a, 4 * G, 0);
    assert_int_equal(sh_vaarena_free(a, b1, 4 * G), 0);
    assert_int_equal(fk.unreserves, 0);
    assert_int_equal(sh_vaarena_free(a, b2, 4 * G), 0);
    assert_int_equal(fk.unreserves, 1);
    assert_int_equal(stats(a).reserved_bytes, 4 * G);
    get(a, 4 * G, 0); /* served from the cached block */
    assert_int_equal(fk.reserves, 2);
    finish(a);
}

static void test_large_request(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(4 * G, 0);
    uintptr_t v = get(a, 40 * G, 0);
    assert_int_equal(fk.nlive, 1);
    assert_int_equal(fk.live[0].size, 40 * G);
    assert_int_equal(v, fk.live[0].va);
    assert_int_equal(sh_vaarena_free(a, v, 40 * G), 0);
    assert_int_equal(fk.nlive, 0);
    finish(a);
}

static void test_free_errors(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(16 * G, 1ull << 40);
    uintptr_t v = get(a, 4 * G, 0);
    get(a, G, 0);
    assert_int_equal(sh_vaarena_free(a, v + G, 3 * G), SH_EINVAL);  /* interior */
    assert_int_equal(sh_vaarena_free(a, v, 2 * G), SH_EINVAL);      /* wrong size */
    assert_int_equal(sh_vaarena_free(a, v + 10 * G, G), SH_EINVAL); /* free space */
    assert_int_equal(sh_vaarena_free(a, 12345, G), SH_EINVAL);      /* never ours */
    assert_int_equal(stats(a).in_use_bytes, 5 * G);
    assert_int_equal(sh_vaarena_free(a, v, 4 * G), 0);
    assert_int_equal(sh_vaarena_free(a, v, 4 * G), SH_EINVAL); /* double free */
    assert_int_equal(stats(a).in_use_bytes, G);
    finish(a);
}

static void test_reserve_failure(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(64 * G, 0);
    fk.fail_all = 1;
    uintptr_t v;
    assert_int_equal(sh_vaarena_alloc(a, G, 0, &v), SH_ENOMEM);
    assert_int_equal(stats(a).reserved_bytes, 0);
    /* A full block is refused, the request alone is not. */
    fk.fail_all = 0;
    fk.fail_above = 8 * G;
    int before = fk.reserves;
    v = get(a, 2 * G, 0);
    assert_int_equal(fk.reserves, before + 2);
    assert_int_equal(stats(a).reserved_bytes, 2 * G);
    finish(a);
}

static void test_trim_and_destroy(void **state)
{
    (void)state;
    struct sh_vaarena *a = mk(4 * G, 1ull << 40);
    uintptr_t b1 = get(a, 4 * G, 0), b2 = get(a, 4 * G, 0), b3 = get(a, 2 * G, 0);
    (void)b3;
    assert_int_equal(sh_vaarena_free(a, b1, 4 * G), 0);
    assert_int_equal(sh_vaarena_free(a, b2, 4 * G), 0);
    assert_int_equal(fk.unreserves, 0);
    assert_int_equal(sh_vaarena_trim(a), 8 * G);
    assert_int_equal(fk.unreserves, 2);
    assert_int_equal(stats(a).reserved_bytes, 4 * G);
    assert_int_equal(sh_vaarena_trim(a), 0);
    finish(a); /* b3's block goes too, though still in use */
}

/* ---- threads: no two live ranges may share a granule ------------------------- */

#define THREADS 8
#define OPS     20000
#define SLOTS   (1 << 16)

static int owner[SLOTS];
static int violations;
static struct sh_vaarena *shared;

static void mark(uintptr_t va, size_t size, int from, int to)
{
    for (size_t g = 0; g < size / G; g++) {
        size_t i = (va - BASE) / G + g;
        int expect = from;
        if (i >= SLOTS || !__atomic_compare_exchange_n(&owner[i], &expect, to, 0, __ATOMIC_SEQ_CST,
                                                       __ATOMIC_SEQ_CST))
            __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
    }
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t r = 777 + (uint64_t)id;
    uintptr_t live[8];
    size_t sz[8];
    int n = 0;
    for (int i = 0; i < OPS; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        if (n < 8 && (n == 0 || (r >> 33) % 2)) {
            sz[n] = (1 + (r >> 40) % 4) * G;
            if (sh_vaarena_alloc(shared, sz[n], G << ((r >> 50) % 2), &live[n]) != 0) {
                __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
                continue;
            }
            mark(live[n], sz[n], 0, id);
            n++;
        } else {
            int k = (int)((r >> 20) % (uint64_t)n);
            mark(live[k], sz[k], id, 0);
            if (sh_vaarena_free(shared, live[k], sz[k]) != 0)
                __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
            live[k] = live[--n];
            sz[k] = sz[n];
        }
    }
    while (n--) {
        mark(live[n], sz[n], id, 0);
        sh_vaarena_free(shared, live[n], sz[n]);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    shared = mk(64 * G, 128 * G);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)(i + 1)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(violations, 0);
    struct sh_vaarena_stats st = stats(shared);
    assert_int_equal(st.in_use_bytes, 0);
    assert_true(st.reserve_calls < 200); /* 160000 operations, nearly all from cache */
    assert_int_equal(sh_vaarena_trim(shared), st.reserved_bytes);
    assert_int_equal(stats(shared).reserved_bytes, 0);
    finish(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_bad_args, setup),
        cmocka_unit_test_setup(test_block_carving, setup),
        cmocka_unit_test_setup(test_alignment, setup),
        cmocka_unit_test_setup(test_steady_state, setup),
        cmocka_unit_test_setup(test_coalescing, setup),
        cmocka_unit_test_setup(test_no_merge_across_blocks, setup),
        cmocka_unit_test_setup(test_best_fit, setup),
        cmocka_unit_test_setup(test_best_fit_inexact, setup),
        cmocka_unit_test_setup(test_cache_limit, setup),
        cmocka_unit_test_setup(test_large_request, setup),
        cmocka_unit_test_setup(test_free_errors, setup),
        cmocka_unit_test_setup(test_reserve_failure, setup),
        cmocka_unit_test_setup(test_trim_and_destroy, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
