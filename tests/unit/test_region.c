/* test_region.c — the region registry over a fake VMM and fake fences.
 *
 * The fake VMM hands out aligned host addresses and handles from counters,
 * counts every call of each kind, can refuse `create` past a device size (a
 * full device) or fail one `map`, and checks each call against the driver's
 * contracts: a map lies inside a live reservation, overlaps no other mapping
 * and uses a live, unmapped handle of exactly its size; an unmap removes
 * exactly one mapping; only unmapped handles are released; a reservation is
 * freed exactly, with nothing mapped in it. Fences are completed by hand;
 * `wait` completes them; drops are counted per fence.
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

static long next_seq(void)
{
    return __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
}

static int overlaps(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
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

static struct calls calls_now(void)
{
    pthread_mutex_lock(&vf.mu);
    struct calls c = vf.n;
    pthread_mutex_unlock(&vf.mu);
    return c;
}

/* 1 if every byte of [va, va+size) is mapped. */
static int covered(uintptr_t va, size_t size)
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
static int any_mapped(uintptr_t va, size_t size)
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
static size_t mapping_at(uintptr_t va)
{
    size_t size = 0;
    pthread_mutex_lock(&vf.mu);
    for (size_t i = 0; i < vf.nmaps; i++)
        if (vf.maps[i].va == va)
            size = vf.maps[i].size;
    pthread_mutex_unlock(&vf.mu);
    return size;
}

static long unmap_seq(uintptr_t va)
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

static uint64_t fence_new(void)
{
    pthread_mutex_lock(&ff.mu);
    uint64_t f = ++ff.next;
    pthread_mutex_unlock(&ff.mu);
    assert_true(f < MAXF);
    return f;
}

static void fence_complete(uint64_t f)
{
    pthread_mutex_lock(&ff.mu);
    ff.done[f] = 1;
    pthread_mutex_unlock(&ff.mu);
}

static int fence_dropped(uint64_t f)
{
    pthread_mutex_lock(&ff.mu);
    int d = ff.drops[f];
    pthread_mutex_unlock(&ff.mu);
    return d;
}

static long fence_waited(uint64_t f)
{
    pthread_mutex_lock(&ff.mu);
    long s = ff.wait_seq[f];
    pthread_mutex_unlock(&ff.mu);
    return s;
}

/* ---- helpers ------------------------------------------------------------ */

static int setup(void **state)
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

static struct sh_pool_params defaults(void)
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

static struct sh_pool *mkpool(const struct sh_pool_params *p)
{
    struct sh_pool *pool = NULL;
    assert_int_equal(sh_pool_create(p, &vmm, &fences, &pool), 0);
    assert_non_null(pool);
    return pool;
}

static uintptr_t xalloc(struct sh_pool *pool, size_t size, int path, uint64_t stream)
{
    uintptr_t va = 0;
    assert_int_equal(sh_pool_alloc(pool, size, path, stream, &va), 0);
    assert_true(va != 0);
    assert_true(covered(va, size));
    return va;
}

static void xfree(struct sh_pool *pool, uintptr_t va, uint64_t stream, uint64_t fence)
{
    assert_int_equal(sh_pool_free(pool, va, stream, fence), 0);
}

static struct sh_region_info info(struct sh_pool *pool, uintptr_t addr)
{
    struct sh_region_info ri;
    memset(&ri, 0xa5, sizeof ri);
    assert_int_equal(sh_pool_lookup(pool, addr, &ri), 0);
    return ri;
}

static struct sh_pool_stats pstats(struct sh_pool *pool)
{
    struct sh_pool_stats st;
    memset(&st, 0xa5, sizeof st);
    sh_pool_stats(pool, &st);
    return st;
}

static void assert_calls_equal(struct calls a, struct calls b)
{
    assert_int_equal(a.reserve, b.reserve);
    assert_int_equal(a.unreserve, b.unreserve);
    assert_int_equal(a.create, b.create);
    assert_int_equal(a.release, b.release);
    assert_int_equal(a.map, b.map);
    assert_int_equal(a.unmap, b.unmap);
}

/* Everything the pool took from the fakes came back, and nothing was misused. */
static void assert_books_balanced(void)
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

/* ---- threads ------------------------------------------------------------ */

