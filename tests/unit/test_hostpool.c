/* test_hostpool.c — the pinned host slab pool on its own budget, over the
 * fake VMM of hostpool_fakes.h (test_hostpool_share.c: budgets it shares). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "hostpool_fakes.h"

/* ---- tests ------------------------------------------------------------------------ */

static void test_bad_params(void **state)
{
    (void)state;
    struct sh_hostpool *hp = NULL;
    struct sh_hostpool_params p = params3(1, 1, 1, 8 * M, 8 * M, 0);
    assert_int_equal(sh_hostpool_create(NULL, &ops, &hp), SH_EINVAL);
    assert_int_equal(sh_hostpool_create(&p, NULL, &hp), SH_EINVAL);
    assert_int_equal(sh_hostpool_create(&p, &ops, NULL), SH_EINVAL);
    p.nclasses = 0;
    assert_int_equal(sh_hostpool_create(&p, &ops, &hp), SH_EINVAL);
    p.nclasses = SH_HOSTPOOL_MAX_CLASSES + 1;
    assert_int_equal(sh_hostpool_create(&p, &ops, &hp), SH_EINVAL);
    p = params3(1, 1, 1, 8 * M, 8 * M, 0);
    p.granularity = 0;
    assert_int_equal(sh_hostpool_create(&p, &ops, &hp), SH_EINVAL);
    /* Chunks below the granularity: no class at all. */
    p = params3(1, 1, 1, 8 * M, 8 * M, 0);
    p.chunk_max = G / 2;
    assert_int_equal(sh_hostpool_create(&p, &ops, &hp), SH_EINVAL);
    assert_null(hp);
    assert_int_equal(fk.creates + fk.reserves + fk.maps, 0);
}

static void test_class_choice(void **state)
{
    (void)state;
    struct sh_hostpool_params p = params3(2, 2, 2, 8 * M, 8 * M, 0);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.nclasses, 3);
    assert_int_equal(st.class_bytes[0], G);
    assert_int_equal(st.class_bytes[1], 4 * G);
    assert_int_equal(st.class_bytes[2], M);
    assert_int_equal(st.pinned_bytes, 2 * (G + 4 * G + M));
    assert_int_equal(st.budget_bytes, 8 * M);
    /* Each request gets the class of its own size. */
    static const struct {
        size_t bytes;
        int cls;
    } cases[] = {{G, 0}, {G, 0}, {4 * G, 1}, {4 * G, 1}, {M, 2}, {M, 2}};
    struct sh_slab *s[6];
    for (int i = 0; i < 6; i++) {
        s[i] = get(hp, cases[i].bytes, 0);
        assert_int_equal(s[i]->cls, cases[i].cls);
        assert_int_equal(s[i]->size, st.class_bytes[cases[i].cls]);
    }
    assert_true(s[0] != s[1] && s[2] != s[3] && s[4] != s[5]);
    assert_true(s[0]->staging != s[1]->staging && s[0]->handle != s[1]->handle);
    st = hstats(hp);
    assert_int_equal(st.hits, 6);
    assert_int_equal(st.fallbacks, 0);
    assert_int_equal(st.misses, 0);
    assert_int_equal(st.class_free[0] + st.class_free[1] + st.class_free[2], 0);
    /* No class of that size (below, between or above the classes): refused,
     * not a miss. */
    static const size_t odd[] = {0,         1,         G - 1, G + 1, 2 * G,
                                 4 * G - 1, 4 * G + 1, M - G, M + 1, 2 * M};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        struct sh_slab *none = NULL;
        assert_int_equal(sh_hostpool_get(hp, odd[i], 0, &none), SH_EINVAL);
        assert_null(none);
    }
    assert_int_equal(hstats(hp).misses, 0);
    /* Put back: each slab returns to its own class and is handed out again. */
    sh_hostpool_put(hp, s[2]);
    st = hstats(hp);
    assert_int_equal(st.class_free[1], 1);
    assert_ptr_equal(get(hp, 4 * G, 0), s[2]);
    for (int i = 0; i < 6; i++)
        sh_hostpool_put(hp, s[i]);
    st = hstats(hp);
    for (int c = 0; c < 3; c++)
        assert_int_equal(st.class_free[c], 2);
    assert_int_equal(fk.creates, 6);
    /* Every staging mapping let the CPU in: all went through map_host. */
    assert_int_equal(fk.host_maps, 6);
    assert_int_equal(fk.maps, 6);
    destroy(hp);
    books_balance();
}

