/* region.c — the region registry: regions built from VA arena ranges and
 * cached device chunks, freed regions kept mapped for reuse, small sizes
 * sent to the sub-allocator.
 *
 * Locking: pool->mu guards region bookkeeping (states, the freed lists, the
 * counters). pool->index_lock guards the address index: lookups take the
 * read side, creation and teardown the write side. Order: mu, then
 * index_lock. VMM calls and fence waits run with neither held; a region
 * being built or torn down is reachable by no one else meanwhile.
 */
#include "pool/region_int.h"

#include "sh_clock.h"
#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int fence_done(struct sh_pool *pool, uint64_t fence)
{
    return fence == 0 || pool->fences.done(pool->fences.ctx, fence);
}

static void fence_drop(struct sh_pool *pool, uint64_t fence)
{
    if (fence && pool->fences.drop)
        pool->fences.drop(pool->fences.ctx, fence);
}

unsigned sh_pool_split(size_t mapped, size_t gran, size_t max_chunk, size_t *chunks, unsigned max)
{
    unsigned n = 0;
    while (mapped >= gran && n < max) {
        size_t c = max_chunk;
        while (c > mapped)
            c >>= 1;
        /* Many max-size chunks are fine; what remains decomposes in powers of two. */
        chunks[n++] = c;
        mapped -= c;
    }
    return mapped ? 0 : n;
}

static size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

/* ---- freed regions: an LRU list plus size buckets ---- */

static unsigned bucket_of(const struct sh_pool *pool, size_t mapped)
{
    return (unsigned)((mapped / pool->p.granularity) % NBUCKETS);
}

static void freed_push(struct sh_pool *pool, struct region *r)
{
    r->lru_next = NULL;
    r->lru_prev = pool->lru_tail;
    if (pool->lru_tail)
        pool->lru_tail->lru_next = r;
    else
        pool->lru_head = r;
    pool->lru_tail = r;
    unsigned b = bucket_of(pool, r->mapped);
    r->bucket_next = pool->buckets[b];
    pool->buckets[b] = r;
    pool->st.freed_bytes += r->mapped;
}

static void freed_unlink(struct sh_pool *pool, struct region *r)
{
    if (r->lru_prev)
        r->lru_prev->lru_next = r->lru_next;
    else
        pool->lru_head = r->lru_next;
    if (r->lru_next)
        r->lru_next->lru_prev = r->lru_prev;
    else
        pool->lru_tail = r->lru_prev;
    struct region **pp = &pool->buckets[bucket_of(pool, r->mapped)];
    while (*pp != r)
        pp = &(*pp)->bucket_next;
    *pp = r->bucket_next;
    pool->st.freed_bytes -= r->mapped;
}

/* A freed region of exactly `mapped` bytes usable by `stream`; mu held. */
static struct region *freed_take(struct sh_pool *pool, size_t mapped, uint64_t stream)
{
    for (struct region *r = pool->buckets[bucket_of(pool, mapped)]; r; r = r->bucket_next) {
        if (r->mapped != mapped)
            continue;
        if ((stream != NO_STREAM && r->stream == stream) || fence_done(pool, r->fence)) {
            freed_unlink(pool, r);
            return r;
        }
    }
    return NULL;
}

/* ---- building and tearing down ---- */

/* A chunk that cannot be unmapped keeps its backing, and the region its VA:
 * handing either to a cache while mapped would give it to two owners. */