#define NTHREADS 8
#define ITERS    3000
#define SLOTS    12

struct live {
    uintptr_t va;
    size_t size;
};

static struct sh_pool *mt_pool;
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct live live_set[NTHREADS * SLOTS];
static int mt_stop;
static int mt_errors;
static int mt_first_line;
static long mt_small[NTHREADS];

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (__atomic_fetch_add(&mt_errors, 1, __ATOMIC_RELAXED) == 0)                          \
                __atomic_store_n(&mt_first_line, __LINE__, __ATOMIC_RELAXED);                      \
        }                                                                                          \
    } while (0)

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Records [va, va+size) as live; 0 if it overlaps one already live. */
static int live_add(int slot, uintptr_t va, size_t size)
{
    int ok = 1;
    pthread_mutex_lock(&live_mu);
    for (int i = 0; i < NTHREADS * SLOTS; i++)
        if (live_set[i].size && overlaps(live_set[i].va, live_set[i].size, va, size))
            ok = 0;
    live_set[slot] = (struct live){va, size};
    pthread_mutex_unlock(&live_mu);
    return ok;
}

static void live_del(int slot)
{
    pthread_mutex_lock(&live_mu);
    live_set[slot].size = 0;
    pthread_mutex_unlock(&live_mu);
}

static void *mt_worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t stream = (uint64_t)t + 1, s = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1);
    static const size_t sizes[] = {512, 3000, 64 * K, M, M + 1, 2 * M, 6 * M + 3, 16 * M, 40 * M};
    static const int paths[] = {SH_PATH_ASYNC, SH_PATH_PLUGGABLE, SH_PATH_MALLOC};
    struct {
        uintptr_t va;
        size_t size;
        int small;
    } slot[SLOTS] = {{0, 0, 0}};
    uint64_t pending[64];
    int npending = 0;
    for (int it = 0; it < ITERS; it++) {
        int k = (int)(rnd(&s) % SLOTS), id = t * SLOTS + k;
        if (slot[k].size) {
            live_del(id);
            uint64_t fence = 0;
            if (rnd(&s) % 2 && npending < 64)
                pending[npending++] = fence = fence_new();
            CHECK(sh_pool_free(mt_pool, slot[k].va, stream, fence) == 0);
            slot[k].size = 0;
        } else {
            size_t size = sizes[rnd(&s) % (sizeof sizes / sizeof sizes[0])];
            int path = paths[rnd(&s) % 3];
            uintptr_t va = 0;
            int rc = sh_pool_alloc(mt_pool, size, path, stream, &va);
            CHECK(rc == 0);
            if (rc)
                continue;
            CHECK(live_add(id, va, size));
            CHECK(covered(va, size));
            int small = path != SH_PATH_MALLOC && size <= M;
            struct sh_region_info ri;
            CHECK(sh_pool_lookup(mt_pool, va + size - 1, &ri) == 0);
            CHECK(ri.state == SH_RS_RESIDENT);
            CHECK(va >= ri.va && va + size <= ri.va + ri.mapped);
            if (small) {
                CHECK(ri.path == SH_PATH_SLAB);
                mt_small[t]++;
            } else {
                CHECK(ri.va == va && ri.size == size && ri.path == path);
                CHECK(ri.mapped == (size + G - 1) / G * G);
            }
            slot[k].va = va;
            slot[k].size = size;
            slot[k].small = small;
        }
        /* The oldest fences of this stream complete as time goes by. */
        while (npending && rnd(&s) % 3 == 0) {
            fence_complete(pending[0]);
            memmove(pending, pending + 1, (size_t)--npending * sizeof pending[0]);
        }
    }
    for (int k = 0; k < SLOTS; k++)
        if (slot[k].size) {
            live_del(t * SLOTS + k);
            CHECK(sh_pool_free(mt_pool, slot[k].va, stream, 0) == 0);
        }
    for (int i = 0; i < npending; i++)
        fence_complete(pending[i]);
    return NULL;
}

/* What a monitor and the launch hooks do meanwhile: stats, lookups of
 * addresses that may be freed or reused under them, and trims. */