/* Only whole handles map, so a chunk needs a slab of its own size: a
 * request never gets a larger slab, however many are free. */
static void test_never_larger(void **state)
{
    (void)state;
    /* Class 0 has no slabs at all; class 1 has one, class 2 one. */
    struct sh_hostpool_params p = params3(0, 1, 1, 8 * M, 8 * M, 0);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.class_free[0], 0);
    assert_int_equal(st.class_free[1], 1);
    assert_int_equal(st.class_free[2], 1);
    /* Its own class is empty, the larger ones are not: a miss all the same. */
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, G, 0, &x), SH_ENOMEM);
    assert_null(x);
    st = hstats(hp);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.hits, 0);
    assert_int_equal(st.fallbacks, 0);
    assert_int_equal(st.class_free[1], 1); /* untouched */
    assert_int_equal(st.class_free[2], 1);
    /* A size between classes has no class: refused, not a miss, and not
     * served by the next class up either. */
    assert_int_equal(sh_hostpool_get(hp, 2 * G, 0, &x), SH_EINVAL);
    assert_int_equal(sh_hostpool_get(hp, G + 1, 0, &x), SH_EINVAL);
    assert_int_equal(sh_hostpool_get(hp, 4 * G + 1, 0, &x), SH_EINVAL);
    assert_null(x);
    st = hstats(hp);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.class_free[1], 1);
    assert_int_equal(st.class_free[2], 1);
    /* Exact sizes get their own slabs. */
    struct sh_slab *a = get(hp, 4 * G, 0);
    assert_int_equal(a->cls, 1);
    struct sh_slab *b = get(hp, M, 0);
    assert_int_equal(b->cls, 2);
    /* Class 1 is empty now, class 2 too: putting the 1M slab back does not
     * make it a candidate for a 256K request. */
    sh_hostpool_put(hp, b);
    assert_int_equal(sh_hostpool_get(hp, 4 * G, 0, &x), SH_ENOMEM);
    assert_null(x);
    st = hstats(hp);
    assert_int_equal(st.class_free[1], 0);
    assert_int_equal(st.class_free[2], 1);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 2);
    assert_int_equal(st.fallbacks, 0);
    /* And a slab goes back to the class it belongs to. */
    sh_hostpool_put(hp, a);
    assert_ptr_equal(get(hp, 4 * G, 0), a);
    sh_hostpool_put(hp, a);
    assert_int_equal(fk.creates, 2);
    destroy(hp);
    books_balance();
}

static void test_exhaustion(void **state)
{
    (void)state;
    /* The budget holds exactly what was pre-pinned; the grower can add nothing. */
    size_t budget = 2 * G + 4 * G;
    struct sh_hostpool_params p = params3(2, 1, 1, budget, budget, 1);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.pinned_bytes, budget);
    assert_int_equal(st.class_total[0], 2);
    assert_int_equal(st.class_total[1], 1);
    assert_int_equal(st.class_total[2], 0); /* 1M does not fit */
    struct sh_slab *s[3] = {get(hp, G, 0), get(hp, G, 0), get(hp, 4 * G, 0)};
    assert_int_equal(s[2]->cls, 1);
    double t0 = now_ms();
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, G, 2000, &x), SH_ENOMEM);
    assert_int_equal(sh_hostpool_get(hp, 4 * G, 2000, &x), SH_ENOMEM);
    assert_int_equal(sh_hostpool_get(hp, M, 2000, &x), SH_ENOMEM);
    assert_true(now_ms() - t0 < 500); /* the budget is spent: no waiting */
    assert_null(x);
    st = hstats(hp);
    assert_int_equal(st.misses, 3);
    assert_int_equal(st.hits, 3);
    assert_int_equal(st.fallbacks, 0);
    assert_int_equal(st.grown, 0);
    assert_int_equal(st.waits, 0);
    assert_int_equal(st.pinned_bytes, budget);
    /* A slab put back is found again. */
    sh_hostpool_put(hp, s[1]);
    assert_ptr_equal(get(hp, G, 0), s[1]);
    for (int i = 0; i < 3; i++)
        sh_hostpool_put(hp, s[i]);
    destroy(hp);
    assert_int_equal(fk.creates, 3);
    books_balance();
}

