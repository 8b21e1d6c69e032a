/* use.c — what work issued on the device uses: the regions a launch's or a
 * copy's pointers fall in, found in one pass over the index, their use
 * recorded (LRU order, the monitor's last-use time), and the issue stamps
 * that tell a move in flight that work ran on the bytes it is moving.
 *
 * Runs on every launch, so each call takes index_lock's read side once
 * and looks each address up once.
 *
 * Locking: index_lock (read) around lookups; last_use, issue stamps,
 * use_streams, pool->opaque, pool->spanned and their streams are atomics.
 */
#include "pool/region_int.h"

#include "sh_clock.h"

/* The regions this thread's work named lately, by address: launches name
 * the same few regions over and over, and a hit skips the tree walk. An
 * entry holds while the index has not changed since it was made (its
 * generation, never the same for two indices). Callers hold index_lock. */
#define HOT_BITS 8
struct hot {
    uint64_t gen;
    uintptr_t start;
    size_t len;
    struct region *r;
};
static _Thread_local struct hot hot[1 << HOT_BITS];

/* tab: this thread's hot table; gen: the index's generation, both read
 * once per call by the callers that look up many addresses. */
static inline struct region *lookup_in(struct hot *tab, uint64_t gen, const struct sh_pool *pool,
                                       uintptr_t v)
{
    struct hot *h = &tab[((v >> 16) * 0x9e3779b97f4a7c15u) >> (64 - HOT_BITS)];
    if (h->gen == gen && v - h->start < h->len)
        return h->r;
    uintptr_t start;
    size_t len;
    void *r;
    if (sh_rindex_find(pool->index, v, &start, &len, &r) != 0)
        return NULL;
    *h = (struct hot){.gen = gen, .start = start, .len = len, .r = r};
    return r;
}

static struct region *lookup(const struct sh_pool *pool, uintptr_t v)
{
    return lookup_in(hot, sh_rindex_gen(pool->index), pool, v);
}

/* Adds r's base to u->bases unless it is there (launches name few regions);
 * 1 if it was not. Sub-allocator slabs are never moved: not theirs. */
static int add_base(struct sh_pool_use *u, const struct region *r)
{
    if (r->path == SH_PATH_SLAB)
        return 0;
    for (size_t k = 0; k < u->nbases; k++)
        if (u->bases[k] == r->va)
            return 0;
    u->bases[u->nbases++] = r->va;
    return 1;
}

size_t sh_pool_use(struct sh_pool *pool, uintptr_t *vals, size_t n, uint64_t now_us,
                   struct sh_pool_use *u)
{
    uint64_t now = u ? __atomic_add_fetch(&pool->clock, 1, __ATOMIC_RELAXED) : 0;
    if (u) {
        u->nbases = 0;
        u->host_bytes = 0;
        u->ptrs = 0;
    }
    size_t m = 0;
    struct hot *tab = hot;
    sh_rw_rdlock(&pool->index_lock);
    uint64_t gen = sh_rindex_gen(pool->index);
    for (size_t i = 0; i < n; i++) {
        struct region *r = lookup_in(tab, gen, pool, vals[i]);
        if (!r)
            continue;
        vals[m++] = vals[i];
        if (!u)
            continue;
        /* sub-allocator slabs too: small pointer tables live there */
        u->ptrs |= __atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED);
        if (spans(r)) /* a table in a neighbour it may reach */
            u->ptrs |= __atomic_load_n(&pool->spanned_ptrs, __ATOMIC_RELAXED);
        __atomic_store_n(&r->last_use, now, __ATOMIC_RELAXED);
        __atomic_store_n(&r->last_use_us, now_us, __ATOMIC_RELAXED);
        size_t k = u->nbases;
        if (add_base(u, r)) {
            if (u->regions)
                u->regions[k] = r;
            if (__atomic_load_n(&r->state, __ATOMIC_RELAXED) == SH_RS_HOST && !r->stuck)
                u->host_bytes += r->mapped;
        }
    }
    sh_rw_unlock(&pool->index_lock);
    if (u) {
        u->gen = gen;
        /* Evicted regions whose bytes the scanner has not read yet: the
         * answer first (rare: only until the scanner reaches them). */
        if (__builtin_expect(u->ptrs & PTRS_UNSCANNED, 0))
            u->ptrs = (u->ptrs & PTRS_FOUND) | sh_pool_scan_settle_bases(pool, u->bases, u->nbases);
    }
    return m;
}

size_t sh_pool_bases(struct sh_pool *pool, const uintptr_t *addrs, size_t n, uintptr_t *bases)
{
    return sh_pool_bases_ptrs(pool, addrs, n, bases, NULL);
}

