/* test_suballoc.c — small-block sub-allocator: classes, stream-ordered reuse
 * with fences completed by hand, misuse, slab return, threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool_parts.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define K        ((size_t)1 << 10)
#define M        ((size_t)1 << 20)
#define SBASE    ((uintptr_t)1 << 44)
#define MAXSLABS 1024
#define MAXF     4096
#define S1       0x1001 /* stream ids */
#define S2       0x2002

/* ---- fake slab source and fences ------------------------------------------ */

struct fake {
    pthread_mutex_t mu;
    uintptr_t next;
    int gets, puts, bad, fail;
    struct {
        uintptr_t base;
        size_t bytes;
    } live[MAXSLABS], gone[MAXSLABS]; /* gone: returned, handed out again first */
    int nlive, ngone;
    uint64_t completed; /* fences <= completed are done */
    int drops[MAXF];
    uint64_t total_drops;
};

static struct fake fk;

static int f_slab_get(void *ctx, size_t bytes, uintptr_t *base)
{
    struct fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->gets++;
    if (f->fail || f->nlive == MAXSLABS) {
        err = SH_ENOMEM;
    } else {
        int i = 0;
        while (i < f->ngone && f->gone[i].bytes != bytes)
            i++;
        if (i < f->ngone) {
            *base = f->gone[i].base;
            f->gone[i] = f->gone[--f->ngone];
        } else {
            *base = f->next;
            f->next += bytes; /* slabs are adjacent: ownership must not bleed */
        }
        f->live[f->nlive].base = *base;
        f->live[f->nlive++].bytes = bytes;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static void f_slab_put(void *ctx, uintptr_t base, size_t bytes)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->puts++;
    int i = 0;
    while (i < f->nlive && (f->live[i].base != base || f->live[i].bytes != bytes))
        i++;
    if (i == f->nlive) {
        f->bad++;
    } else {
        f->gone[f->ngone++] = f->live[i];
        f->live[i] = f->live[--f->nlive];
    }
    pthread_mutex_unlock(&f->mu);
}

static int f_fence_done(void *ctx, uint64_t fence)
{
    struct fake *f = ctx;
    if (fence == 0)
        __atomic_add_fetch(&f->bad, 1, __ATOMIC_SEQ_CST); /* 0 never waits */
    return fence <= __atomic_load_n(&f->completed, __ATOMIC_SEQ_CST);
}

static void f_fence_drop(void *ctx, uint64_t fence)
{
    struct fake *f = ctx;
    if (fence == 0)
        __atomic_add_fetch(&f->bad, 1, __ATOMIC_SEQ_CST);
    if (fence < MAXF)
        __atomic_add_fetch(&f->drops[fence], 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&f->total_drops, 1, __ATOMIC_SEQ_CST);
}

static const struct sh_suballoc_ops ops = {
    .ctx = &fk,
    .slab_get = f_slab_get,
    .slab_put = f_slab_put,
    .fence_done = f_fence_done,
    .fence_drop = f_fence_drop,
};

static int setup(void **state)
{
    (void)state;
    pthread_mutex_destroy(&fk.mu);
    memset(&fk, 0, sizeof fk);
    fk.next = SBASE;
    pthread_mutex_init(&fk.mu, NULL);
    return 0;
}

static struct sh_suballoc *mk(const struct sh_suballoc_config *cfg)
{
    struct sh_suballoc *sa = NULL;
    assert_int_equal(sh_suballoc_create(&ops, cfg, &sa), 0);
    return sa;
}

static void finish(struct sh_suballoc *sa)
{
    sh_suballoc_destroy(sa);
    assert_int_equal(fk.nlive, 0); /* every slab went back */
    assert_int_equal(fk.bad, 0);
}

static uintptr_t get(struct sh_suballoc *sa, size_t size, uint64_t stream)
{
    uintptr_t p = 0;
    assert_int_equal(sh_suballoc_alloc(sa, size, stream, &p), 0);
    assert_int_not_equal(p, 0);
    return p;
}

static void put(struct sh_suballoc *sa, uintptr_t p, uint64_t stream, uint64_t fence)
{
    assert_int_equal(sh_suballoc_free(sa, p, stream, fence), 0);
}

static struct sh_suballoc_stats stats(struct sh_suballoc *sa)
{
    struct sh_suballoc_stats st;
    sh_suballoc_stats(sa, &st);
    return st;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_create_args(void **state)
{
    (void)state;
    struct sh_suballoc *sa = NULL;
    struct sh_suballoc_ops bad = ops;
    bad.fence_done = NULL;
    assert_int_equal(sh_suballoc_create(&bad, NULL, &sa), SH_EINVAL);
    struct sh_suballoc_config c = {.max_block = 3000};
    assert_int_equal(sh_suballoc_create(&ops, &c, &sa), SH_EINVAL);
    c.max_block = 256;
    assert_int_equal(sh_suballoc_create(&ops, &c, &sa), SH_EINVAL);
    bad = ops;
    bad.fence_drop = NULL; /* optional */
    assert_int_equal(sh_suballoc_create(&bad, NULL, &sa), 0);
    sh_suballoc_destroy(sa);
}

static void test_classes(void **state)
{
    (void)state;
    static const struct {
        size_t ask, cls;
    } t[] = {
        {1, 512},           {511, 512},       {512, 512},   {513, 1024},
        {1000, 1024},       {4096, 4096},     {4097, 8192}, {100 * K, 128 * K},
        {512 * K, 512 * K}, {512 * K + 1, M}, {M, M},
    };
    struct sh_suballoc *sa = mk(NULL);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        uintptr_t p = get(sa, t[i].ask, S1);
        size_t bs = 0;
        assert_int_equal(sh_suballoc_block_size(sa, p, &bs), 0);
        assert_int_equal(bs, t[i].cls);
        assert_int_equal((p - SBASE) % t[i].cls, 0);
        assert_true(sh_suballoc_owns(sa, p));
        assert_true(sh_suballoc_owns(sa, p + bs - 1));
    }
    uintptr_t p;
    assert_int_equal(sh_suballoc_alloc(sa, 0, S1, &p), SH_EINVAL);
    assert_int_equal(sh_suballoc_alloc(sa, M + 1, S1, &p), SH_EINVAL);
    assert_int_equal(sh_suballoc_alloc(sa, 512, S1, NULL), SH_EINVAL);
    /* One slab per class used: 2 MiB each (the 1 MiB class gets 2 blocks). */
    assert_int_equal(fk.gets, 7); /* classes 512, 1K, 4K, 8K, 128K, 512K, 1M */
    for (int i = 0; i < fk.nlive; i++)
        assert_int_equal(fk.live[i].bytes, 2 * M);
    struct sh_suballoc_stats st = stats(sa);
    assert_int_equal(st.slabs, 7);
    assert_int_equal(st.slab_bytes, 14 * M);
    assert_int_equal(st.allocs, 11);
    finish(sa);
}

/* The biggest classes get slabs larger than slab_bytes. */
static void test_big_class_slab(void **state)
{
    (void)state;
    struct sh_suballoc_config c = {.max_block = 4 * M, .slab_bytes = 2 * M, .keep_empty = 1};
    struct sh_suballoc *sa = mk(&c);
    get(sa, 3 * M, S1);
    assert_int_equal(fk.live[0].bytes, 8 * M);
    get(sa, 3 * M, S1);
    assert_int_equal(fk.gets, 1);
    get(sa, 3 * M, S1);
    assert_int_equal(fk.gets, 2);
    finish(sa);
}

static void test_same_stream_reuse(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    uintptr_t p = get(sa, 4096, S1);
    put(sa, p, S1, 7); /* fence 7 not done */
    assert_int_equal(stats(sa).pending_bytes, 4096);
    assert_int_equal(get(sa, 4096, S1), p);
    assert_int_equal(fk.drops[7], 1);
    struct sh_suballoc_stats st = stats(sa);
    assert_int_equal(st.same_stream_reuse, 1);
    assert_int_equal(st.pending_bytes, 0);
    assert_int_equal(st.used_bytes, 4096);
    /* Newest first on the same stream. */
    uintptr_t q = get(sa, 4096, S1);
    put(sa, p, S1, 8);
    put(sa, q, S1, 9);
    assert_int_equal(get(sa, 4096, S1), q);
    assert_int_equal(get(sa, 4096, S1), p);
    finish(sa);
}

/* A block freed on S1 behind an unfinished fence is never given to S2; once
 * the fence is done it is. 4 MiB slabs hold four 1 MiB blocks. */
static void test_other_stream_waits_for_fence(void **state)
{
    (void)state;
    struct sh_suballoc_config c = {.max_block = M, .slab_bytes = 4 * M, .keep_empty = 1};
    struct sh_suballoc *sa = mk(&c);
    uintptr_t p[4];
    for (int i = 0; i < 4; i++)
        p[i] = get(sa, M, S1);
    assert_int_equal(fk.gets, 1);
    put(sa, p[0], S1, 5);
    uintptr_t q[4];
    for (int i = 0; i < 4; i++) {
        q[i] = get(sa, M, S2);
        assert_true(q[i] != p[0]);
    }
    assert_int_equal(fk.gets, 2);
    assert_int_equal(fk.drops[5], 0);
    fk.completed = 5;
    assert_int_equal(get(sa, M, S2), p[0]);
    assert_int_equal(fk.gets, 2);
    assert_int_equal(fk.drops[5], 1);
    assert_int_equal(stats(sa).same_stream_reuse, 0);
    finish(sa);
}

/* Pending lists are polled oldest first and stop at the first fence that is
 * not done (one stream's fences complete in order). */
static void test_fence_order(void **state)
{
    (void)state;
    struct sh_suballoc_config c = {.max_block = M, .slab_bytes = 4 * M, .keep_empty = 1};
    struct sh_suballoc *sa = mk(&c);
    uintptr_t p[4];
    for (int i = 0; i < 4; i++)
        p[i] = get(sa, M, S1);
    for (int i = 0; i < 4; i++)
        put(sa, p[i], S1, 10 + (uint64_t)i);
    fk.completed = 11;
    uintptr_t a = get(sa, M, S2), b = get(sa, M, S2);
    assert_true((a == p[0] && b == p[1]) || (a == p[1] && b == p[0]));
    assert_int_equal(fk.gets, 1);
    uintptr_t x = get(sa, M, S2); /* 12 and 13 not done */
    assert_true(x != p[2] && x != p[3]);
    assert_int_equal(fk.gets, 2);
    assert_int_equal(stats(sa).pending_bytes, 2 * M);
    finish(sa);
    assert_int_equal(fk.drops[12] + fk.drops[13], 2); /* destroy drops the rest */
}

static void test_fence_zero(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    uintptr_t p = get(sa, 2048, S1);
    put(sa, p, S1, 0);
    assert_int_equal(get(sa, 2048, S2), p);
    assert_int_equal(fk.total_drops, 0);
    assert_int_equal(stats(sa).pending_bytes, 0);
    finish(sa);
}

static void test_misuse(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    uintptr_t p = get(sa, 4096, S1), q = get(sa, 4096, S1);
    assert_int_equal(sh_suballoc_free(sa, p + 512, S1, 0), SH_EINVAL);  /* interior */
    assert_int_equal(sh_suballoc_free(sa, q + 4096, S1, 0), SH_EINVAL); /* never handed out */
    assert_int_equal(sh_suballoc_free(sa, SBASE - 4096, S1, 0), SH_ENOTFOUND);
    assert_int_equal(sh_suballoc_free(sa, 0x1234, S1, 0), SH_ENOTFOUND);
    put(sa, p, S1, 0);
    assert_int_equal(sh_suballoc_free(sa, p, S1, 0), SH_EINVAL); /* double free */
    put(sa, q, S1, 3);
    assert_int_equal(sh_suballoc_free(sa, q, S2, 4), SH_EINVAL); /* double, while pending */
    size_t bs;
    assert_int_equal(sh_suballoc_block_size(sa, q, &bs), SH_EINVAL);
    assert_int_equal(sh_suballoc_block_size(sa, 0x1234, &bs), SH_ENOTFOUND);
    struct sh_suballoc_stats st = stats(sa);
    assert_int_equal(st.frees, 2);
    assert_int_equal(st.used_bytes, 0);
    assert_int_equal(fk.drops[4], 0);
    finish(sa);
    assert_int_equal(fk.drops[3], 1);
}

static void test_slab_return(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL); /* keep one empty slab per class */
    uintptr_t p[6];
    for (int i = 0; i < 6; i++)
        p[i] = get(sa, M, S1);
    assert_int_equal(fk.gets, 3);
    for (int i = 0; i < 6; i++)
        put(sa, p[i], S1, 0);
    assert_int_equal(fk.puts, 2);
    struct sh_suballoc_stats st = stats(sa);
    assert_int_equal(st.slabs, 1);
    assert_int_equal(st.slab_bytes, 2 * M);
    assert_int_equal(st.slab_puts, 2);
    /* The kept slab serves the next two without a slab_get. */
    uintptr_t a = get(sa, M, S1), b = get(sa, M, S1);
    assert_int_equal(fk.gets, 3);
    put(sa, a, S1, 0);
    put(sa, b, S1, 0);
    assert_int_equal(sh_suballoc_trim(sa), 2 * M);
    assert_int_equal(fk.nlive, 0);
    assert_false(sh_suballoc_owns(sa, a));
    assert_int_equal(sh_suballoc_free(sa, a, S1, 0), SH_ENOTFOUND);
    finish(sa);
}