static void test_growth_to_targets(void **state)
{
    (void)state;
    struct sh_hostpool_params p = params3(3, 2, 0, 64 * M, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = settle(hp, 5);
    assert_int_equal(st.class_total[0], 3);
    assert_int_equal(st.class_total[1], 2);
    assert_int_equal(st.class_total[2], 0);
    assert_int_equal(st.class_free[0], 3);
    assert_int_equal(st.class_free[1], 2);
    assert_int_equal(st.pinned_bytes, 3 * G + 2 * 4 * G);
    /* Taking from a class brings it back up to its target. */
    struct sh_slab *a = get(hp, G, 0), *b = get(hp, G, 0);
    st = settle(hp, 7);
    assert_int_equal(st.class_total[0], 5);
    assert_int_equal(st.class_free[0], 3);
    /* Put back: above the target, nothing is grown or released. */
    sh_hostpool_put(hp, a);
    sh_hostpool_put(hp, b);
    st = settle(hp, 7);
    assert_int_equal(st.class_free[0], 5);
    assert_int_equal(fk.creates, 7);
    destroy(hp);
    books_balance();
}

/* A dormant pool (a device far below its limit) pins nothing ahead of
 * need: a caller still gets its slab, and growth towards the targets
 * starts once the pool is woken. */
static void test_dormant_until_woken(void **state)
{
    (void)state;
    struct sh_hostpool_params p = params3(3, 2, 0, 64 * M, 0, 1);
    p.dormant = 1;
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = settle(hp, 0);
    assert_int_equal(st.pinned_bytes, 0);
    struct sh_slab *a = get(hp, G, 2000); /* asked for: pinned all the same */
    st = settle(hp, 1);
    assert_int_equal(st.pinned_bytes, G);
    sh_hostpool_wake(hp);
    st = settle(hp, 6); /* class 0 back to 3 free, class 1 to 2 */
    assert_int_equal(st.class_free[0], 3);
    assert_int_equal(st.class_free[1], 2);
    sh_hostpool_wake(hp); /* twice: nothing more */
    st = settle(hp, 6);
    sh_hostpool_put(hp, a);
    destroy(hp);
    books_balance();
}

static void test_budget_never_exceeded(void **state)
{
    (void)state;
    /* Targets far beyond a budget that is no multiple of any class. */
    size_t budget = M + 32 * K;
    struct sh_hostpool_params p = params3(4, 10, 10, budget, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    /* Class 0 to its target (256K), then class 1 while it fits: 3 more. */
    struct sh_hostpool_stats st = settle(hp, 7);
    assert_int_equal(st.class_total[0], 4);
    assert_int_equal(st.class_total[1], 3);
    assert_int_equal(st.class_total[2], 0);
    assert_int_equal(st.pinned_bytes, M);
    assert_int_equal(fk.host_peak, M);
    /* Emptying class 0 asks for growth that no longer fits. */
    struct sh_slab *s[4];
    for (int i = 0; i < 4; i++)
        s[i] = get(hp, G, 0);
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, M, 100, &x), SH_ENOMEM);
    st = settle(hp, 7);
    assert_true(fk.host_peak <= budget);
    assert_int_equal(st.pinned_bytes, M);
    for (int i = 0; i < 4; i++)
        sh_hostpool_put(hp, s[i]);
    destroy(hp);
    books_balance();
}

static void test_wait_satisfied_by_growth(void **state)
{
    (void)state;
    fk.create_us = 20000; /* 20 ms a slab */
    struct sh_hostpool_params p = params3(0, 0, 0, 64 * M, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    usleep(30000);
    assert_int_equal(hstats(hp).grown, 0); /* no targets: nothing grown ahead */
    double t0 = now_ms();
    struct sh_slab *s = get(hp, 4 * G, 2000);
    double waited = now_ms() - t0;
    assert_int_equal(s->cls, 1);
    assert_true(waited >= 15 && waited < 1500);
    struct sh_hostpool_stats st = settle(hp, 1); /* exactly the one asked for */
    assert_int_equal(st.waits, 1);
    assert_int_equal(st.misses, 0);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.class_total[1], 1);
    assert_int_equal(st.class_free[1], 0);
    assert_int_equal(st.pinned_bytes, 4 * G);
    sh_hostpool_put(hp, s);
    destroy(hp);
    books_balance();
}

