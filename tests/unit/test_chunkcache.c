/* test_chunkcache.c — device chunk cache over a fake VMM that counts creates
 * and releases and catches a handle released twice. */
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

#define M        ((size_t)1 << 20)
#define G        (2 * M) /* granularity */
#define MAXH     (1 << 18)
#define NO_LIMIT ((size_t)1 << 50)

struct fake {
    pthread_mutex_t mu;
    uint64_t next;
    size_t size[MAXH]; /* by handle; 0: not live */
    size_t live_bytes, device_limit;
    int creates, releases, bad, fail_all, live;
};

static struct fake fk;

static int f_create(void *ctx, size_t size, int loc, uint64_t *handle)
{
    struct fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->creates++;
    if (loc != SH_LOC_DEVICE)
        f->bad++;
    if (f->fail_all || (f->device_limit && f->live_bytes + size > f->device_limit) ||
        f->next + 1 >= MAXH) {
        err = SH_ENOMEM;
    } else {
        *handle = ++f->next;
        f->size[*handle] = size;
        f->live_bytes += size;
        f->live++;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int f_release(void *ctx, uint64_t handle)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->releases++;
    if (handle >= MAXH || !f->size[handle]) {
        f->bad++;
    } else {
        f->live_bytes -= f->size[handle];
        f->size[handle] = 0;
        f->live--;
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static struct sh_vmm_ops ops = {.ctx = &fk, .create = f_create, .release = f_release};

static int setup(void **state)
{
    (void)state;
    pthread_mutex_destroy(&fk.mu);
    memset(&fk, 0, sizeof fk);
    pthread_mutex_init(&fk.mu, NULL);
    return 0;
}

static struct sh_chunkcache *mk(size_t limit)
{
    struct sh_chunkcache *cc = NULL;
    assert_int_equal(sh_chunkcache_create(&ops, G, limit, &cc), 0);
    return cc;
}

static struct sh_chunkcache_stats stats(struct sh_chunkcache *cc)
{
    struct sh_chunkcache_stats st;
    sh_chunkcache_stats(cc, &st);
    return st;
}

static uint64_t get(struct sh_chunkcache *cc, size_t size)
{
    uint64_t h = 0;
    assert_int_equal(sh_chunkcache_get(cc, size, &h), 0);
    assert_int_equal(fk.size[h], size);
    return h;
}

static void put(struct sh_chunkcache *cc, uint64_t h, size_t size)
{
    assert_int_equal(sh_chunkcache_put(cc, h, size), 0);
}

static void test_bad_sizes(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = NULL;
    assert_int_equal(sh_chunkcache_create(&ops, 0, 0, &cc), SH_EINVAL);
    assert_int_equal(sh_chunkcache_create(&ops, 3 * M, 0, &cc), SH_EINVAL);
    cc = mk(NO_LIMIT);
    static const size_t bad[] = {0, M, 3 * M, 6 * M, G + 1};
    uint64_t h;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(sh_chunkcache_get(cc, bad[i], &h), SH_EINVAL);
        assert_int_equal(sh_chunkcache_put(cc, 1, bad[i]), SH_EINVAL);
    }
    assert_int_equal(sh_chunkcache_get(cc, G, NULL), SH_EINVAL);
    assert_int_equal(fk.creates + fk.releases, 0);
    sh_chunkcache_destroy(cc);
}

static void test_miss_then_hit(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = mk(NO_LIMIT);
    uint64_t h = get(cc, G);
    struct sh_chunkcache_stats st = stats(cc);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.hits, 0);
    assert_int_equal(st.device_bytes, G);
    put(cc, h, G);
    st = stats(cc);
    assert_int_equal(st.cached_bytes, G);
    assert_int_equal(st.cached_handles, 1);
    assert_int_equal(st.device_bytes, G);
    assert_int_equal(get(cc, G), h);
    st = stats(cc);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.cached_bytes, 0);
    assert_int_equal(st.creates, 1);
    assert_int_equal(fk.creates, 1);
    /* Another size never takes it. */
    put(cc, h, G);
    uint64_t h4 = get(cc, 4 * M);
    assert_true(h4 != h);
    assert_int_equal(fk.creates, 2);
    assert_int_equal(stats(cc).misses, 2);
    assert_int_equal(stats(cc).device_bytes, G + 4 * M);
    put(cc, h4, 4 * M);
    sh_chunkcache_destroy(cc);
    assert_int_equal(fk.live, 0);
    assert_int_equal(fk.bad, 0);
}