/* A slab whose blocks wait on fences is not empty. */
static void test_pending_keeps_slab(void **state)
{
    (void)state;
    struct sh_suballoc_config c = {.keep_empty = 0};
    struct sh_suballoc *sa = mk(&c);
    uintptr_t a = get(sa, M, S1), b = get(sa, M, S1);
    put(sa, a, S1, 9);
    put(sa, b, S2, 9);
    assert_int_equal(sh_suballoc_trim(sa), 0);
    assert_int_equal(fk.puts, 0);
    assert_true(sh_suballoc_owns(sa, a));
    fk.completed = 9;
    assert_int_equal(sh_suballoc_trim(sa), 2 * M);
    assert_int_equal(fk.puts, 1);
    assert_int_equal(fk.drops[9], 2);
    assert_int_equal(stats(sa).pending_bytes, 0);
    finish(sa);
}

static void test_owns(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    assert_false(sh_suballoc_owns(sa, SBASE));
    uintptr_t p = get(sa, 512, S1);
    assert_true(sh_suballoc_owns(sa, p));
    assert_true(sh_suballoc_owns(sa, SBASE + 2 * M - 1));
    assert_false(sh_suballoc_owns(sa, SBASE + 2 * M));
    assert_false(sh_suballoc_owns(sa, SBASE - 1));
    finish(sa);
}