/* A waiter woken by growth in another class neither asks for a second slab
 * nor counts as a second wait. */
static void test_wait_ignores_other_growth(void **state)
{
    (void)state;
    fk.create_us = 60000;
    struct sh_hostpool_params p = params3(1, 0, 0, 64 * M, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    usleep(15000); /* the grower is pinning class 0's slab now */
    struct sh_slab *s = get(hp, M, 3000);
    assert_int_equal(s->cls, 2);
    struct sh_hostpool_stats st = settle(hp, 2);
    assert_int_equal(st.class_total[0], 1);
    assert_int_equal(st.class_total[2], 1);
    assert_int_equal(st.waits, 1);
    assert_int_equal(st.pinned_bytes, G + M);
    sh_hostpool_put(hp, s);
    destroy(hp);
    books_balance();
}

static void test_wait_times_out(void **state)
{
    (void)state;
    fk.create_us = 300000; /* slower than the caller will wait */
    struct sh_hostpool_params p = params3(0, 0, 0, 64 * M, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    double t0 = now_ms();
    struct sh_slab *s = NULL;
    assert_int_equal(sh_hostpool_get(hp, G, 50, &s), SH_ENOMEM);
    double waited = now_ms() - t0;
    assert_true(waited >= 45 && waited < 280);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.waits, 1);
    assert_int_equal(st.timeouts, 1); /* what an out-of-memory line says */
    /* The slab asked for still arrives, and the next caller gets it at once. */
    st = settle(hp, 1);
    assert_int_equal(st.class_free[0], 1);
    t0 = now_ms();
    s = get(hp, G, 0);
    assert_true(now_ms() - t0 < 100);
    struct sh_slab *x = NULL; /* a caller that does not wait does not time out */
    assert_int_equal(sh_hostpool_get(hp, G, 0, &x), SH_ENOMEM);
    assert_int_equal(hstats(hp).timeouts, 1);
    sh_hostpool_put(hp, s);
    destroy(hp);
    books_balance();
}

static void test_lift_and_merge(void **state)
{
    (void)state;
    /* 4K and 16K lift to the 64K granularity and merge with 64K; 100K lifts to 128K. */
    struct sh_hostpool_params p = {.granularity = G,
                                   .class_bytes = {4 * K, 16 * K, G, 100 * K, 4 * G},
                                   .slabs = {1, 2, 3, 1, 1},
                                   .nclasses = 5,
                                   .ram_budget = 16 * M,
                                   .prepin = 16 * M};
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.nclasses, 3);
    assert_int_equal(st.class_bytes[0], G);
    assert_int_equal(st.class_bytes[1], 2 * G);
    assert_int_equal(st.class_bytes[2], 4 * G);
    assert_int_equal(st.class_total[0], 6); /* the merged targets */
    assert_int_equal(st.class_total[1], 1);
    assert_int_equal(st.class_total[2], 1);
    struct sh_slab *s = get(hp, G, 0);
    assert_int_equal(s->cls, 0);
    s = get(hp, 2 * G, 0);
    assert_int_equal(s->cls, 1);
    /* Requests take the class size, not the sizes configured before lifting. */
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, 4 * K, 0, &x), SH_EINVAL);
    assert_int_equal(sh_hostpool_get(hp, 16 * K, 0, &x), SH_EINVAL);
    assert_int_equal(sh_hostpool_get(hp, 100 * K, 0, &x), SH_EINVAL);
    assert_null(x);
    assert_int_equal(hstats(hp).misses, 0);
    destroy(hp); /* slabs still handed out go too */
    books_balance();
}

/* 1 if the fake has va mapped to handle. */
static int mapped_at(uintptr_t va, uint64_t handle)
{
    int yes = 0;
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i < fk.nmaps; i++)
        yes |= fk.map_va[i] == va && fk.map_h[i] == handle;
    pthread_mutex_unlock(&fk.mu);
    return yes;
}

