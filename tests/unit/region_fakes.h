/* region_fakes.h — the fakes and helpers the region registry tests share
 * (test_region*.c): a fake VMM and fake fences, a pool over them, and the
 * checks that the pool gave everything back. Include it once, after cmocka.h.
 *
 * The fake VMM hands out aligned host addresses and handles from counters,
 * counts every call of each kind, can refuse `create` past a device size (a
 * full device) or fail one `map`, and checks each call against the driver's
 * contracts: a map lies inside a live reservation, overlaps no other mapping
 * and uses a live, unmapped handle of exactly its size; an unmap removes
 * exactly one mapping; only unmapped handles are released; a reservation is
 * freed exactly, with nothing mapped in it. Fences are completed by hand;
 * `wait` completes them; drops are counted per fence.
 *
 * The fakes are process-wide (vf, ff, seq); setup() clears them before each
 * test. Their callbacks and most helpers take the fakes' own mutexes, so the
 * pool may call them from any thread.
 */
#ifndef SH_TESTS_REGION_FAKES_H
#define SH_TESTS_REGION_FAKES_H

#include "pool/pool.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define K  ((size_t)1 << 10)
#define M  ((size_t)1 << 20)
#define GB ((size_t)1 << 30)
#define G  (2 * M) /* granularity */

#define VBASE  ((uintptr_t)1 << 44)
#define MAXH   65536 /* handles ever created */
#define MAXMAP 8192  /* live mappings */
#define MAXRES 4096  /* live reservations */
#define MAXF   65536 /* fences ever issued */
#define MAXLOG 4096  /* unmap events remembered */

/* ---- fake VMM ----------------------------------------------------------- */

struct calls {
    long reserve, unreserve, create, release, map, unmap;
};

struct mapping {
    uintptr_t va;
    size_t size;
    uint64_t handle;
};

struct resv {
    uintptr_t va;
    size_t size;
};

struct vmm_fake {
    pthread_mutex_t mu;
    struct calls n;
    long create_fails, map_fails;
    uintptr_t next_va;
    uint64_t next_handle;
    size_t hsize[MAXH]; /* by handle; 0: not live */
    int hmapped[MAXH];  /* live mappings of the handle */
    long live_handles;
    size_t device_bytes, device_limit; /* limit 0: none */
    struct mapping maps[MAXMAP];
    size_t nmaps;
    struct resv res[MAXRES];
    size_t nres;
    long fail_map_at; /* the map call with this number fails; 0: none */
    long fail_unmaps; /* so many of the next unmap calls fail */
    long bad;         /* contract violations */
    struct {
        uintptr_t va;
        long seq;
    } unmaps[MAXLOG];
    size_t nunmaps;
};

struct fence_fake {
    pthread_mutex_t mu;
    uint64_t next;
    unsigned char done[MAXF];
    unsigned char drops[MAXF];
    long wait_seq[MAXF]; /* 0: never waited */
    long waits, drop_calls, bad;
};

static struct vmm_fake vf;
static struct fence_fake ff;
static long seq; /* orders waits against unmaps */

static inline long next_seq(void)
{
    return __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
}

