/* adopt.c — memory the program maps itself: backings (pool.h).
 *
 * A backing is a region that is not always indexed: built like any region
 * from the chunk cache, but with no VA of its own. While the program maps it
 * it is indexed at the program's address, path SH_PATH_VMM, and eviction,
 * restore, prefetch and pinning treat it like any other region. Unmapped,
 * it keeps its chunks or, if it was evicted, its slabs, so the bytes
 * survive as they would on a CUDA handle.
 *
 * Locking: as region.c's. vmm_mapped and vmm_refs change under
 * pool->mu. An unmap takes move_mu first, so no batch of moves holds the
 * region while it leaves the index: every move picks its regions from the
 * index under move_mu. VMM calls run with no pool lock held.
 */
#include "pool/region_int.h"

#include "sh_err.h"
#include "sh_log.h"

#include <stdlib.h>

/* A backing is its region; the name keeps the program's handles apart
 * from the pool's regions in the API. */
static struct region *region_of(struct sh_backing *b)
{
    return (struct region *)(void *)b;
}

size_t sh_pool_backing_size(const struct sh_backing *b)
{
    return ((const struct region *)(const void *)b)->mapped;
}

/* Chunks for every piece of r, trimming the caches once if the device is
 * full: cached memory is free memory to the program. */
static int take_chunks(struct sh_pool *pool, struct region *r)
{
    int rc = sh_pool_get_chunks(pool, r);
    if (rc == SH_ENOMEM && sh_pool_trim(pool, r->mapped) > 0)
        rc = sh_pool_get_chunks(pool, r);
    return rc;
}

int sh_pool_backing_create(struct sh_pool *pool, size_t size, struct sh_backing **out)
{
    if (!pool || !out || size == 0 || size % pool->p.granularity)
        return SH_EINVAL;
    struct region *r = sh_pool_region_new(pool, size);
    if (!r)
        return SH_ENOMEM;
    r->size = size;
    r->path = SH_PATH_VMM;
    int rc = take_chunks(pool, r);
    if (rc) {
        free(r);
        return rc;
    }
    pthread_mutex_lock(&pool->mu);
    r->id = pool->next_id++;
    r->state = SH_RS_RESIDENT;
    r->vmm_refs = 1;
    pool->st.live_bytes += size;
    pool->st.allocs++;
    pthread_mutex_unlock(&pool->mu);
    *out = (struct sh_backing *)(void *)r;
    return 0;
}

/* Unmaps chunks [0, n) of r at va; a chunk that cannot be unmapped is
 * reported: its backing stays where it is, never reused. */
static int unmap_chunks(struct sh_pool *pool, struct region *r, uintptr_t va, unsigned n)
{
    int rc = 0;
    for (unsigned i = 0; i < n; i++) {
        const struct chunk *c = &r->chunks[i];
        if (__atomic_load_n(&c->hole, __ATOMIC_ACQUIRE))
            continue; /* nothing is mapped there */
        if (sh_pool_unmap(pool, va + c->off, c->size) != 0)
            rc = SH_EDRIVER;
    }
    return rc;
}

int sh_pool_backing_map(struct sh_pool *pool, struct sh_backing *b, uintptr_t va)
{
    struct region *r = region_of(b);
    pthread_mutex_lock(&pool->mu);
    int busy = r->vmm_mapped || r->vmm_refs == 0 || r->stuck;
    if (!busy)
        r->vmm_mapped = 1; /* claimed: a second map of it is refused meanwhile */
    pthread_mutex_unlock(&pool->mu);
    if (busy)
        return SH_EBUSY;
    int rc = 0;
    unsigned done = 0;
    for (; done < r->nchunks; done++) {
        const struct chunk *c = &r->chunks[done];
        /* Resident: its device chunk; evicted while unmapped: its slab. */
        rc = pool->vmm.map(pool->vmm.ctx, va + c->off, c->size,
                           c->handle ? c->handle : c->slab->handle);
        if (rc)
            break;
        __atomic_add_fetch(&pool->st.vmm_maps, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&pool->mu);
    if (rc == 0) {
        r->va = va;
        sh_rw_wrlock(&pool->index_lock);
        rc = sh_rindex_insert(pool->index, va, r->mapped, r);
        sh_rw_unlock(&pool->index_lock);
    }
    if (rc == 0) {
        sh_pool_note_bounds(pool, r);
        pool->st.regions[r->state]++;
    } else {
        r->vmm_mapped = 0;
        r->va = 0;
    }
    pthread_mutex_unlock(&pool->mu);
    if (rc)
        unmap_chunks(pool, r, va, done);
    return rc;
}

/* The program's handle and every mapping are gone: the chunks go back to
 * the cache (never to another region once pinned: a peer may hold them),
 * the slabs to the host pool. */
static void backing_free(struct sh_pool *pool, struct region *r)
{
    sh_pool_scan_settle(pool, r, 0); /* its slabs go: nothing may still read them */
    pthread_mutex_lock(&pool->mu);
    pool->st.live_bytes -= r->size;
    pool->st.frees++;
    if (r->state == SH_RS_HOST)
        sh_bytes_sub(&pool->st.host_bytes, r->mapped);
    if (r->pinned)
        pool->st.pinned--;
    pthread_mutex_unlock(&pool->mu);
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        if (c->handle && r->pinned)
            sh_chunkcache_drop(pool->cc, c->handle, c->size);
        else if (c->handle)
            sh_chunkcache_put(pool->cc, c->handle, c->size);
        if (c->slab)
            sh_hostpool_put(pool->mover.host, c->slab);
        if (c->kept)
            sh_hostpool_put(pool->mover.host, c->kept);
    }
    free(r);
}