/* Every slab's staging mapping, pre-pinned or grown, goes through map_host
 * when the ops have one (the CPU reads slabs there: the driver must be told
 * so), else through map. */
static void test_staging_maps(void **state)
{
    (void)state;
    /* Two 64K slabs pre-pinned (their target); a 256K one grown for a caller. */
    struct sh_hostpool_params p = params3(2, 0, 0, 64 * M, 2 * G, 1);
    for (int with_host = 1; with_host >= 0; with_host--) {
        setup(NULL);
        struct sh_vmm_ops o = ops;
        if (!with_host)
            o.map_host = NULL;
        struct sh_hostpool *hp = mk_ops(&p, &o);
        assert_int_equal(hstats(hp).class_total[0], 2);
        struct sh_slab *b = get(hp, 4 * G, 2000); /* waits for the grower */
        struct sh_hostpool_stats st = hstats(hp);
        assert_int_equal(st.grown, 1);
        assert_int_equal(st.waits, 1);
        assert_int_equal(fake_get(&fk.creates), 3);
        assert_int_equal(fake_get(&fk.maps), 3);
        assert_int_equal(fake_get(&fk.host_maps), with_host ? 3 : 0);
        assert_int_equal(fake_get(&fk.live_maps), 3);
        assert_true(mapped_at(b->staging, b->handle));
        /* Taking a 64K slab sends the grower to refill its class, however
         * far it gets before destroy() stops it: count once it has. */
        struct sh_slab *a = get(hp, G, 0);
        assert_true(mapped_at(a->staging, a->handle));
        sh_hostpool_put(hp, a);
        sh_hostpool_put(hp, b);
        destroy(hp);
        assert_true(fk.creates >= 3);
        assert_int_equal(fk.maps, fk.creates);
        assert_int_equal(fk.host_maps, with_host ? fk.creates : 0);
        books_balance();
    }
}

/* chunk_max set: one class per chunk size, chunk_max halved down to the
 * granularity; each configured class gives its target to the smallest chunk
 * size that holds it, and one above chunk_max is dropped. */
static void test_chunk_classes(void **state)
{
    (void)state;
    struct sh_hostpool_params p = {.granularity = G,
                                   .chunk_max = 8 * G,
                                   .class_bytes = {G, 4 * G, M},
                                   .slabs = {3, 2, 5},
                                   .nclasses = 3,
                                   .ram_budget = 64 * M,
                                   .prepin = 64 * M};
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.nclasses, 4);
    static const size_t sizes[4] = {G, 2 * G, 4 * G, 8 * G};
    static const unsigned want[4] = {3, 0, 2, 0}; /* the 1M class (16 granules) is dropped */
    for (int c = 0; c < 4; c++) {
        assert_int_equal(st.class_bytes[c], sizes[c]);
        assert_int_equal(st.class_total[c], want[c]);
        assert_int_equal(st.class_free[c], want[c]);
    }
    assert_int_equal(st.pinned_bytes, 3 * G + 2 * 4 * G);
    assert_int_equal(fk.creates, 5);
    assert_int_equal(fk.host_maps, 5);
    /* Every chunk size is a class; nothing else is. */
    struct sh_slab *a = get(hp, G, 0), *b = get(hp, 4 * G, 0);
    assert_int_equal(a->cls, 0);
    assert_int_equal(b->cls, 2);
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, 2 * G, 0, &x), SH_ENOMEM); /* a class, empty */
    assert_int_equal(sh_hostpool_get(hp, 8 * G, 0, &x), SH_ENOMEM);
    assert_int_equal(sh_hostpool_get(hp, 3 * G, 0, &x), SH_EINVAL);
    assert_int_equal(sh_hostpool_get(hp, G / 2, 0, &x), SH_EINVAL);
    assert_int_equal(sh_hostpool_get(hp, 16 * G, 0, &x), SH_EINVAL); /* above chunk_max */
    assert_null(x);
    st = hstats(hp);
    assert_int_equal(st.misses, 2);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.fallbacks, 0);
    sh_hostpool_put(hp, a);
    sh_hostpool_put(hp, b);
    destroy(hp);
    books_balance();

    /* Configured classes that are no chunk size give their targets to the
     * next chunk size up: 4K to 64K, 3 granules to 4, 5 granules to 8. */
    setup(NULL);
    p = (struct sh_hostpool_params){.granularity = G,
                                    .chunk_max = 8 * G,
                                    .class_bytes = {4 * K, 3 * G, 5 * G},
                                    .slabs = {1, 2, 1},
                                    .nclasses = 3,
                                    .ram_budget = 64 * M,
                                    .prepin = 64 * M};
    hp = mk(&p);
    st = hstats(hp);
    static const unsigned want2[4] = {1, 0, 2, 1};
    assert_int_equal(st.nclasses, 4);
    for (int c = 0; c < 4; c++) {
        assert_int_equal(st.class_bytes[c], sizes[c]);
        assert_int_equal(st.class_total[c], want2[c]);
    }
    assert_int_equal(st.pinned_bytes, G + 2 * 4 * G + 8 * G);
    assert_int_equal(fk.creates, 4);
    destroy(hp);
    books_balance();

    /* Targets landing on one chunk size add up (128K: 2 + 1), and prepin
     * still goes smallest class first, whole slabs only: of 448K, four 64K
     * slabs, then one 128K slab; a second would pass it. */
    setup(NULL);
    p = (struct sh_hostpool_params){.granularity = G,
                                    .chunk_max = 4 * G,
                                    .class_bytes = {G, 2 * G - K, 2 * G},
                                    .slabs = {4, 2, 1},
                                    .nclasses = 3,
                                    .ram_budget = 64 * M,
                                    .prepin = 7 * G};
    hp = mk(&p);
    st = hstats(hp);
    assert_int_equal(st.nclasses, 3);
    assert_int_equal(st.class_bytes[2], 4 * G);
    assert_int_equal(st.class_total[0], 4);
    assert_int_equal(st.class_total[1], 1); /* of its target of 3 */
    assert_int_equal(st.class_total[2], 0);
    assert_int_equal(st.pinned_bytes, 6 * G);
    destroy(hp);
    books_balance();
}

