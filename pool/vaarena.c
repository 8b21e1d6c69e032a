/* vaarena.c — VA ranges carved from large, cached reservations.
 *
 * Reserving VA is a driver call (tens of µs); regions come and go on every
 * step. So VA is reserved in big blocks and carved: best fit over the free
 * ranges ("holes"), which are binned by log2 size and indexed by address so a
 * freed range merges with its neighbours from the same block. A block that
 * becomes wholly free is unreserved only while the cached free VA exceeds
 * cache_limit.
 *
 * Locking: a->mu guards everything in struct sh_vaarena except the call
 * counters (atomics). ops->reserve and ops->unreserve run without it.
 */
#include "pool/pool_parts.h"

#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>

#define NBINS         64
#define DEFAULT_BLOCK ((size_t)1 << 30)

struct vblock {
    uintptr_t base;
    size_t size;
    struct vblock *prev, *next;
};

struct hole {
    uintptr_t start;
    size_t len;
    struct vblock *blk;
    struct hole *prev, *next; /* in bins[bin], or next in the spare list */
    int bin;
};

struct sh_vaarena {
    pthread_mutex_t mu;
    struct sh_vmm_ops ops;
    size_t gran, block_bytes, cache_limit;
    struct sh_rindex *holes; /* free ranges by address -> struct hole */
    struct sh_rindex *live;  /* allocations -> their struct vblock */
    struct hole *bins[NBINS];
    uint64_t binmask; /* bit b set: bins[b] is not empty */
    struct hole *spare;
    size_t nspare;
    struct vblock *blocks;
    size_t reserved, in_use, nblocks, nholes;
    uint64_t reserve_calls, unreserve_calls;
};

static int log2_floor(size_t x)
{
    return 63 - __builtin_clzll((unsigned long long)x);
}

static uintptr_t align_up(uintptr_t x, size_t align)
{
    return (x + align - 1) & ~(uintptr_t)(align - 1);
}

int sh_vaarena_create(const struct sh_vmm_ops *ops, size_t granularity, size_t block_bytes,
                      size_t cache_limit, struct sh_vaarena **out)
{
    if (!ops || !out || granularity == 0 || (granularity & (granularity - 1)))
        return SH_EINVAL;
    struct sh_vaarena *a = calloc(1, sizeof *a);
    if (!a)
        return SH_ENOMEM;
    if (sh_rindex_create(&a->holes) || sh_rindex_create(&a->live)) {
        sh_rindex_destroy(a->holes);
        free(a);
        return SH_ENOMEM;
    }
    pthread_mutex_init(&a->mu, NULL);
    a->ops = *ops;
    a->gran = granularity;
    a->block_bytes = align_up(block_bytes ? block_bytes : DEFAULT_BLOCK, granularity);
    a->cache_limit = cache_limit;
    *out = a;
    return 0;
}

/* Makes the next take (or merge) unable to fail: two spare hole records and
 * index nodes for two holes and one allocation. */
static int prepare(struct sh_vaarena *a)
{
    while (a->nspare < 2) {
        struct hole *h = malloc(sizeof *h);
        if (!h)
            return SH_ENOMEM;
        h->next = a->spare;
        a->spare = h;
        a->nspare++;
    }
    int err = sh_rindex_reserve(a->holes, 2);
    return err ? err : sh_rindex_reserve(a->live, 1);
}

static void hole_add(struct sh_vaarena *a, uintptr_t start, size_t len, struct vblock *blk)
{
    struct hole *h = a->spare;
    a->spare = h->next;
    a->nspare--;
    *h = (struct hole){.start = start, .len = len, .blk = blk, .bin = log2_floor(len)};
    h->next = a->bins[h->bin];
    if (h->next)
        h->next->prev = h;
    a->bins[h->bin] = h;
    a->binmask |= 1ull << h->bin;
    a->nholes++;
    /* cannot fail: nodes were reserved and holes never overlap */
    (void)sh_rindex_insert(a->holes, start, len, h);
}