int sh_pool_backing_unmap(struct sh_pool *pool, uintptr_t va)
{
    pthread_mutex_lock(&pool->move_mu); /* no batch of moves holds it from here */
    pthread_mutex_lock(&pool->mu);
    sh_rw_rdlock(&pool->index_lock);
    struct region *r = sh_rindex_lookup(pool->index, va);
    sh_rw_unlock(&pool->index_lock);
    if (!r || r->va != va || r->path != SH_PATH_VMM) {
        pthread_mutex_unlock(&pool->mu);
        pthread_mutex_unlock(&pool->move_mu);
        return SH_ENOTFOUND;
    }
    /* Windows run under move_mu: only a prefetch or an early eviction in
     * flight can still be moving it. Called off, it is RESIDENT or HOST. */
    while (sh_pool_move_take(pool, r)) {
        pthread_mutex_unlock(&pool->mu);
        sh_pool_move_cancel(pool, r);
        pthread_mutex_lock(&pool->mu);
    }
    sh_rw_wrlock(&pool->index_lock);
    sh_rindex_remove(pool->index, va, NULL);
    sh_rw_unlock(&pool->index_lock);
    pool->st.regions[r->state]--;
    struct sh_slab *kept = sh_pool_kept_detach(pool, r); /* unmapped, it is not evicted */
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->move_mu);
    sh_pool_kept_put(pool, kept);
    if (unmap_chunks(pool, r, va, r->nchunks) != 0)
        sh_log(SH_LOG_ERROR,
               "cannot unmap the program's mapping at 0x%llx (%zu bytes): its memory stays "
               "there",
               (unsigned long long)va, r->mapped);
    pthread_mutex_lock(&pool->mu);
    r->vmm_mapped = 0;
    r->va = 0;
    int gone = r->vmm_refs == 0;
    pthread_mutex_unlock(&pool->mu);
    if (gone)
        backing_free(pool, r);
    return 0;
}

int sh_pool_backing_release(struct sh_pool *pool, struct sh_backing *b)
{
    struct region *r = region_of(b);
    pthread_mutex_lock(&pool->mu);
    if (r->vmm_refs == 0) {
        pthread_mutex_unlock(&pool->mu);
        return SH_EINVAL;
    }
    int last = --r->vmm_refs == 0, gone = last && !r->vmm_mapped;
    pthread_mutex_unlock(&pool->mu);
    if (gone)
        backing_free(pool, r);
    return last;
}

struct sh_backing *sh_pool_backing_retain(struct sh_pool *pool, uintptr_t addr)
{
    pthread_mutex_lock(&pool->mu); /* the backing cannot be freed meanwhile */
    sh_rw_rdlock(&pool->index_lock);
    struct region *r = sh_rindex_lookup(pool->index, addr);
    sh_rw_unlock(&pool->index_lock);
    if (r && r->path == SH_PATH_VMM)
        r->vmm_refs++;
    else
        r = NULL;
    pthread_mutex_unlock(&pool->mu);
    return (struct sh_backing *)(void *)r;
}

struct in_range {
    uintptr_t lo, hi;
    uintptr_t *va;
    size_t *size, max, n;
    int other;
};

static int visit_in_range(void *arg, uintptr_t start, size_t len, void *payload)
{
    struct in_range *q = arg;
    const struct region *r = payload;
    if (start >= q->hi)
        return 1; /* in address order: nothing further meets it */
    if (start + len <= q->lo)
        return 0;
    if (r->path != SH_PATH_VMM) {
        q->other = 1;
        return 0;
    }
    if (q->n < q->max) {
        q->va[q->n] = start;
        q->size[q->n] = len;
    }
    q->n++;
    return 0;
}

size_t sh_pool_backings_in(struct sh_pool *pool, uintptr_t lo, uintptr_t hi, uintptr_t *va,
                           size_t *size, size_t max, int *other)
{
    struct in_range q = {lo, hi, va, size, max, 0, 0};
    sh_rw_rdlock(&pool->index_lock);
    sh_rindex_foreach(pool->index, visit_in_range, &q);
    sh_rw_unlock(&pool->index_lock);
    if (other)
        *other = q.other;
    return q.n;
}