static void test_prepin_amount(void **state)
{
    (void)state;
    /* Smallest classes first, whole slabs only, never beyond prepin. */
    struct sh_hostpool_params p = params3(4, 2, 1, 64 * M, 200 * K, 0);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.pinned_bytes, 3 * G);
    assert_int_equal(st.class_total[0], 3);
    assert_int_equal(st.class_total[1], 0);
    assert_int_equal(st.class_total[2], 0);
    assert_int_equal(fk.creates, 3);
    destroy(hp);
    books_balance();

    /* Prepin past the budget: the budget wins. */
    setup(NULL);
    p = params3(4, 2, 1, 5 * G, 64 * M, 0);
    hp = mk(&p);
    st = hstats(hp);
    assert_int_equal(st.pinned_bytes, 4 * G);
    assert_int_equal(st.class_total[1], 0);
    destroy(hp);
    books_balance();

    /* Prepin 0: nothing at start, and without a grower nothing ever. */
    setup(NULL);
    p = params3(4, 2, 1, 64 * M, 0, 0);
    hp = mk(&p);
    assert_int_equal(hstats(hp).pinned_bytes, 0);
    struct sh_slab *s = NULL;
    assert_int_equal(sh_hostpool_get(hp, G, 100, &s), SH_ENOMEM);
    assert_int_equal(fk.creates, 0);
    destroy(hp);
    books_balance();
}

static void test_teardown_releases_everything(void **state)
{
    (void)state;
    struct sh_hostpool_params p = params3(3, 3, 2, 64 * M, 64 * M, 1);
    struct sh_hostpool *hp = mk(&p);
    struct sh_slab *held[3] = {get(hp, G, 0), get(hp, M, 0), get(hp, M, 0)};
    settle(hp, 3);                /* refills class 0 once, class 2 twice */
    sh_hostpool_put(hp, held[0]); /* one back, two still handed out */
    settle(hp, 3);
    assert_int_equal(fake_get(&fk.live_handles), 11);
    assert_int_equal(fake_get(&fk.live_maps), 11);
    assert_int_equal(fake_get(&fk.live_reserves), 11);
    destroy(hp);
    assert_int_equal(fk.releases, 11);
    assert_int_equal(fk.unmaps, 11);
    assert_int_equal(fk.unreserves, 11);
    books_balance();
}

