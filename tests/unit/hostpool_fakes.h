/* hostpool_fakes.h — the host slab pool's tests' fake VMM, which counts
 * every call, hands out handles and staging addresses from counters, can be
 * made slow or made to fail, and checks that its books balance at the end;
 * and the helpers the tests share. Shared by test_hostpool.c and
 * test_hostpool_share.c; include it once, after cmocka and the system
 * headers it needs. */
#ifndef SH_TESTS_HOSTPOOL_FAKES_H
#define SH_TESTS_HOSTPOOL_FAKES_H

#include "pool/pool.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define K    ((size_t)1 << 10)
#define M    ((size_t)1 << 20)
#define G    (64 * K) /* granularity */
#define MAXH 4096
#define VA0  ((uintptr_t)1 << 40)

/* ---- fake VMM ---------------------------------------------------------------- */

struct fake {
    pthread_mutex_t mu;
    uint64_t next_handle;
    uintptr_t next_va;
    size_t hsize[MAXH]; /* by handle; 0: not live */
    int hmapped[MAXH];  /* mappings of the handle */
    uintptr_t map_va[MAXH];
    uint64_t map_h[MAXH];
    int nmaps;
    int creates, releases, reserves, unreserves, maps, unmaps, bad;
    int host_maps; /* maps through map_host (the CPU may touch them), also counted in maps */
    int live_handles, live_reserves, live_maps;
    size_t host_bytes, host_peak;
    int fail_create_after; /* creates that succeed before all fail; -1: never */
    int fail_map;          /* every map fails */
    unsigned create_us;    /* pinning time */
};

static struct fake fk;