static void unbuild(struct sh_pool *pool, struct region *r, unsigned mapped_chunks)
{
    size_t kept = 0;
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        if (__atomic_load_n(&c->hole, __ATOMIC_ACQUIRE)) {
            sh_pool_hole_close(pool, c); /* nothing is mapped there */
        } else if (i < mapped_chunks && sh_pool_unmap(pool, r->va + c->off, c->size) != 0) {
            kept += c->size;
            continue;
        }
        if (c->handle && r->pinned) /* a peer still maps it: never another region's */
            sh_chunkcache_drop(pool->cc, c->handle, c->size);
        else if (c->handle)
            sh_chunkcache_put(pool->cc, c->handle, c->size);
        if (c->slab) /* an evicted region freed by the program */
            sh_hostpool_put(pool->mover.host, c->slab);
        if (c->kept) /* a live region's host copy, at teardown */
            sh_hostpool_put(pool->mover.host, c->kept);
    }
    if (kept)
        sh_log(SH_LOG_ERROR, "cannot unmap %zu bytes of 0x%llx: they stay reserved and mapped",
               kept, (unsigned long long)r->va);
    else if (r->path != SH_PATH_VMM) /* the program's own VA is not ours to free */
        sh_vaarena_free(pool->va, r->va, r->mapped);
    free(r);
}

static int get_chunk(struct sh_pool *pool, size_t size, uint64_t *handle)
{
    int rc = sh_chunkcache_get(pool->cc, size, handle);
    if (rc == SH_ENOMEM && sh_pool_trim(pool, size) > 0)
        rc = sh_chunkcache_get(pool->cc, size, handle);
    return rc;
}

struct region *sh_pool_region_new(struct sh_pool *pool, size_t mapped)
{
    unsigned cap = (unsigned)(mapped / pool->p.max_chunk) + 64; /* + one per power of two */
    size_t *sizes = malloc(cap * sizeof *sizes);
    unsigned n =
        sizes ? sh_pool_split(mapped, pool->p.granularity, pool->p.max_chunk, sizes, cap) : 0;
    struct region *r = n ? calloc(1, sizeof *r + n * sizeof(struct chunk)) : NULL;
    if (r) {
        r->mapped = mapped;
        r->nchunks = n;
        size_t off = 0;
        for (unsigned i = 0; i < n; i++) {
            r->chunks[i] = (struct chunk){.off = off, .size = sizes[i]};
            off += sizes[i];
        }
    }
    free(sizes);
    return r;
}

static int build(struct sh_pool *pool, size_t size, int path, struct region **out)
{
    struct region *r = sh_pool_region_new(pool, round_up(size, pool->p.granularity));
    if (!r)
        return SH_ENOMEM;
    r->size = size;
    r->path = path;
    int rc = sh_vaarena_alloc(pool->va, r->mapped, pool->p.granularity, &r->va);
    if (rc) {
        free(r);
        return rc;
    }
    unsigned n = r->nchunks;
    for (unsigned i = 0; i < n; i++) {
        struct chunk *c = &r->chunks[i];
        rc = get_chunk(pool, c->size, &c->handle);
        if (rc == 0)
            rc = pool->vmm.map(pool->vmm.ctx, r->va + c->off, c->size, c->handle);
        if (rc) {
            unbuild(pool, r, i);
            return rc;
        }
        __atomic_add_fetch(&pool->st.vmm_maps, 1, __ATOMIC_RELAXED);
    }
    *out = r;
    return 0;
}

/* Removes a freed region from the index and releases its backing. Its
 * fence is waited for first: the device may still be using the memory. */
static void teardown(struct sh_pool *pool, struct region *r)
{
    if (r->fence) {
        pool->fences.wait(pool->fences.ctx, r->fence);
        fence_drop(pool, r->fence);
    }
    sh_rw_wrlock(&pool->index_lock);
    sh_rindex_remove(pool->index, r->va, NULL);
    sh_rw_unlock(&pool->index_lock);
    sh_state_move(&r->state, SH_RS_DEAD, r->id);
    unbuild(pool, r, r->nchunks);
}

/* A torn-down region's chunks go to the chunk cache, which is still device
 * memory: only what leaves the cache counts. Spare chunks go first, so the
 * cache has room for the chunks of each region torn down after them. */
size_t sh_pool_trim(struct sh_pool *pool, size_t bytes)
{
    size_t done = sh_chunkcache_trim(pool->cc, bytes);
    while (done < bytes) {
        pthread_mutex_lock(&pool->mu);
        struct region *r = pool->lru_head;
        if (r) {
            freed_unlink(pool, r);
            pool->st.regions[SH_RS_FREED]--;
        }
        pthread_mutex_unlock(&pool->mu);
        if (!r)
            break;
        teardown(pool, r);
        done += sh_chunkcache_trim(pool->cc, bytes - done);
    }
    return done;
}