static void test_create_failure_prepin(void **state)
{
    (void)state;
    /* The host runs out while pre-pinning: create fails, nothing leaks. */
    fk.fail_create_after = 2;
    struct sh_hostpool_params p = params3(4, 0, 0, 64 * M, 64 * M, 1);
    struct sh_hostpool *hp = NULL;
    assert_int_equal(sh_hostpool_create(&p, &ops, &hp), SH_ENOMEM);
    assert_int_equal(fk.creates, 3);
    books_balance();

    /* Staging cannot be mapped: the handle and the reservation go back. */
    setup(NULL);
    fk.fail_map = 1;
    assert_int_equal(sh_hostpool_create(&p, &ops, &hp), SH_EDRIVER);
    assert_int_equal(fk.creates, 1);
    assert_int_equal(fk.releases, 1);
    assert_int_equal(fk.unreserves, 1);
    assert_int_equal(fk.unmaps, 0);
    books_balance();
}

static void test_create_failure_grower(void **state)
{
    (void)state;
    /* The host can pin three slabs; targets ask for far more. */
    fk.fail_create_after = 3;
    struct sh_hostpool_params p = params3(10, 0, 0, 64 * M, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = settle(hp, 3);
    assert_int_equal(st.pinned_bytes, 3 * G);
    assert_int_equal(st.budget_bytes, 3 * G); /* what could be pinned is all there is */
    assert_int_equal(fake_get(&fk.creates), 4);
    struct sh_slab *s[3] = {get(hp, G, 0), get(hp, G, 0), get(hp, G, 0)};
    double t0 = now_ms();
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, G, 5000, &x), SH_ENOMEM);
    assert_int_equal(sh_hostpool_get(hp, M, 5000, &x), SH_ENOMEM);
    assert_true(now_ms() - t0 < 500);
    /* The grower has stopped: no more attempts. */
    usleep(30000);
    assert_int_equal(fake_get(&fk.creates), 4);
    for (int i = 0; i < 3; i++)
        sh_hostpool_put(hp, s[i]);
    destroy(hp);
    books_balance();
}

static void test_create_failure_while_waiting(void **state)
{
    (void)state;
    /* A caller waiting on growth that fails is told at once, not at its deadline. */
    fk.create_us = 30000;
    fk.fail_create_after = 0;
    struct sh_hostpool_params p = params3(0, 0, 0, 64 * M, 0, 1);
    struct sh_hostpool *hp = mk(&p);
    double t0 = now_ms();
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(hp, G, 5000, &x), SH_ENOMEM);
    double waited = now_ms() - t0;
    assert_true(waited >= 25 && waited < 1000);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.budget_bytes, 0);
    assert_int_equal(st.pinned_bytes, 0);
    destroy(hp);
    books_balance();
}

/* The budget is spent on small slabs nobody uses: a caller waiting for a
 * large one gets it in their place. Slabs handed out are never taken. */
static void test_idle_slabs_make_room(void **state)
{
    (void)state;
    struct sh_hostpool_params p = params3(8, 0, 0, 8 * G, 8 * G, 1);
    struct sh_hostpool *hp = mk(&p);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.class_total[0], 8);
    assert_int_equal(st.pinned_bytes, 8 * G);
    struct sh_slab *held[2] = {get(hp, G, 0), get(hp, G, 0)};
    struct sh_slab *big = get(hp, 4 * G, 2000);
    assert_int_equal(big->cls, 1);
    st = settle(hp, 1);
    assert_int_equal(st.class_total[0], 4); /* four idle ones gave way */
    assert_int_equal(st.class_free[0], 2);
    assert_int_equal(st.class_total[1], 1);
    assert_int_equal(st.pinned_bytes, 8 * G);
    assert_int_equal(fk.host_peak, 8 * G);
    assert_int_equal(fake_get(&fk.releases), 4);
    /* Two idle small slabs are not room enough for another large one. */
    struct sh_slab *x = NULL;
    double t0 = now_ms();
    assert_int_equal(sh_hostpool_get(hp, 4 * G, 2000, &x), SH_ENOMEM);
    assert_true(now_ms() - t0 < 500);
    /* Nor for a 1M one (16 granules), even with everything idle. */
    sh_hostpool_put(hp, big);
    assert_int_equal(sh_hostpool_get(hp, M, 2000, &x), SH_ENOMEM);
    st = settle(hp, 1);
    assert_int_equal(st.class_total[0], 4);
    assert_int_equal(st.class_total[1], 1);
    assert_int_equal(fake_get(&fk.releases), 4);
    /* The slabs it holds stay valid throughout. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fk.hsize[held[i]->handle], G);
        sh_hostpool_put(hp, held[i]);
    }
    destroy(hp);
    books_balance();
}

/* ---- threads: no slab is ever handed out twice ---------------------------------- */