static void test_limit(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = mk(2 * G);
    uint64_t h[3] = {get(cc, G), get(cc, G), get(cc, G)};
    for (int i = 0; i < 3; i++)
        put(cc, h[i], G);
    struct sh_chunkcache_stats st = stats(cc);
    assert_int_equal(st.cached_bytes, 2 * G);
    assert_int_equal(st.device_bytes, 2 * G);
    assert_int_equal(fk.releases, 1);
    assert_int_equal(fk.size[h[2]], 0); /* the one over the limit */
    assert_int_equal(fk.live, 2);
    sh_chunkcache_destroy(cc);
    assert_int_equal(fk.live, 0);

    cc = mk(0);
    uint64_t x = get(cc, 8 * M);
    put(cc, x, 8 * M);
    assert_int_equal(fk.live, 0);
    assert_int_equal(stats(cc).device_bytes, 0);
    sh_chunkcache_destroy(cc);
    assert_int_equal(fk.bad, 0);
}

static void test_trim(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = mk(NO_LIMIT);
    uint64_t a = get(cc, G), b = get(cc, G), c = get(cc, 8 * M), d = get(cc, 32 * M);
    put(cc, a, G);
    put(cc, b, G);
    put(cc, c, 8 * M);
    put(cc, d, 32 * M);
    assert_int_equal(stats(cc).cached_bytes, 44 * M);
    /* 10 MiB: 8 + 2 exactly, the 32 MiB chunk stays. */
    assert_int_equal(sh_chunkcache_trim(cc, 10 * M), 10 * M);
    assert_int_equal(fk.size[c], 0);
    assert_int_equal(fk.size[d], 32 * M);
    assert_int_equal(stats(cc).cached_bytes, 34 * M);
    assert_int_equal(stats(cc).device_bytes, 34 * M);
    /* 1 MiB: nothing that small; the smallest goes. */
    assert_int_equal(sh_chunkcache_trim(cc, M), G);
    assert_int_equal(fk.size[d], 32 * M);
    assert_int_equal(sh_chunkcache_trim(cc, SIZE_MAX), 32 * M);
    assert_int_equal(sh_chunkcache_trim(cc, SIZE_MAX), 0);
    assert_int_equal(sh_chunkcache_trim(cc, 0), 0);
    struct sh_chunkcache_stats st = stats(cc);
    assert_int_equal(st.cached_bytes, 0);
    assert_int_equal(st.cached_handles, 0);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.releases, 4);
    sh_chunkcache_destroy(cc);
    assert_int_equal(fk.bad, 0);
}

/* More than BATCH handles in one trim. */
static void test_trim_many(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = mk(NO_LIMIT);
    uint64_t h[100];
    for (int i = 0; i < 100; i++)
        h[i] = get(cc, G);
    for (int i = 0; i < 100; i++)
        put(cc, h[i], G);
    assert_int_equal(sh_chunkcache_trim(cc, 70 * G), 70 * G);
    assert_int_equal(fk.live, 30);
    assert_int_equal(sh_chunkcache_trim(cc, 1000 * G), 30 * G);
    assert_int_equal(fk.live, 0);
    sh_chunkcache_destroy(cc);
}

static void test_create_failure(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = mk(NO_LIMIT);
    fk.fail_all = 1;
    uint64_t h;
    assert_int_equal(sh_chunkcache_get(cc, G, &h), SH_ENOMEM);
    struct sh_chunkcache_stats st = stats(cc);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.misses, 1);
    fk.fail_all = 0;
    sh_chunkcache_destroy(cc);
}