/* ---- the sub-allocator's slabs are regions that are never freed by users ---- */

static int region_alloc(struct sh_pool *pool, size_t size, int path, uint64_t stream,
                        uintptr_t *va);

static int slab_get(void *ctx, size_t bytes, uintptr_t *base)
{
    return region_alloc(ctx, bytes, SH_PATH_SLAB, NO_STREAM, base);
}

static void slab_put(void *ctx, uintptr_t base, size_t bytes)
{
    (void)bytes;
    sh_pool_free(ctx, base, NO_STREAM, 0);
}

static int sa_fence_done(void *ctx, uint64_t fence)
{
    return fence_done(ctx, fence);
}

static void sa_fence_drop(void *ctx, uint64_t fence)
{
    struct sh_pool *pool = ctx;
    /* pool->sa is NULL only while destroy tears the sub-allocator down: it
     * drops the fences of blocks still pending, then hands back their slabs
     * to be unmapped, so the work behind them must be done first. No other
     * thread is in the pool by then; waiting under its lock blocks no one. */
    if (!pool->sa && !fence_done(pool, fence))
        pool->fences.wait(pool->fences.ctx, fence);
    fence_drop(pool, fence);
}

/* ---- the API ---- */

int sh_pool_create(const struct sh_pool_params *p, const struct sh_vmm_ops *vmm,
                   const struct sh_fence_ops *fences, struct sh_pool **out)
{
    if (!p || !vmm || !fences || !out || p->granularity == 0 ||
        (p->granularity & (p->granularity - 1)) || p->max_chunk < p->granularity ||
        (p->max_chunk & (p->max_chunk - 1)))
        return SH_EINVAL;
    struct sh_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return SH_ENOMEM;
    pool->p = *p;
    pool->vmm = *vmm;
    pool->fences = *fences;
    pool->next_id = 1;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_mutex_init(&pool->move_mu, NULL);
    sh_rw_init(&pool->index_lock);
    pthread_mutex_init(&pool->strand_mu, NULL);
    pthread_mutex_init(&pool->scan.mu, NULL);
    pthread_cond_init(&pool->scan.cv, NULL);
    struct sh_vmm_ops chunk_ops;
    sh_pool_chunk_ops(pool, &chunk_ops);
    struct sh_suballoc_ops sops = {pool, slab_get, slab_put, sa_fence_done, sa_fence_drop};
    /* One empty slab kept per class: a block freed and allocated again
     * must not cost a slab (VMM calls) each time. */
    struct sh_suballoc_config scfg = {.max_block = p->suballoc_max, .keep_empty = 1};
    int rc = sh_rindex_create(&pool->index);
    if (!rc)
        rc = sh_vaarena_create(&pool->vmm, p->granularity, p->va_block, p->va_cache, &pool->va);
    if (!rc)
        rc = sh_chunkcache_create(&chunk_ops, p->granularity, p->device_cache, &pool->cc);
    if (!rc && p->suballoc_max)
        rc = sh_suballoc_create(&sops, &scfg, &pool->sa);
    if (rc) {
        sh_pool_destroy(pool);
        return rc;
    }
    *out = pool;
    return 0;
}

static int teardown_visit(void *arg, uintptr_t start, size_t len, void *payload)
{
    (void)start;
    (void)len;
    struct region **list = arg;
    struct region *r = payload;
    r->lru_next = *list; /* reuse the link: nothing else looks at it now */
    *list = r;
    return 0;
}