struct worker {
    struct sh_hostpool *hp;
    unsigned seed;
    int got, failed, wrong_size;
};

static int owner[MAXH];
static pthread_mutex_t owner_mu = PTHREAD_MUTEX_INITIALIZER;
static int double_owned;

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct sh_slab *mine[8] = {0};
    for (int op = 0; op < 2000; op++) {
        w->seed = w->seed * 1103515245u + 12345u;
        unsigned k = (w->seed >> 8) % 8;
        if (mine[k]) {
            pthread_mutex_lock(&owner_mu);
            owner[mine[k]->handle] = 0;
            pthread_mutex_unlock(&owner_mu);
            sh_hostpool_put(w->hp, mine[k]);
            mine[k] = NULL;
            continue;
        }
        size_t bytes = ((w->seed >> 12) % 3 == 0) ? M : ((w->seed >> 12) % 3 == 1) ? 4 * G : G;
        if (sh_hostpool_get(w->hp, bytes, 50, &mine[k]) != 0) {
            w->failed++;
            mine[k] = NULL;
            continue;
        }
        w->got++;
        w->wrong_size += mine[k]->size != bytes;
        pthread_mutex_lock(&owner_mu);
        double_owned += owner[mine[k]->handle] != 0;
        owner[mine[k]->handle] = 1;
        pthread_mutex_unlock(&owner_mu);
    }
    for (int k = 0; k < 8; k++)
        if (mine[k]) {
            pthread_mutex_lock(&owner_mu);
            owner[mine[k]->handle] = 0;
            pthread_mutex_unlock(&owner_mu);
            sh_hostpool_put(w->hp, mine[k]);
        }
    return NULL;
}

/* ---- a budget shared with other processes ------------------------------------------ */

static void test_threads(void **state)
{
    (void)state;
    memset(owner, 0, sizeof owner);
    double_owned = 0;
    size_t budget = 8 * M;
    struct sh_hostpool_params p = params3(4, 4, 2, budget, M, 1);
    struct sh_hostpool *hp = mk(&p);
    pthread_t t[4];
    struct worker w[4];
    for (unsigned i = 0; i < 4; i++) {
        w[i] = (struct worker){.hp = hp, .seed = 7 + i};
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    int got = 0, wrong_size = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        got += w[i].got;
        wrong_size += w[i].wrong_size;
    }
    assert_int_equal(double_owned, 0);
    assert_int_equal(wrong_size, 0);
    assert_true(got > 1000);
    struct sh_hostpool_stats st = hstats(hp);
    assert_true(st.pinned_bytes <= budget);
    assert_true(fk.host_peak <= budget);
    unsigned total = 0, freec = 0;
    for (int c = 0; c < 3; c++) {
        total += st.class_total[c];
        freec += st.class_free[c];
    }
    assert_int_equal(total, freec); /* everything came back */
    assert_int_equal(st.hits, (uint64_t)got);
    assert_int_equal(st.fallbacks, 0);
    destroy(hp);
    books_balance();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_class_choice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_never_larger, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exhaustion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_growth_to_targets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dormant_until_woken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_never_exceeded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_satisfied_by_growth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ignores_other_growth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lift_and_merge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_staging_maps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_classes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepin_amount, setup, teardown),
        cmocka_unit_test_setup_teardown(test_teardown_releases_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_failure_prepin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_failure_grower, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_failure_while_waiting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_slabs_make_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return cmocka_run_group_tests_name("hostpool", tests, NULL, NULL);
}