static void test_slab_get_failure(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    fk.fail = 1;
    uintptr_t p;
    assert_int_equal(sh_suballoc_alloc(sa, 4096, S1, &p), SH_ENOMEM);
    assert_int_equal(stats(sa).slabs, 0);
    fk.fail = 0;
    get(sa, 4096, S1);
    finish(sa);
}

/* Many streams with frees in flight: each finds its own block again. */
static void test_many_streams(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    uintptr_t p[100];
    for (int i = 0; i < 100; i++)
        p[i] = get(sa, 8192, 1);
    for (int i = 0; i < 100; i++)
        put(sa, p[i], 1000 + (uint64_t)i, 100 + (uint64_t)i);
    for (int i = 99; i >= 0; i--)
        assert_int_equal(get(sa, 8192, 1000 + (uint64_t)i), p[i]);
    assert_int_equal(stats(sa).same_stream_reuse, 100);
    assert_int_equal(fk.total_drops, 100);
    finish(sa);
}

static void test_destroy_drops_fences(void **state)
{
    (void)state;
    struct sh_suballoc *sa = mk(NULL);
    for (int i = 0; i < 5; i++)
        put(sa, get(sa, 1024, S1), S2, 20 + (uint64_t)i);
    get(sa, 64 * K, S1); /* still in use at destroy */
    sh_suballoc_destroy(sa);
    for (int i = 0; i < 5; i++)
        assert_int_equal(fk.drops[20 + i], 1);
    assert_int_equal(fk.nlive, 0);
    assert_int_equal(fk.bad, 0);
}