void sh_pool_destroy(struct sh_pool *pool)
{
    if (!pool)
        return;
    sh_pool_scan_stop(pool); /* a scan still queued runs on whoever settles it */
    if (pool->mover.xfer) {
        sh_pool_prefetch_cancel_all(pool); /* scratch mappings go before the chunks */
        sh_pool_evict_cancel_all(pool);    /* no copy lands in a slab given back */
    }
    if (pool->sa) {
        /* Its slabs come back through slab_put as it goes: they are freed as
         * regions, not looked up in the sub-allocator being destroyed. */
        struct sh_suballoc *sa = pool->sa;
        pool->sa = NULL;
        sh_suballoc_destroy(sa);
    }
    struct region *all = NULL;
    if (pool->index) {
        sh_rindex_foreach(pool->index, teardown_visit, &all);
        while (all) {
            struct region *next = all->lru_next;
            if (all->fence)
                pool->fences.wait(pool->fences.ctx, all->fence);
            fence_drop(pool, all->fence);
            sh_rindex_remove(pool->index, all->va, NULL);
            unbuild(pool, all, all->nchunks);
            all = next;
        }
        sh_rindex_destroy(pool->index);
    }
    if (pool->cc)
        sh_chunkcache_destroy(pool->cc);
    if (pool->va)
        sh_vaarena_destroy(pool->va);
    sh_rw_destroy(&pool->index_lock);
    pthread_mutex_destroy(&pool->strand_mu);
    pthread_cond_destroy(&pool->scan.cv);
    pthread_mutex_destroy(&pool->scan.mu);
    free(pool->stranded);
    pthread_mutex_destroy(&pool->move_mu);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* Paths whose allocations a memory pool would hold (usage.c). */
static int stream_ordered(int path)
{
    return path == SH_PATH_ASYNC || path == SH_PATH_PLUGGABLE;
}

/* A new allocation is for the launches about to come: as recent as the last
 * use, not the oldest region in the pool (a built region's age was 0, a
 * reused one's its old owner's), which the LRU would evict first. */
static void fresh_use(struct sh_pool *pool, struct region *r)
{
    __atomic_store_n(&r->last_use, __atomic_load_n(&pool->clock, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&r->last_use_us, sh_clock_us(), __ATOMIC_RELAXED);
}

static int region_alloc(struct sh_pool *pool, size_t size, int path, uint64_t stream, uintptr_t *va)
{
    size_t mapped = round_up(size, pool->p.granularity);
    pthread_mutex_lock(&pool->mu);
    struct region *r = freed_take(pool, mapped, stream);
    if (r) {
        fence_drop(pool, r->fence);
        r->fence = 0;
        /* Lookups read these under the index lock alone. */
        sh_rw_wrlock(&pool->index_lock);
        r->size = size;
        r->path = path;
        r->evictions_at_alloc = r->evictions;
        r->restores_at_alloc = r->restores;
        r->unchanged_at_alloc = r->unchanged;
        sh_rw_unlock(&pool->index_lock);
        fresh_use(pool, r);
        /* The old owner's pointer tables are not the new one's. */
        __atomic_store_n(&r->holds_ptrs, 0, __ATOMIC_RELAXED);
        sh_state_move(&r->state, SH_RS_RESIDENT, r->id);
        pool->st.regions[SH_RS_FREED]--;
        pool->st.regions[SH_RS_RESIDENT]++;
        pool->st.slabs += path == SH_PATH_SLAB;
        pool->st.live_bytes += size;
        pool->st.reuses++;
        pool->st.allocs++;
        pthread_mutex_unlock(&pool->mu);
        *va = r->va;
        return 0;
    }
    pthread_mutex_unlock(&pool->mu);
    int rc = build(pool, size, path, &r);
    if (rc)
        return rc;
    /* Complete before a lookup can find it. */
    pthread_mutex_lock(&pool->mu);
    r->id = pool->next_id++;
    r->state = SH_RS_RESIDENT;
    fresh_use(pool, r);
    sh_rw_wrlock(&pool->index_lock);
    rc = sh_rindex_insert(pool->index, r->va, r->mapped, r);
    sh_rw_unlock(&pool->index_lock);
    if (rc == 0) {
        sh_pool_note_bounds(pool, r); /* for sh_pool_find_pointers' quick test */
        pool->st.regions[SH_RS_RESIDENT]++;
        pool->st.slabs += path == SH_PATH_SLAB;
        pool->st.live_bytes += size;
        pool->st.allocs++;
    }
    pthread_mutex_unlock(&pool->mu);
    if (rc) {
        unbuild(pool, r, r->nchunks);
        return rc;
    }
    *va = r->va;
    return 0;
}

int sh_pool_alloc(struct sh_pool *pool, size_t size, int path, uint64_t stream, uintptr_t *va)
{
    if (!pool || !va || size == 0)
        return SH_EINVAL;
    if (path == SH_PATH_MALLOC)
        stream = NO_STREAM; /* usable from any stream: reuse only what is done */
    if (pool->sa && path != SH_PATH_MALLOC && size <= pool->p.suballoc_max) {
        int rc = sh_suballoc_alloc(pool->sa, size, stream, va);
        if (rc == 0) {
            __atomic_add_fetch(&pool->st.small_allocs, 1, __ATOMIC_RELAXED);
            sh_pool_usage_add(pool, sh_suballoc_class_bytes(pool->sa, size));
        }
        return rc;
    }
    int rc = region_alloc(pool, size, path, stream, va);
    if (rc == 0 && stream_ordered(path))
        sh_pool_usage_add(pool, size);
    return rc;
}

/* Keeps freed regions and spare chunks together within device_cache:
 * the oldest freed regions go first (their chunks join the spares), then
 * the spares, which only save a cuMemCreate. */
static void enforce_cache_limit(struct sh_pool *pool)
{
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        struct region *r = pool->st.freed_bytes > pool->p.device_cache ? pool->lru_head : NULL;
        if (r) {
            freed_unlink(pool, r);
            pool->st.regions[SH_RS_FREED]--;
        }
        size_t freed = pool->st.freed_bytes;
        pthread_mutex_unlock(&pool->mu);
        if (!r) {
            struct sh_chunkcache_stats cs;
            sh_chunkcache_stats(pool->cc, &cs);
            if (freed + cs.cached_bytes > pool->p.device_cache)
                sh_chunkcache_trim(pool->cc, freed + cs.cached_bytes - pool->p.device_cache);
            return;
        }
        teardown(pool, r);
    }
}

int sh_pool_range(struct sh_pool *pool, uintptr_t addr, uintptr_t *base, size_t *size)
{
    if (pool->sa && sh_suballoc_block_of(pool->sa, addr, base, size) == 0)
        return 0;
    struct sh_region_info ri;
    if (sh_pool_lookup(pool, addr, &ri) != 0 || ri.path == SH_PATH_SLAB ||
        ri.state == SH_RS_FREED || addr - ri.va >= ri.size)
        return SH_ENOTFOUND;
    *base = ri.va;
    *size = ri.size;
    return 0;
}

/* mu held (and again on return): a move of r in flight is cancelled, one
 * in a window waited out, so r is RESIDENT, HOST or FREED. The caller
 * holds r (the program has not freed it), so it cannot go meanwhile. */
static void settle(struct sh_pool *pool, struct region *r)
{
    while (r->state == SH_RS_EVICTING || r->state == SH_RS_RESTORING) {
        if (sh_pool_move_take(pool, r)) {
            /* A prefetch or early eviction in flight lasts beyond any
             * move_mu section: cancel it (back to HOST on its slabs, or
             * RESIDENT), then go on with it as such. */
            pthread_mutex_unlock(&pool->mu);
            sh_pool_move_cancel(pool, r);
            pthread_mutex_lock(&pool->mu);
            continue;
        }
        /* Its backing is moving: moves run whole under move_mu, so wait it out. */
        pthread_mutex_unlock(&pool->mu);
        pthread_mutex_lock(&pool->move_mu);
        pthread_mutex_unlock(&pool->move_mu);
        pthread_mutex_lock(&pool->mu);
    }
}

int sh_pool_pin(struct sh_pool *pool, uintptr_t addr)
{
    int rc = SH_ENOTFOUND;
    struct sh_slab *kept = NULL;
    pthread_mutex_lock(&pool->mu);
    sh_rw_rdlock(&pool->index_lock);
    struct region *r = sh_rindex_lookup(pool->index, addr);
    sh_rw_unlock(&pool->index_lock);
    if (r && r->path != SH_PATH_SLAB) {
        settle(pool, r); /* an early eviction in flight is called off */
        rc = r->pinned ? 0 : r->state == SH_RS_RESIDENT && !r->stuck ? 1 : SH_EBUSY;
        if (rc == 1) {
            __atomic_store_n(&r->pinned, 1, __ATOMIC_RELAXED);
            pool->st.pinned++;
            kept = sh_pool_kept_detach(pool, r); /* it never moves again */
            rc = 0;
        }
    }
    pthread_mutex_unlock(&pool->mu);
    sh_pool_kept_put(pool, kept);
    return rc;
}

int sh_pool_free(struct sh_pool *pool, uintptr_t va, uint64_t stream, uint64_t fence)
{
    if (!pool)
        return SH_EINVAL;
    if (pool->sa && sh_suballoc_owns(pool->sa, va)) {
        size_t bytes = 0;
        int rc = sh_suballoc_free_sized(pool->sa, va, stream, fence, &bytes);
        if (rc == 0) {
            __atomic_add_fetch(&pool->st.small_frees, 1, __ATOMIC_RELAXED);
            sh_pool_usage_sub(pool, bytes);
        }
        return rc;
    }
    sh_rw_rdlock(&pool->index_lock);
    uintptr_t start = 0;
    struct region *r = NULL;
    int found = sh_rindex_find(pool->index, va, &start, NULL, (void **)&r) == 0 && start == va &&
                r->path != SH_PATH_VMM; /* the program unmaps those itself */
    sh_rw_unlock(&pool->index_lock);
    if (!found)
        return SH_ENOTFOUND;
    pthread_mutex_lock(&pool->mu);
    settle(pool, r);
    if (r->state == SH_RS_FREED) { /* the caller's double free, not our bug */
        pthread_mutex_unlock(&pool->mu);
        return SH_EINVAL;
    }
    int from = r->state, drop = from == SH_RS_HOST || r->pinned; /* torn down at once */
    size_t held = stream_ordered(r->path) ? r->size : 0;
    int rc = sh_state_move(&r->state, SH_RS_FREED, r->id);
    struct sh_slab *kept = NULL;
    if (rc == 0) {
        kept = sh_pool_kept_detach(pool, r);   /* freed regions are never copied */
        r->learn = (struct sh_clean_learn){0}; /* the next allocation is another tensor */
        r->stream = stream;
        r->fence = fence;
        pool->st.regions[from]--;
        pool->st.slabs -= r->path == SH_PATH_SLAB;
        pool->st.live_bytes -= r->size;
        pool->st.frees++;
        if (from == SH_RS_HOST) {
            sh_bytes_sub(&pool->st.host_bytes,
                         r->mapped); /* host-backed: drop it, never copy it back */
        } else if (r->pinned) {
            pool->st.pinned--; /* torn down now: never reused */
        } else {
            pool->st.regions[SH_RS_FREED]++;
            freed_push(pool, r);
        }
    }
    pthread_mutex_unlock(&pool->mu);
    sh_pool_kept_put(pool, kept);
    if (rc == 0)
        sh_pool_usage_sub(pool, held);
    if (rc == 0 && from == SH_RS_HOST)
        sh_pool_scan_settle(pool, r, 0); /* its slabs go: nothing may still read them */
    /* Once on the freed list, r may be torn down by another thread at once. */
    if (rc == 0 && drop)
        teardown(pool, r);
    else if (rc == 0)
        enforce_cache_limit(pool);
    return rc;
}

int sh_pool_lookup(struct sh_pool *pool, uintptr_t addr, struct sh_region_info *out)
{
    sh_rw_rdlock(&pool->index_lock);
    struct region *r = sh_rindex_lookup(pool->index, addr);
    if (r && out)
        *out = (struct sh_region_info){
            r->va,
            r->size,
            r->mapped,
            r->id,
            __atomic_load_n(&r->state, __ATOMIC_RELAXED),
            r->path,
            r->nchunks,
            __atomic_load_n(&r->evictions, __ATOMIC_RELAXED) - r->evictions_at_alloc,
            __atomic_load_n(&r->restores, __ATOMIC_RELAXED) - r->restores_at_alloc,
            __atomic_load_n(&r->unchanged, __ATOMIC_RELAXED) - r->unchanged_at_alloc};
    sh_rw_unlock(&pool->index_lock);
    return r ? 0 : SH_ENOTFOUND;
}

void sh_pool_bytes(struct sh_pool *pool, size_t *device, size_t *host)
{
    *host = __atomic_load_n(&pool->st.host_bytes, __ATOMIC_RELAXED);
    *device = sh_chunkcache_device_bytes(pool->cc);
}

void sh_pool_stats(struct sh_pool *pool, struct sh_pool_stats *st)
{
    struct sh_chunkcache_stats cs;
    sh_chunkcache_stats(pool->cc, &cs);
    /* vmm_maps .. small_frees and the times from drain_ns on are bumped
     * with atomics outside mu: they are read with atomics; everything else
     * is copied under mu. */
    _Static_assert(offsetof(struct sh_pool_stats, small_frees) ==
                       offsetof(struct sh_pool_stats, vmm_maps) + 3 * sizeof(uint64_t),
                   "the atomic counters are contiguous");
    const size_t lo = offsetof(struct sh_pool_stats, vmm_maps);
    const size_t hi = offsetof(struct sh_pool_stats, small_frees) + sizeof(uint64_t);
    const size_t times = offsetof(struct sh_pool_stats, drain_ns);
    _Static_assert(offsetof(struct sh_pool_stats, scanned_bytes) + sizeof(uint64_t) ==
                       sizeof(struct sh_pool_stats),
                   "the times are last");
    pthread_mutex_lock(&pool->mu);
    memcpy(st, &pool->st, lo);
    memcpy((char *)st + hi, (const char *)&pool->st + hi, times - hi);
    pthread_mutex_unlock(&pool->mu);
    st->drain_ns = __atomic_load_n(&pool->st.drain_ns, __ATOMIC_RELAXED);
    st->copy_wait_ns = __atomic_load_n(&pool->st.copy_wait_ns, __ATOMIC_RELAXED);
    st->remap_ns = __atomic_load_n(&pool->st.remap_ns, __ATOMIC_RELAXED);
    st->scan_ns = __atomic_load_n(&pool->st.scan_ns, __ATOMIC_RELAXED);
    st->scan_wait_ns = __atomic_load_n(&pool->st.scan_wait_ns, __ATOMIC_RELAXED);
    st->fingerprint_ns = __atomic_load_n(&pool->st.fingerprint_ns, __ATOMIC_RELAXED);
    st->fingerprint_start_ns = __atomic_load_n(&pool->st.fingerprint_start_ns, __ATOMIC_RELAXED);
    st->prefilter_ns = __atomic_load_n(&pool->st.prefilter_ns, __ATOMIC_RELAXED);
    st->scanned_bytes = __atomic_load_n(&pool->st.scanned_bytes, __ATOMIC_RELAXED);
    st->vmm_maps = __atomic_load_n(&pool->st.vmm_maps, __ATOMIC_RELAXED);
    st->vmm_unmaps = __atomic_load_n(&pool->st.vmm_unmaps, __ATOMIC_RELAXED);
    st->small_allocs = __atomic_load_n(&pool->st.small_allocs, __ATOMIC_RELAXED);
    st->small_frees = __atomic_load_n(&pool->st.small_frees, __ATOMIC_RELAXED);
    st->device_bytes = cs.device_bytes;
    pthread_mutex_lock(&pool->scan.mu);
    st->scans_queued = pool->scan.queued;
    st->scans_settled = pool->scan.settled;
    st->scans_skipped = pool->scan.skipped;
    st->prefilters = pool->scan.prefilters;
    pthread_mutex_unlock(&pool->scan.mu);
}