static inline int overlaps(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
{
    return a < b + blen && b < a + alen;
}

static int v_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    struct vmm_fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->n.reserve++;
    if (align == 0)
        align = G;
    if (size == 0 || size % G || (align & (align - 1)) || f->nres == MAXRES) {
        f->bad++;
        err = SH_EINVAL;
    } else {
        uintptr_t a = (f->next_va + align - 1) & ~(uintptr_t)(align - 1);
        f->next_va = a + size + G; /* a gap: reservations never touch */
        f->res[f->nres++] = (struct resv){a, size};
        *va = a;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int v_unreserve(void *ctx, uintptr_t va, size_t size)
{
    struct vmm_fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->n.unreserve++;
    size_t i = 0;
    while (i < f->nres && f->res[i].va != va)
        i++;
    if (i == f->nres || f->res[i].size != size) {
        f->bad++;
    } else {
        for (size_t j = 0; j < f->nmaps; j++)
            if (overlaps(f->maps[j].va, f->maps[j].size, va, size))
                f->bad++; /* still mapped inside */
        f->res[i] = f->res[--f->nres];
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int v_create(void *ctx, size_t size, int loc, uint64_t *handle)
{
    struct vmm_fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->n.create++;
    if (loc != SH_LOC_DEVICE || size == 0 || size % G || (size & (size - 1)))
        f->bad++;
    if ((f->device_limit && f->device_bytes + size > f->device_limit) ||
        f->next_handle + 1 >= MAXH) {
        f->create_fails++;
        err = SH_ENOMEM;
    } else {
        *handle = ++f->next_handle;
        f->hsize[*handle] = size;
        f->device_bytes += size;
        f->live_handles++;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int v_release(void *ctx, uint64_t handle)
{
    struct vmm_fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->n.release++;
    if (handle == 0 || handle >= MAXH || !f->hsize[handle] || f->hmapped[handle]) {
        f->bad++;
    } else {
        f->device_bytes -= f->hsize[handle];
        f->hsize[handle] = 0;
        f->live_handles--;
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int v_map(void *ctx, uintptr_t va, size_t size, uint64_t handle)
{
    struct vmm_fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->n.map++;
    int inside = 0;
    for (size_t i = 0; i < f->nres; i++)
        if (va >= f->res[i].va && va + size <= f->res[i].va + f->res[i].size)
            inside = 1;
    int clash = 0;
    for (size_t i = 0; i < f->nmaps; i++)
        if (overlaps(f->maps[i].va, f->maps[i].size, va, size))
            clash = 1;
    if (f->fail_map_at && f->n.map == f->fail_map_at) {
        f->map_fails++;
        err = SH_EDRIVER;
    } else if (!inside || clash || handle == 0 || handle >= MAXH || f->hsize[handle] != size ||
               f->hmapped[handle] || va % G || f->nmaps == MAXMAP) {
        f->bad++;
        err = SH_EINVAL;
    } else {
        f->maps[f->nmaps++] = (struct mapping){va, size, handle};
        f->hmapped[handle]++;
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static int v_unmap(void *ctx, uintptr_t va, size_t size)
{
    struct vmm_fake *f = ctx;
    int err = 0;
    pthread_mutex_lock(&f->mu);
    f->n.unmap++;
    if (f->fail_unmaps > 0) {
        f->fail_unmaps--;
        pthread_mutex_unlock(&f->mu);
        return SH_EDRIVER;
    }
    size_t i = 0;
    while (i < f->nmaps && f->maps[i].va != va)
        i++;
    if (i == f->nmaps || f->maps[i].size != size) {
        f->bad++; /* only whole mappings can be unmapped */
        err = SH_EINVAL;
    } else {
        f->hmapped[f->maps[i].handle]--;
        f->maps[i] = f->maps[--f->nmaps];
        if (f->nunmaps < MAXLOG) {
            f->unmaps[f->nunmaps].va = va;
            f->unmaps[f->nunmaps++].seq = next_seq();
        }
    }
    pthread_mutex_unlock(&f->mu);
    return err;
}

static const struct sh_vmm_ops vmm = {
    .ctx = &vf,
    .reserve = v_reserve,
    .unreserve = v_unreserve,
    .create = v_create,
    .release = v_release,
    .map = v_map,
    .unmap = v_unmap,
};

static inline struct calls calls_now(void)
{
    pthread_mutex_lock(&vf.mu);
    struct calls c = vf.n;
    pthread_mutex_unlock(&vf.mu);
    return c;
}

/* 1 if every byte of [va, va+size) is mapped. */
static inline int covered(uintptr_t va, size_t size)
{
    int ok = 1;
    pthread_mutex_lock(&vf.mu);
    for (uintptr_t pos = va; ok && pos < va + size;) {
        size_t i = 0;
        while (i < vf.nmaps && !(pos >= vf.maps[i].va && pos < vf.maps[i].va + vf.maps[i].size))
            i++;
        if (i == vf.nmaps)
            ok = 0;
        else
            pos = vf.maps[i].va + vf.maps[i].size;
    }
    pthread_mutex_unlock(&vf.mu);
    return ok;
}

/* 1 if any byte of [va, va+size) is mapped. */
static inline int any_mapped(uintptr_t va, size_t size)
{
    int hit = 0;
    pthread_mutex_lock(&vf.mu);
    for (size_t i = 0; i < vf.nmaps; i++)
        if (overlaps(vf.maps[i].va, vf.maps[i].size, va, size))
            hit = 1;
    pthread_mutex_unlock(&vf.mu);
    return hit;
}

/* Size of the mapping starting exactly at va, 0 if none. */
static inline size_t mapping_at(uintptr_t va)
{
    size_t size = 0;
    pthread_mutex_lock(&vf.mu);
    for (size_t i = 0; i < vf.nmaps; i++)
        if (vf.maps[i].va == va)
            size = vf.maps[i].size;
    pthread_mutex_unlock(&vf.mu);
    return size;
}

static inline long unmap_seq(uintptr_t va)
{
    for (size_t i = 0; i < vf.nunmaps; i++)
        if (vf.unmaps[i].va == va)
            return vf.unmaps[i].seq;
    return 0;
}

/* ---- fake fences -------------------------------------------------------- */

static int f_done(void *ctx, uint64_t fence)
{
    struct fence_fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    int d = fence < MAXF && f->done[fence];
    if (fence == 0 || fence > f->next || f->drops[fence])
        f->bad++; /* unknown, or asked about after the drop */
    pthread_mutex_unlock(&f->mu);
    return d;
}

static void f_wait(void *ctx, uint64_t fence)
{
    struct fence_fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->waits++;
    if (fence == 0 || fence > f->next || f->drops[fence]) {
        f->bad++;
    } else {
        f->done[fence] = 1;
        if (!f->wait_seq[fence])
            f->wait_seq[fence] = next_seq();
    }
    pthread_mutex_unlock(&f->mu);
}

static void f_drop(void *ctx, uint64_t fence)
{
    struct fence_fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->drop_calls++;
    if (fence == 0 || fence > f->next || f->drops[fence])
        f->bad++; /* dropped twice */
    else
        f->drops[fence] = 1;
    pthread_mutex_unlock(&f->mu);
}

static const struct sh_fence_ops fences = {
    .ctx = &ff, .done = f_done, .wait = f_wait, .drop = f_drop};

static inline uint64_t fence_new(void)
{
    pthread_mutex_lock(&ff.mu);
    uint64_t f = ++ff.next;
    pthread_mutex_unlock(&ff.mu);
    assert_true(f < MAXF);
    return f;
}

static inline void fence_complete(uint64_t f)
{
    pthread_mutex_lock(&ff.mu);
    ff.done[f] = 1;
    pthread_mutex_unlock(&ff.mu);
}

static inline int fence_dropped(uint64_t f)
{
    pthread_mutex_lock(&ff.mu);
    int d = ff.drops[f];
    pthread_mutex_unlock(&ff.mu);
    return d;
}

static inline long fence_waited(uint64_t f)
{
    pthread_mutex_lock(&ff.mu);
    long s = ff.wait_seq[f];
    pthread_mutex_unlock(&ff.mu);
    return s;
}

/* ---- helpers ------------------------------------------------------------ */

static inline int setup(void **state)
{
    (void)state;
    pthread_mutex_destroy(&vf.mu);
    pthread_mutex_destroy(&ff.mu);
    memset(&vf, 0, sizeof vf);
    memset(&ff, 0, sizeof ff);
    pthread_mutex_init(&vf.mu, NULL);
    pthread_mutex_init(&ff.mu, NULL);
    vf.next_va = VBASE;
    seq = 0;
    return 0;
}

static inline struct sh_pool_params defaults(void)
{
    return (struct sh_pool_params){
        .granularity = G,
        .max_chunk = 64 * M,
        .va_block = GB,
        .va_cache = 4 * GB,
        .device_cache = GB,
        .suballoc_max = M,
    };
}

static inline struct sh_pool *mkpool(const struct sh_pool_params *p)
{
    struct sh_pool *pool = NULL;
    assert_int_equal(sh_pool_create(p, &vmm, &fences, &pool), 0);
    assert_non_null(pool);
    return pool;
}

static inline uintptr_t xalloc(struct sh_pool *pool, size_t size, int path, uint64_t stream)
{
    uintptr_t va = 0;
    assert_int_equal(sh_pool_alloc(pool, size, path, stream, &va), 0);
    assert_true(va != 0);
    assert_true(covered(va, size));
    return va;
}

static inline void xfree(struct sh_pool *pool, uintptr_t va, uint64_t stream, uint64_t fence)
{
    assert_int_equal(sh_pool_free(pool, va, stream, fence), 0);
}

static inline struct sh_region_info info(struct sh_pool *pool, uintptr_t addr)
{
    struct sh_region_info ri;
    memset(&ri, 0xa5, sizeof ri);
    assert_int_equal(sh_pool_lookup(pool, addr, &ri), 0);
    return ri;
}

static inline struct sh_pool_stats pstats(struct sh_pool *pool)
{
    struct sh_pool_stats st;
    memset(&st, 0xa5, sizeof st);
    sh_pool_stats(pool, &st);
    return st;
}

static inline void assert_calls_equal(struct calls a, struct calls b)
{
    assert_int_equal(a.reserve, b.reserve);
    assert_int_equal(a.unreserve, b.unreserve);
    assert_int_equal(a.create, b.create);
    assert_int_equal(a.release, b.release);
    assert_int_equal(a.map, b.map);
    assert_int_equal(a.unmap, b.unmap);
}

/* Everything the pool took from the fakes came back, and nothing was misused. */
static inline void assert_books_balanced(void)
{
    assert_int_equal(vf.bad, 0);
    assert_int_equal(vf.nmaps, 0);
    assert_int_equal(vf.nres, 0);
    assert_int_equal(vf.live_handles, 0);
    assert_int_equal(vf.device_bytes, 0);
    assert_int_equal(vf.n.reserve, vf.n.unreserve);
    assert_int_equal(vf.n.create - vf.create_fails, vf.n.release);
    assert_int_equal(vf.n.map - vf.map_fails, vf.n.unmap);
    assert_int_equal(ff.bad, 0);
    for (uint64_t f = 1; f <= ff.next; f++)
        assert_int_equal(ff.drops[f], 1); /* every fence given was dropped once */
}

#endif