/* ---- threads ------------------------------------------------------------------ */

#define THREADS 8
#define OPS     20000
#define GRAINS  (1 << 19) /* 512-byte grains of the fake address space */

struct grain {
    int owner;
    uint64_t stream, fence; /* of the last free */
};

static struct grain grains[GRAINS];
static struct sh_suballoc *shared;
static uint64_t fence_seq, nonzero_frees;
static int violations;

static void bad(void)
{
    __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
}

/* The "GPU" gets halfway to the last fence issued; done stays done. */
static void gpu_progress(void)
{
    uint64_t cur = __atomic_load_n(&fk.completed, __ATOMIC_SEQ_CST);
    uint64_t want = cur / 2 + __atomic_load_n(&fence_seq, __ATOMIC_SEQ_CST) / 2;
    while (cur < want && !__atomic_compare_exchange_n(&fk.completed, &cur, want, 0,
                                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
}

static struct grain *grain(uintptr_t p)
{
    size_t i = (p - SBASE) / 512;
    return i < GRAINS ? &grains[i] : NULL;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t stream = 0x100 + (uint64_t)id;
    uint64_t r = 4242 + (uint64_t)id;
    uintptr_t live[16];
    int n = 0;
    for (int i = 0; i < OPS; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        if (n < 16 && (n == 0 || (r >> 33) % 2)) {
            size_t size = (size_t)512 << ((r >> 40) % 8);
            uintptr_t p;
            struct grain *g;
            if (sh_suballoc_alloc(shared, size, stream, &p) != 0 || !(g = grain(p))) {
                bad();
                continue;
            }
            int expect = 0;
            if (!__atomic_compare_exchange_n(&g->owner, &expect, id, 0, __ATOMIC_SEQ_CST,
                                             __ATOMIC_SEQ_CST))
                bad(); /* handed out twice */
            if (g->stream != stream && g->fence &&
                g->fence > __atomic_load_n(&fk.completed, __ATOMIC_SEQ_CST))
                bad(); /* crossed streams before the fence */
            live[n++] = p;
        } else {
            int k = (int)((r >> 20) % (uint64_t)n);
            struct grain *g = grain(live[k]);
            uint64_t fence =
                (r >> 50) % 5 ? __atomic_add_fetch(&fence_seq, 1, __ATOMIC_SEQ_CST) : 0;
            g->stream = stream;
            g->fence = fence;
            __atomic_store_n(&g->owner, 0, __ATOMIC_SEQ_CST);
            if (sh_suballoc_free(shared, live[k], stream, fence) != 0)
                bad();
            if (fence)
                __atomic_add_fetch(&nonzero_frees, 1, __ATOMIC_SEQ_CST);
            live[k] = live[--n];
        }
        if (i % 64 == 0)
            gpu_progress();
        if (i % 4096 == 0)
            sh_suballoc_trim(shared);
    }
    while (n--) {
        struct grain *g = grain(live[n]);
        g->stream = stream;
        g->fence = 0;
        __atomic_store_n(&g->owner, 0, __ATOMIC_SEQ_CST);
        sh_suballoc_free(shared, live[n], stream, 0);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    shared = mk(NULL);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)(i + 1)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(violations, 0);
    struct sh_suballoc_stats st = stats(shared);
    assert_int_equal(st.used_bytes, 0);
    assert_true(st.same_stream_reuse > 0);
    fk.completed = UINT64_MAX;
    sh_suballoc_trim(shared);
    st = stats(shared);
    assert_int_equal(st.slabs, 0);
    assert_int_equal(st.pending_bytes, 0);
    assert_int_equal(fk.total_drops, nonzero_frees);
    finish(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_create_args, setup),
        cmocka_unit_test_setup(test_classes, setup),
        cmocka_unit_test_setup(test_big_class_slab, setup),
        cmocka_unit_test_setup(test_same_stream_reuse, setup),
        cmocka_unit_test_setup(test_other_stream_waits_for_fence, setup),
        cmocka_unit_test_setup(test_fence_order, setup),
        cmocka_unit_test_setup(test_fence_zero, setup),
        cmocka_unit_test_setup(test_misuse, setup),
        cmocka_unit_test_setup(test_slab_return, setup),
        cmocka_unit_test_setup(test_pending_keeps_slab, setup),
        cmocka_unit_test_setup(test_owns, setup),
        cmocka_unit_test_setup(test_slab_get_failure, setup),
        cmocka_unit_test_setup(test_many_streams, setup),
        cmocka_unit_test_setup(test_destroy_drops_fences, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