static void hole_del(struct sh_vaarena *a, struct hole *h)
{
    sh_rindex_remove(a->holes, h->start, NULL);
    if (h->prev)
        h->prev->next = h->next;
    else
        a->bins[h->bin] = h->next;
    if (h->next)
        h->next->prev = h->prev;
    if (!a->bins[h->bin])
        a->binmask &= ~(1ull << h->bin);
    a->nholes--;
    h->next = a->spare;
    a->spare = h;
    a->nspare++;
}

static int fits(const struct hole *h, size_t size, size_t align)
{
    return h->len >= size && align_up(h->start, align) - h->start <= h->len - size;
}

/* Smallest hole that fits: every hole in a higher bin is larger than any in
 * a lower one, so the first bin with a fit holds the best. */
static struct hole *best_fit(struct sh_vaarena *a, size_t size, size_t align)
{
    uint64_t mask = a->binmask & (~0ull << log2_floor(size));
    while (mask) {
        int b = __builtin_ctzll(mask);
        mask &= mask - 1;
        struct hole *best = NULL;
        for (struct hole *h = a->bins[b]; h; h = h->next) {
            if (!fits(h, size, align))
                continue;
            if (!best || h->len < best->len || (h->len == best->len && h->start < best->start))
                best = h;
            if (h->len == size)
                break;
        }
        if (best)
            return best;
    }
    return NULL;
}

/* Carves [at, at+size) out of h, leaving the pieces either side as holes. */
static void take(struct sh_vaarena *a, struct hole *h, uintptr_t at, size_t size)
{
    struct vblock *blk = h->blk;
    uintptr_t start = h->start, end = h->start + h->len;
    hole_del(a, h);
    if (at > start)
        hole_add(a, start, at - start, blk);
    if (at + size < end)
        hole_add(a, at + size, end - (at + size), blk);
    /* cannot fail: nodes were reserved, and holes are disjoint from live ranges */
    (void)sh_rindex_insert(a->live, at, size, blk);
    a->in_use += size;
}

static void block_link(struct sh_vaarena *a, struct vblock *b)
{
    b->prev = NULL;
    b->next = a->blocks;
    if (b->next)
        b->next->prev = b;
    a->blocks = b;
    a->reserved += b->size;
    a->nblocks++;
    hole_add(a, b->base, b->size, b);
}

static void block_unlink(struct sh_vaarena *a, struct vblock *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        a->blocks = b->next;
    if (b->next)
        b->next->prev = b->prev;
    a->reserved -= b->size;
    a->nblocks--;
}

static int do_reserve(struct sh_vaarena *a, size_t size, size_t align, uintptr_t *va)
{
    __atomic_fetch_add(&a->reserve_calls, 1, __ATOMIC_RELAXED);
    return a->ops.reserve(a->ops.ctx, size, align, va);
}

static void do_unreserve(struct sh_vaarena *a, struct vblock *b)
{
    __atomic_fetch_add(&a->unreserve_calls, 1, __ATOMIC_RELAXED);
    int err = a->ops.unreserve(a->ops.ctx, b->base, b->size);
    if (err)
        sh_log(SH_LOG_WARN, "vaarena: unreserve of %zu bytes at %#lx failed (%d)", b->size,
               (unsigned long)b->base, err);
    free(b);
}

/* Called without the lock. A full block is tried first, then just `size`. */
static int new_block(struct sh_vaarena *a, size_t size, size_t align, struct vblock **out)
{
    struct vblock *b = malloc(sizeof *b);
    if (!b)
        return SH_ENOMEM;
    b->size = size > a->block_bytes ? size : a->block_bytes;
    int err = do_reserve(a, b->size, align, &b->base);
    if (err && b->size > size) {
        b->size = size;
        err = do_reserve(a, b->size, align, &b->base);
    }
    if (err) {
        free(b);
        return err;
    }
    *out = b;
    return 0;
}