static int f_create(void *ctx, size_t size, int loc, uint64_t *handle)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    unsigned us = f->create_us;
    pthread_mutex_unlock(&f->mu);
    if (us)
        usleep(us);
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->creates++;
    if (loc != SH_LOC_HOST || size == 0 || size % G)
        f->bad++;
    if (f->fail_create_after == 0 || f->next_handle + 1 >= MAXH) {
        err = SH_ENOMEM;
    } else {
        if (f->fail_create_after > 0)
            f->fail_create_after--;
        *handle = ++f->next_handle;
        f->hsize[*handle] = size;
        f->live_handles++;
        f->host_bytes += size;
        if (f->host_bytes > f->host_peak)
            f->host_peak = f->host_bytes;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int f_release(void *ctx, uint64_t handle)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->releases++;
    if (handle == 0 || handle >= MAXH || !f->hsize[handle] || f->hmapped[handle]) {
        f->bad++;
    } else {
        f->host_bytes -= f->hsize[handle];
        f->hsize[handle] = 0;
        f->live_handles--;
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int f_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->reserves++;
    if (align != G || size % G)
        f->bad++;
    *va = f->next_va;
    f->next_va += size + G; /* a gap: neighbours never touch */
    f->live_reserves++;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int f_unreserve(void *ctx, uintptr_t va, size_t size)
{
    struct fake *f = ctx;
    (void)size;
    pthread_mutex_lock(&f->mu);
    f->unreserves++;
    if (va < VA0 || va >= f->next_va)
        f->bad++;
    f->live_reserves--;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int f_map(void *ctx, uintptr_t va, size_t size, uint64_t handle)
{
    struct fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->maps++;
    if (va < VA0 || handle == 0 || handle >= MAXH || f->hsize[handle] != size)
        f->bad++;
    if (f->fail_map) {
        err = SH_EDRIVER;
    } else {
        f->hmapped[handle]++;
        f->live_maps++;
        f->map_va[f->nmaps] = va;
        f->map_h[f->nmaps++] = handle;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int f_unmap(void *ctx, uintptr_t va, size_t size)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->unmaps++;
    int i = 0;
    while (i < f->nmaps && f->map_va[i] != va)
        i++;
    if (i == f->nmaps || f->hsize[f->map_h[i]] != size) {
        f->bad++;
    } else {
        f->hmapped[f->map_h[i]]--;
        f->live_maps--;
        f->nmaps--;
        f->map_va[i] = f->map_va[f->nmaps];
        f->map_h[i] = f->map_h[f->nmaps];
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

/* A staging mapping the CPU may read too: counted apart, otherwise a map. */
static int f_map_host(void *ctx, uintptr_t va, size_t size, uint64_t handle)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->host_maps++;
    pthread_mutex_unlock(&f->mu);
    return f_map(ctx, va, size, handle);
}

static struct sh_vmm_ops ops = {&fk,       f_reserve, f_unreserve, f_create,
                                f_release, f_map,     f_unmap,     f_map_host};

static inline int setup(void **state)
{
    (void)state;
    pthread_mutex_destroy(&fk.mu);
    memset(&fk, 0, sizeof fk);
    pthread_mutex_init(&fk.mu, NULL);
    fk.next_va = VA0;
    fk.fail_create_after = -1;
    return 0;
}

/* Every handle released (after its staging mapping is gone), every
 * reservation and mapping undone, no call on something unknown. */
static inline void books_balance(void)
{
    pthread_mutex_lock(&fk.mu);
    int bad = fk.bad, handles = fk.live_handles, reserves = fk.live_reserves, maps = fk.live_maps;
    size_t host = fk.host_bytes;
    int r = fk.reserves, ur = fk.unreserves, m = fk.maps - (fk.fail_map ? fk.maps : 0),
        um = fk.unmaps;
    pthread_mutex_unlock(&fk.mu);
    assert_int_equal(bad, 0);
    assert_int_equal(handles, 0);
    assert_int_equal(reserves, 0);
    assert_int_equal(maps, 0);
    assert_int_equal(host, 0);
    assert_int_equal(r, ur);
    assert_int_equal(um, m);
}

static inline int fake_get(const int *field)
{
    pthread_mutex_lock(&fk.mu);
    int v = *field;
    pthread_mutex_unlock(&fk.mu);
    return v;
}

/* ---- helpers ------------------------------------------------------------------- */

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline struct sh_hostpool_stats hstats(struct sh_hostpool *hp)
{
    struct sh_hostpool_stats st;
    sh_hostpool_stats(hp, &st);
    return st;
}

/* Three classes, 64K, 256K, 1M, with the given targets. */
static inline struct sh_hostpool_params params3(unsigned n0, unsigned n1, unsigned n2,
                                                size_t budget, size_t prepin, int grow)
{
    struct sh_hostpool_params p = {.granularity = G,
                                   .class_bytes = {G, 4 * G, M},
                                   .slabs = {n0, n1, n2},
                                   .nclasses = 3,
                                   .ram_budget = budget,
                                   .prepin = prepin,
                                   .grow_in_background = grow};
    return p;
}

/* The pool under test, torn down by teardown() if a test fails midway, so
 * that its grower does not outlive the test. */
static struct sh_hostpool *cur;

static inline struct sh_hostpool *mk_ops(const struct sh_hostpool_params *p,
                                         const struct sh_vmm_ops *o)
{
    struct sh_hostpool *hp = NULL;
    assert_int_equal(sh_hostpool_create(p, o, &hp), 0);
    assert_non_null(hp);
    cur = hp;
    return hp;
}

static inline struct sh_hostpool *mk(const struct sh_hostpool_params *p)
{
    return mk_ops(p, &ops);
}

static inline void destroy(struct sh_hostpool *hp)
{
    if (cur == hp)
        cur = NULL;
    sh_hostpool_destroy(hp);
}

static inline int teardown(void **state)
{
    (void)state;
    if (cur)
        sh_hostpool_destroy(cur);
    cur = NULL;
    return 0;
}

static inline struct sh_slab *get(struct sh_hostpool *hp, size_t bytes, unsigned wait_ms)
{
    struct sh_slab *s = NULL;
    assert_int_equal(sh_hostpool_get(hp, bytes, wait_ms, &s), 0);
    assert_non_null(s);
    assert_int_equal(s->size, bytes); /* only whole handles map: never a larger slab */
    assert_true(s->handle > 0 && s->handle < MAXH);
    assert_int_equal(fk.hsize[s->handle], s->size);
    return s;
}

/* Polls until the grower has added `grown` slabs and then stays put. */
static inline struct sh_hostpool_stats settle(struct sh_hostpool *hp, uint64_t grown)
{
    double t0 = now_ms();
    while (hstats(hp).grown < grown && now_ms() - t0 < 5000)
        usleep(1000);
    /* Anything more would show up by now. */
    pthread_mutex_lock(&fk.mu);
    unsigned quiet = 30000 + 3 * fk.create_us;
    pthread_mutex_unlock(&fk.mu);
    usleep(quiet);
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.grown, grown);
    return st;
}

#endif