static void *mt_monitor(void *arg)
{
    (void)arg;
    uint64_t s = 12345;
    uintptr_t seen[256] = {0}; /* addresses once live: freed, torn down, built again */
    long n = 0;
    while (!__atomic_load_n(&mt_stop, __ATOMIC_RELAXED)) {
        struct sh_pool_stats st;
        sh_pool_stats(mt_pool, &st);
        int i = (int)(rnd(&s) % (NTHREADS * SLOTS));
        pthread_mutex_lock(&live_mu);
        struct live l = live_set[i];
        pthread_mutex_unlock(&live_mu);
        uintptr_t probe[2] = {0, seen[rnd(&s) % 256]};
        if (l.size)
            seen[n % 256] = probe[0] = l.va + rnd(&s) % l.size;
        for (int k = 0; k < 2; k++) {
            struct sh_region_info ri;
            if (probe[k] && sh_pool_lookup(mt_pool, probe[k], &ri) == 0) {
                CHECK(probe[k] >= ri.va && probe[k] < ri.va + ri.mapped);
                CHECK(ri.id != 0); /* a region is complete once it can be found */
                CHECK(ri.nchunks > 0 && ri.size > 0 && ri.size <= ri.mapped);
            }
        }
        if (++n % 64 == 0)
            sh_pool_trim(mt_pool, 8 * M);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 8 * M;
    p.va_block = 256 * M;
    p.va_cache = 256 * M;
    p.device_cache = 96 * M; /* small: teardowns race with everything else */
    mt_pool = mkpool(&p);
    memset(live_set, 0, sizeof live_set);
    memset(mt_small, 0, sizeof mt_small);
    mt_stop = 0;
    mt_errors = 0;
    pthread_t th[NTHREADS], mon;
    assert_int_equal(pthread_create(&mon, NULL, mt_monitor, NULL), 0);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, mt_worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    __atomic_store_n(&mt_stop, 1, __ATOMIC_RELAXED);
    pthread_join(mon, NULL);
    if (mt_errors)
        fail_msg("%d failed checks, the first at line %d", mt_errors, mt_first_line);

    long small = 0;
    for (int i = 0; i < NTHREADS; i++)
        small += mt_small[i];
    struct sh_pool_stats st = pstats(mt_pool);
    assert_int_equal(st.small_allocs, small);
    assert_int_equal(st.small_frees, small);
    /* Only slabs are left live. */
    assert_int_equal(st.allocs - st.frees, st.regions[SH_RS_RESIDENT]);
    assert_int_equal(st.slabs, st.regions[SH_RS_RESIDENT]);
    assert_true(st.freed_bytes <= p.device_cache);
    assert_int_equal(st.vmm_maps - st.vmm_unmaps, (uint64_t)vf.nmaps);
    assert_int_equal(st.device_bytes, vf.device_bytes);
    assert_int_equal(vf.bad, 0);
    sh_pool_destroy(mt_pool);
    assert_books_balanced();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_split, setup),
        cmocka_unit_test_setup(test_split_limits, setup),
        cmocka_unit_test_setup(test_create_args, setup),
        cmocka_unit_test_setup(test_build_region, setup),
        cmocka_unit_test_setup(test_unmap_failures, setup),
        cmocka_unit_test_setup(test_reuse_same_size, setup),
        cmocka_unit_test_setup(test_other_size_builds, setup),
        cmocka_unit_test_setup(test_churn_no_vmm, setup),
        cmocka_unit_test_setup(test_lookup, setup),
        cmocka_unit_test_setup(test_async_stream_order, setup),
        cmocka_unit_test_setup(test_malloc_reuses_done_only, setup),
        cmocka_unit_test_setup(test_small_suballoc, setup),
        cmocka_unit_test_setup(test_small_churn_no_vmm, setup),
        cmocka_unit_test_setup(test_cache_limit, setup),
        cmocka_unit_test_setup(test_cache_limit_releases, setup),
        cmocka_unit_test_setup(test_trim, setup),
        cmocka_unit_test_setup(test_trim_waits_fences, setup),
        cmocka_unit_test_setup(test_device_full, setup),
        cmocka_unit_test_setup(test_build_failures_leak_nothing, setup),
        cmocka_unit_test_setup(test_free_errors, setup),
        cmocka_unit_test_setup(test_stats, setup),
        cmocka_unit_test_setup(test_destroy, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
