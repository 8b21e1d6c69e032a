/* chunkcache.c — released device chunk handles kept for reuse, by size.
 *
 * cuMemCreate/cuMemRelease cost tens of µs each and regions are freed and
 * allocated again every step, so released device handles stay here (one stack
 * per power-of-two size) until cached bytes would exceed cache_limit or the
 * registry trims under memory pressure.
 *
 * Locking: cc->mu guards the bins and the byte and hit counters; the
 * create/release call counters are atomics. ops->create and ops->release run
 * without the lock.
 */
#include "pool/pool_parts.h"

#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>

#define NBINS 64
#define BATCH 32 /* handles released per lock round in trim */

struct bin {
    uint64_t *h;
    size_t n, cap;
};

struct sh_chunkcache {
    pthread_mutex_t mu;
    struct sh_vmm_ops ops;
    size_t gran, cache_limit;
    struct bin bins[NBINS]; /* bins[b]: handles of 2^b bytes */
    uint64_t binmask;       /* bit b set: bins[b] is not empty */
    size_t cached_bytes, cached_handles, device_bytes;
    uint64_t hits, misses, creates, releases;
};

static int size_bin(const struct sh_chunkcache *cc, size_t size)
{
    if (size < cc->gran || (size & (size - 1)))
        return -1;
    return __builtin_ctzll((unsigned long long)size);
}

int sh_chunkcache_create(const struct sh_vmm_ops *ops, size_t granularity, size_t cache_limit,
                         struct sh_chunkcache **out)
{
    if (!ops || !out || granularity == 0 || (granularity & (granularity - 1)))
        return SH_EINVAL;
    struct sh_chunkcache *cc = calloc(1, sizeof *cc);
    if (!cc)
        return SH_ENOMEM;
    pthread_mutex_init(&cc->mu, NULL);
    cc->ops = *ops;
    cc->gran = granularity;
    cc->cache_limit = cache_limit;
    *out = cc;
    return 0;
}

static int do_create(struct sh_chunkcache *cc, size_t size, uint64_t *handle)
{
    __atomic_fetch_add(&cc->creates, 1, __ATOMIC_RELAXED);
    return cc->ops.create(cc->ops.ctx, size, SH_LOC_DEVICE, handle);
}

static int push(struct sh_chunkcache *cc, int b, uint64_t handle);

/* Releases a handle already taken off the books. If the driver refuses,
 * the handle goes back into the cache, still counted, to be released by a
 * later trim: memory the device still holds is never forgotten. */
static int do_release(struct sh_chunkcache *cc, uint64_t handle, int b)
{
    __atomic_fetch_add(&cc->releases, 1, __ATOMIC_RELAXED);
    int err = cc->ops.release(cc->ops.ctx, handle);
    if (!err)
        return 0;
    size_t size = (size_t)1 << b;
    sh_log(SH_LOG_WARN, "chunkcache: release of a %zu-byte chunk failed (%d); kept for later", size,
           err);
    pthread_mutex_lock(&cc->mu);
    sh_bytes_add(&cc->device_bytes, size);
    if (push(cc, b, handle) != 0)
        sh_log(SH_LOG_ERROR, "chunkcache: lost track of a %zu-byte chunk", size);
    pthread_mutex_unlock(&cc->mu);
    return err;
}

static uint64_t pop(struct sh_chunkcache *cc, int b)
{
    struct bin *bn = &cc->bins[b];
    uint64_t h = bn->h[--bn->n];
    if (!bn->n)
        cc->binmask &= ~(1ull << b);
    cc->cached_bytes -= (size_t)1 << b;
    cc->cached_handles--;
    return h;
}

static int push(struct sh_chunkcache *cc, int b, uint64_t h)
{
    struct bin *bn = &cc->bins[b];
    if (bn->n == bn->cap) {
        size_t cap = bn->cap ? bn->cap * 2 : 16;
        uint64_t *p = realloc(bn->h, cap * sizeof *p);
        if (!p)
            return SH_ENOMEM;
        bn->h = p;
        bn->cap = cap;
    }
    bn->h[bn->n++] = h;
    cc->binmask |= 1ull << b;
    cc->cached_bytes += (size_t)1 << b;
    cc->cached_handles++;
    return 0;
}