/* Chunks cached at other sizes make room for a create that needs it. */
static void test_create_failure_trims(void **state)
{
    (void)state;
    fk.device_limit = 8 * M;
    struct sh_chunkcache *cc = mk(NO_LIMIT);
    uint64_t a = get(cc, 4 * M), b = get(cc, 4 * M);
    put(cc, a, 4 * M);
    put(cc, b, 4 * M);
    uint64_t c = get(cc, 8 * M);
    assert_int_equal(fk.size[c], 8 * M);
    struct sh_chunkcache_stats st = stats(cc);
    assert_int_equal(st.cached_bytes, 0);
    assert_int_equal(st.device_bytes, 8 * M);
    assert_int_equal(fk.releases, 2);
    assert_int_equal(fk.creates, 4); /* a, b, the refused one, c */
    /* Nothing left to trim: the error comes back. */
    uint64_t h;
    assert_int_equal(sh_chunkcache_get(cc, G, &h), SH_ENOMEM);
    assert_int_equal(stats(cc).device_bytes, 8 * M);
    put(cc, c, 8 * M);
    sh_chunkcache_destroy(cc);
    assert_int_equal(fk.live, 0);
}

static void test_destroy(void **state)
{
    (void)state;
    struct sh_chunkcache *cc = mk(NO_LIMIT);
    uint64_t a = get(cc, G), b = get(cc, 4 * M), c = get(cc, G);
    put(cc, a, G);
    put(cc, b, 4 * M);
    sh_chunkcache_destroy(cc);
    assert_int_equal(fk.live, 1); /* c is still the caller's */
    assert_int_equal(fk.size[c], G);
    assert_int_equal(fk.bad, 0);
    sh_chunkcache_destroy(NULL);
}

/* ---- threads: a handle is never out twice; the books balance ----------------- */

#define THREADS 8
#define OPS     20000

static struct sh_chunkcache *shared;
static int in_use[MAXH];
static int violations;
static uint64_t gets;

static void *worker(void *arg)
{
    uint64_t r = 99 + (uint64_t)(intptr_t)arg;
    uint64_t held[4];
    size_t sz[4];
    int n = 0;
    for (int i = 0; i < OPS; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        if (n < 4 && (n == 0 || (r >> 33) % 2)) {
            sz[n] = G << ((r >> 40) % 3);
            __atomic_add_fetch(&gets, 1, __ATOMIC_SEQ_CST);
            if (sh_chunkcache_get(shared, sz[n], &held[n]) != 0) {
                __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
                continue;
            }
            if (__atomic_exchange_n(&in_use[held[n]], 1, __ATOMIC_SEQ_CST) != 0)
                __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
            n++;
        } else {
            int k = (int)((r >> 20) % (uint64_t)n);
            __atomic_store_n(&in_use[held[k]], 0, __ATOMIC_SEQ_CST);
            sh_chunkcache_put(shared, held[k], sz[k]);
            held[k] = held[--n];
            sz[k] = sz[n];
        }
        if (i % 5000 == 0)
            sh_chunkcache_trim(shared, 4 * G);
    }
    while (n--) {
        __atomic_store_n(&in_use[held[n]], 0, __ATOMIC_SEQ_CST);
        sh_chunkcache_put(shared, held[n], sz[n]);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    shared = mk(16 * G);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(violations, 0);
    struct sh_chunkcache_stats st = stats(shared);
    assert_int_equal(st.hits + st.misses, gets);
    assert_int_equal(st.device_bytes, fk.live_bytes);
    assert_int_equal(st.cached_bytes, fk.live_bytes); /* all handles are back */
    assert_true(st.cached_bytes <= 16 * G);
    assert_int_equal(st.creates, (uint64_t)fk.creates);
    assert_int_equal(st.releases, (uint64_t)fk.releases);
    assert_true(st.hits > st.misses);
    sh_chunkcache_destroy(shared);
    assert_int_equal(fk.live, 0);
    assert_int_equal(fk.bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_bad_sizes, setup),
        cmocka_unit_test_setup(test_miss_then_hit, setup),
        cmocka_unit_test_setup(test_limit, setup),
        cmocka_unit_test_setup(test_trim, setup),
        cmocka_unit_test_setup(test_trim_many, setup),
        cmocka_unit_test_setup(test_create_failure, setup),
        cmocka_unit_test_setup(test_create_failure_trims, setup),
        cmocka_unit_test_setup(test_destroy, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