size_t sh_pool_bases_ptrs(struct sh_pool *pool, const uintptr_t *addrs, size_t n, uintptr_t *bases,
                          int *ptrs)
{
    size_t m = 0;
    int h = 0;
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = lookup(pool, addrs[i]);
        if (r) /* sub-allocator slabs too: small tables live there */
            h |= __atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED) |
                 (spans(r) ? __atomic_load_n(&pool->spanned_ptrs, __ATOMIC_RELAXED) : 0);
        if (!r || r->path == SH_PATH_SLAB)
            continue;
        size_t k = 0;
        while (k < m && bases[k] != r->va)
            k++;
        if (k == m)
            bases[m++] = r->va;
    }
    sh_rw_unlock(&pool->index_lock);
    if (ptrs && (h & PTRS_UNSCANNED))
        h = (h & PTRS_FOUND) | sh_pool_scan_settle_bases(pool, bases, m);
    if (ptrs && (h & PTRS_FOUND))
        *ptrs = 1;
    return m;
}

void sh_pool_touch(struct sh_pool *pool, const uintptr_t *addrs, size_t n, size_t *host_bytes)
{
    uint64_t now = __atomic_add_fetch(&pool->clock, 1, __ATOMIC_RELAXED);
    uint64_t now_us = sh_clock_us(); /* the monitor's clock */
    *host_bytes = 0;
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = lookup(pool, addrs[i]);
        if (!r)
            continue;
        __atomic_store_n(&r->last_use, now, __ATOMIC_RELAXED);
        __atomic_store_n(&r->last_use_us, now_us, __ATOMIC_RELAXED);
        if (__atomic_load_n(&r->state, __ATOMIC_RELAXED) == SH_RS_HOST && !r->stuck)
            *host_bytes += r->mapped;
    }
    sh_rw_unlock(&pool->index_lock);
}

/* Stamps only grow: two threads' stamps may land in either order, and a
 * move that read the later one must not see it replaced by the earlier. */
static void raise_stamp(uint64_t *stamp, uint64_t now)
{
    uint64_t cur = __atomic_load_n(stamp, __ATOMIC_RELAXED);
    while (cur < now &&
           !__atomic_compare_exchange_n(stamp, &cur, now, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

static void stamp(struct sh_pool *pool, struct region *r, uint64_t now, uint64_t streams)
{
    /* The streams first: whoever sees the stamp sees them (ev_idle). */
    if (streams)
        __atomic_or_fetch(&r->use_streams, streams, __ATOMIC_RELAXED);
    raise_stamp(&r->issued, now);
    if (spans(r)) { /* its neighbours too, in one stamp */
        if (streams)
            __atomic_or_fetch(&pool->spanned_streams, streams, __ATOMIC_RELAXED);
        raise_stamp(&pool->spanned, now);
    }
}

void sh_pool_issued(struct sh_pool *pool, const uintptr_t *bases, size_t n, uint64_t streams)
{
    sh_pool_issued_found(pool, bases, NULL, n, 0, streams);
}

/* The regions found are alive and still the ones at bases while the index
 * has the generation they were found in (a region leaves the index before
 * it is freed, and that changes the generation); otherwise each base is
 * looked up again. */
void sh_pool_issued_found(struct sh_pool *pool, const uintptr_t *bases, void *const *regions,
                          size_t n, uint64_t gen, uint64_t streams)
{
    if (n == 0)
        return;
    uint64_t now = __atomic_add_fetch(&pool->clock, 1, __ATOMIC_RELAXED);
    sh_rw_rdlock(&pool->index_lock);
    if (regions && gen == sh_rindex_gen(pool->index)) {
        for (size_t i = 0; i < n; i++)
            stamp(pool, regions[i], now, streams);
    } else {
        for (size_t i = 0; i < n; i++) {
            struct region *r = lookup(pool, bases[i]);
            if (r)
                stamp(pool, r, now, streams);
        }
    }
    sh_rw_unlock(&pool->index_lock);
}

/* Every reader of a region's stamp takes the later of it and this one
 * (issued_at), so stamping all regions at once is never less safe than
 * stamping some: it only makes moves in flight more cautious. */
static void stamp_all(struct sh_pool *pool, uint64_t streams)
{
    uint64_t now = __atomic_add_fetch(&pool->clock, 1, __ATOMIC_RELAXED);
    if (streams)
        __atomic_or_fetch(&pool->opaque_streams, streams, __ATOMIC_RELAXED);
    raise_stamp(&pool->opaque, now);
}

void sh_pool_issued_opaque(struct sh_pool *pool, uint64_t streams)
{
    stamp_all(pool, streams);
    __atomic_add_fetch(&pool->st.opaque, 1, __ATOMIC_RELAXED);
}

void sh_pool_issued_any(struct sh_pool *pool, uint64_t streams)
{
    stamp_all(pool, streams);
}