int sh_vaarena_alloc(struct sh_vaarena *a, size_t size, size_t align, uintptr_t *va)
{
    if (!va || size == 0 || size % a->gran || (align & (align - 1)))
        return SH_EINVAL;
    if (align < a->gran)
        align = a->gran;
    struct vblock *fresh = NULL;
    int err;
    pthread_mutex_lock(&a->mu);
    while ((err = prepare(a)) == 0) {
        if (fresh) {
            block_link(a, fresh);
            fresh = NULL;
            continue;
        }
        struct hole *h = best_fit(a, size, align);
        if (h) {
            *va = align_up(h->start, align);
            take(a, h, *va, size);
            break;
        }
        pthread_mutex_unlock(&a->mu);
        err = new_block(a, size, align, &fresh);
        pthread_mutex_lock(&a->mu);
        if (err)
            break;
    }
    pthread_mutex_unlock(&a->mu);
    if (fresh)
        do_unreserve(a, fresh);
    return err;
}

int sh_vaarena_free(struct sh_vaarena *a, uintptr_t va, size_t size)
{
    uintptr_t start;
    size_t len;
    void *p;
    pthread_mutex_lock(&a->mu);
    int err = sh_rindex_find(a->live, va, &start, &len, &p);
    if (err || start != va || len != size)
        err = SH_EINVAL;
    else
        err = prepare(a);
    if (err) {
        pthread_mutex_unlock(&a->mu);
        return err;
    }
    sh_rindex_remove(a->live, va, NULL);
    a->in_use -= size;
    struct vblock *blk = p;
    uintptr_t lo = va, hi = va + size, blk_end = blk->base + blk->size;
    struct hole *h;
    if (lo > blk->base && (h = sh_rindex_lookup(a->holes, lo - 1))) {
        lo = h->start;
        hole_del(a, h);
    }
    if (hi < blk_end && (h = sh_rindex_lookup(a->holes, hi))) {
        hi = h->start + h->len;
        hole_del(a, h);
    }
    int drop = lo == blk->base && hi == blk_end && a->reserved - a->in_use > a->cache_limit;
    if (drop)
        block_unlink(a, blk);
    else
        hole_add(a, lo, hi - lo, blk);
    pthread_mutex_unlock(&a->mu);
    if (drop)
        do_unreserve(a, blk);
    return 0;
}

size_t sh_vaarena_trim(struct sh_vaarena *a)
{
    struct vblock *idle = NULL, *b, *next;
    size_t bytes = 0;
    pthread_mutex_lock(&a->mu);
    for (b = a->blocks; b; b = next) {
        next = b->next;
        struct hole *h = sh_rindex_lookup(a->holes, b->base);
        if (!h || h->len != b->size)
            continue;
        hole_del(a, h);
        block_unlink(a, b);
        b->next = idle;
        idle = b;
        bytes += b->size;
    }
    pthread_mutex_unlock(&a->mu);
    for (b = idle; b; b = next) {
        next = b->next;
        do_unreserve(a, b);
    }
    return bytes;
}

void sh_vaarena_stats(struct sh_vaarena *a, struct sh_vaarena_stats *st)
{
    pthread_mutex_lock(&a->mu);
    st->reserved_bytes = a->reserved;
    st->in_use_bytes = a->in_use;
    st->blocks = a->nblocks;
    st->free_ranges = a->nholes;
    pthread_mutex_unlock(&a->mu);
    st->reserve_calls = __atomic_load_n(&a->reserve_calls, __ATOMIC_RELAXED);
    st->unreserve_calls = __atomic_load_n(&a->unreserve_calls, __ATOMIC_RELAXED);
}

void sh_vaarena_destroy(struct sh_vaarena *a)
{
    if (!a)
        return;
    struct vblock *b, *bn;
    for (b = a->blocks; b; b = bn) {
        bn = b->next;
        do_unreserve(a, b);
    }
    struct hole *h, *hn;
    for (int i = 0; i < NBINS; i++)
        for (h = a->bins[i]; h; h = hn) {
            hn = h->next;
            free(h);
        }
    for (h = a->spare; h; h = hn) {
        hn = h->next;
        free(h);
    }
    sh_rindex_destroy(a->holes);
    sh_rindex_destroy(a->live);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