int sh_chunkcache_get(struct sh_chunkcache *cc, size_t chunk_size, uint64_t *handle)
{
    int b = size_bin(cc, chunk_size);
    if (b < 0 || !handle)
        return SH_EINVAL;
    pthread_mutex_lock(&cc->mu);
    if (cc->bins[b].n) {
        *handle = pop(cc, b);
        cc->hits++;
        pthread_mutex_unlock(&cc->mu);
        return 0;
    }
    cc->misses++;
    sh_bytes_add(&cc->device_bytes, chunk_size);
    pthread_mutex_unlock(&cc->mu);
    /* Cached chunks of other sizes may be what stands in the way. */
    int err = do_create(cc, chunk_size, handle);
    if (err && sh_chunkcache_trim(cc, chunk_size) > 0)
        err = do_create(cc, chunk_size, handle);
    if (err) {
        pthread_mutex_lock(&cc->mu);
        sh_bytes_sub(&cc->device_bytes, chunk_size);
        pthread_mutex_unlock(&cc->mu);
    }
    return err;
}

int sh_chunkcache_put(struct sh_chunkcache *cc, uint64_t handle, size_t chunk_size)
{
    int b = size_bin(cc, chunk_size);
    if (b < 0)
        return SH_EINVAL;
    pthread_mutex_lock(&cc->mu);
    int keep = cc->cached_bytes + chunk_size <= cc->cache_limit && push(cc, b, handle) == 0;
    if (!keep)
        sh_bytes_sub(&cc->device_bytes, chunk_size);
    pthread_mutex_unlock(&cc->mu);
    if (!keep)
        do_release(cc, handle, b);
    return 0;
}

int sh_chunkcache_drop(struct sh_chunkcache *cc, uint64_t handle, size_t chunk_size)
{
    int b = size_bin(cc, chunk_size);
    if (b < 0)
        return SH_EINVAL;
    pthread_mutex_lock(&cc->mu);
    sh_bytes_sub(&cc->device_bytes, chunk_size);
    pthread_mutex_unlock(&cc->mu);
    do_release(cc, handle, b);
    return 0;
}

/* The largest cached size that does not overshoot `want` (> 0); failing
 * that the smallest cached size. -1 if nothing is cached. */
static int pick(const struct sh_chunkcache *cc, size_t want)
{
    if (!cc->binmask)
        return -1;
    int top = 63 - __builtin_clzll((unsigned long long)want);
    uint64_t fit = cc->binmask & (top == 63 ? ~0ull : (2ull << top) - 1);
    return fit ? 63 - __builtin_clzll(fit) : __builtin_ctzll(cc->binmask);
}

size_t sh_chunkcache_trim(struct sh_chunkcache *cc, size_t bytes)
{
    size_t freed = 0;
    while (freed < bytes) {
        uint64_t h[BATCH];
        int b[BATCH];
        int n = 0;
        size_t got = 0;
        pthread_mutex_lock(&cc->mu);
        while (n < BATCH && freed + got < bytes) {
            b[n] = pick(cc, bytes - freed - got);
            if (b[n] < 0)
                break;
            h[n] = pop(cc, b[n]);
            sh_bytes_sub(&cc->device_bytes, (size_t)1 << b[n]);
            got += (size_t)1 << b[n++];
        }
        pthread_mutex_unlock(&cc->mu);
        for (int i = 0; i < n; i++)
            if (do_release(cc, h[i], b[i]) != 0)
                got -= (size_t)1 << b[i];
        freed += got;
        if (got == 0 && n > 0)
            break; /* the driver refuses: try again later */
        if (n < BATCH && freed < bytes)
            break; /* nothing left */
    }
    return freed;
}

size_t sh_chunkcache_device_bytes(struct sh_chunkcache *cc)
{
    return __atomic_load_n(&cc->device_bytes, __ATOMIC_RELAXED);
}

void sh_chunkcache_stats(struct sh_chunkcache *cc, struct sh_chunkcache_stats *st)
{
    pthread_mutex_lock(&cc->mu);
    st->cached_bytes = cc->cached_bytes;
    st->cached_handles = cc->cached_handles;
    st->device_bytes = cc->device_bytes;
    st->hits = cc->hits;
    st->misses = cc->misses;
    pthread_mutex_unlock(&cc->mu);
    st->creates = __atomic_load_n(&cc->creates, __ATOMIC_RELAXED);
    st->releases = __atomic_load_n(&cc->releases, __ATOMIC_RELAXED);
}

void sh_chunkcache_destroy(struct sh_chunkcache *cc)
{
    if (!cc)
        return;
    sh_chunkcache_trim(cc, SIZE_MAX);
    for (int b = 0; b < NBINS; b++)
        free(cc->bins[b].h);
    pthread_mutex_destroy(&cc->mu);
    free(cc);
}
