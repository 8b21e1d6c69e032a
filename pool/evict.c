/* evict.c — moving a region's backing between device chunks and host slabs
 * without changing its address.
 *
 * Eviction: copy each chunk device -> host slab, then in the remap window
 * unmap the device handle and map the slab at the same address. Restore: in
 * the window, unmap the slab, map a device chunk, copy host -> device. Both
 * run inside the window after a drain, so no kernel — seen by the launch
 * scan or not — touches the range while its bytes are in transit or while
 * it is unmapped: the invariant of DESIGN.md §2 holds by construction.
 *
 * Locking: pool->move_mu serialises batches; states move under pool->mu;
 * chunk handles and slabs change only between EVICTING/RESTORING and the
 * state that ends them, so nobody else reads them meanwhile.
 */
#include "pool/region_int.h"

#include "sh_err.h"
#include "sh_log.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

void sh_pool_set_mover(struct sh_pool *pool, const struct sh_pool_mover *m)
{
    pthread_mutex_lock(&pool->mu);
    pool->mover = *m;
    pthread_mutex_unlock(&pool->mu);
}

/* ---- choosing victims ---- */

struct candidates {
    struct region **r;
    size_t n, cap;
    const uintptr_t *protect;
    size_t np;
};

static int protected_region(const struct candidates *c, const struct region *r)
{
    for (size_t i = 0; i < c->np; i++)
        if (c->protect[i] - r->va < r->mapped)
            return 1;
    return 0;
}

static int collect(void *arg, uintptr_t start, size_t len, void *payload)
{
    (void)start;
    (void)len;
    struct candidates *c = arg;
    struct region *r = payload;
    if (__atomic_load_n(&r->state, __ATOMIC_RELAXED) != SH_RS_RESIDENT || r->path == SH_PATH_SLAB ||
        protected_region(c, r))
        return 0;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        struct region **t = realloc(c->r, cap * sizeof *t);
        if (!t)
            return 1;
        c->r = t;
        c->cap = cap;
    }
    c->r[c->n++] = r;
    return 0;
}

static int by_last_use(const void *a, const void *b)
{
    const struct region *x = *(struct region *const *)a, *y = *(struct region *const *)b;
    return x->last_use < y->last_use ? -1 : x->last_use > y->last_use;
}

/* Least recently used first; the choice the learned scheduler replaces. */
static size_t pick_victims(struct sh_pool *pool, size_t need, struct candidates *c)
{
    pthread_rwlock_rdlock(&pool->index_lock);
    sh_rindex_foreach(pool->index, collect, c);
    pthread_rwlock_unlock(&pool->index_lock);
    qsort(c->r, c->n, sizeof *c->r, by_last_use);
    size_t n = 0, bytes = 0;
    pthread_mutex_lock(&pool->mu);
    for (size_t i = 0; i < c->n && bytes < need; i++)
        if (sh_state_move_from(&c->r[i]->state, SH_RS_RESIDENT, SH_RS_EVICTING, c->r[i]->id) == 0) {
            pool->st.regions[SH_RS_RESIDENT]--;
            pool->st.regions[SH_RS_EVICTING]++;
            c->r[n++] = c->r[i];
            bytes += c->r[i]->mapped;
        }
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* ---- slabs and states ---- */

static void give_back_slabs(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++)
        if (r->chunks[i].slab && r->chunks[i].handle) {
            sh_hostpool_put(pool->mover.host, r->chunks[i].slab);
            r->chunks[i].slab = NULL;
        }
}

static int get_slabs(struct sh_pool *pool, struct region *r, unsigned wait_ms)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        int rc = sh_hostpool_get(pool->mover.host, c->size, wait_ms, &c->slab);
        if (rc) {
            give_back_slabs(pool, r);
            return rc;
        }
    }
    return 0;
}

static void finish_state(struct sh_pool *pool, struct region *r, int to)
{
    pthread_mutex_lock(&pool->mu);
    int from = r->state;
    sh_state_move(&r->state, to, r->id);
    pool->st.regions[from]--;
    pool->st.regions[to]++;
    pthread_mutex_unlock(&pool->mu);
}

static uint32_t crc_of(const struct chunk *c)
{
    return (uint32_t)crc32(0, (const unsigned char *)c->slab->staging, (uInt)c->size);
}

/* ---- eviction ---- */

/* Swaps one chunk's mapping at the region address; on failure puts the old
 * handle back, so the range is never left unmapped. */
static int remap(struct sh_pool *pool, uintptr_t va, size_t size, uint64_t from, uint64_t to)
{
    int rc = pool->vmm.unmap(pool->vmm.ctx, va, size);
    if (rc)
        return rc;
    rc = pool->vmm.map(pool->vmm.ctx, va, size, to);
    if (rc && pool->vmm.map(pool->vmm.ctx, va, size, from) != 0)
        sh_log(SH_LOG_ERROR, "cannot map 0x%llx back after a failed remap: its contents are lost",
               (unsigned long long)va);
    __atomic_add_fetch(&pool->st.vmm_unmaps, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pool->st.vmm_maps, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Copies and remaps a batch of EVICTING regions; the gate is held. Returns
 * how many of them (a prefix) completed; the rest are left device-mapped,
 * whole: their slabs go back to the pool, so none may stay mapped. */
static size_t evict_window(struct sh_pool *pool, struct region **v, size_t n)
{
    struct sh_xfer *x = pool->mover.xfer;
    if (sh_xfer_drain(x) != 0)
        return 0;
    for (size_t k = 0; k < n; k++)
        for (unsigned i = 0; i < v[k]->nchunks; i++) {
            struct chunk *c = &v[k]->chunks[i];
            if (sh_xfer_copy(x, SH_D2H, c->slab->staging, v[k]->va + c->off, c->size) != 0) {
                sh_xfer_flush(x, SH_D2H); /* nothing lands in a slab after it went back */
                return 0;
            }
        }
    if (sh_xfer_flush(x, SH_D2H) != 0)
        return 0;
    for (size_t k = 0; k < n; k++)
        for (unsigned i = 0; i < v[k]->nchunks; i++) {
            struct chunk *c = &v[k]->chunks[i];
            if (pool->mover.checksums)
                c->crc = crc_of(c);
            if (remap(pool, v[k]->va + c->off, c->size, c->handle, c->slab->handle) != 0) {
                /* The device handles still hold the bytes: nothing ran since the copy. */
                while (i-- > 0) {
                    c = &v[k]->chunks[i];
                    remap(pool, v[k]->va + c->off, c->size, c->slab->handle, c->handle);
                }
                return k;
            }
        }
    return n;
}

static void evicted_one(struct sh_pool *pool, struct region *r, size_t *released)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        sh_chunkcache_put(pool->cc, r->chunks[i].handle, r->chunks[i].size);
        r->chunks[i].handle = 0;
    }
    *released += r->mapped;
    pthread_mutex_lock(&pool->mu);
    pool->st.evictions++;
    pool->st.evicted_bytes += r->mapped;
    pool->st.host_bytes += r->mapped;
    pthread_mutex_unlock(&pool->mu);
    finish_state(pool, r, SH_RS_HOST);
}

/* Copies and remaps a batch of EVICTING regions; move_mu held. Regions
 * that could not go return to RESIDENT. Adds the bytes released. */
static void evict_batch(struct sh_pool *pool, struct candidates *c, size_t n, size_t *released,
                        uintptr_t *evicted, size_t *nevicted)
{
    size_t ready = 0;
    unsigned wait_ms = pool->mover.slab_wait_ms;
    for (size_t k = 0; k < n; k++) {
        if (get_slabs(pool, c->r[k], wait_ms) == 0) {
            c->r[ready++] = c->r[k];
        } else {
            /* No slabs for its chunk sizes: it stays, the others may still go,
             * with what the host pool has now. */
            finish_state(pool, c->r[k], SH_RS_RESIDENT);
            wait_ms = 0;
        }
    }
    size_t done = 0;
    if (ready && sh_gate_lock(pool->mover.gate) == 0) {
        done = evict_window(pool, c->r, ready);
        sh_gate_unlock(pool->mover.gate);
    }
    for (size_t k = 0; k < ready; k++) {
        if (k < done) {
            if (evicted)
                evicted[(*nevicted)++] = c->r[k]->va;
            evicted_one(pool, c->r[k], released);
        } else {
            give_back_slabs(pool, c->r[k]);
            finish_state(pool, c->r[k], SH_RS_RESIDENT);
        }
    }
}

/* 1 when this caller may open a remap window now. A caller issuing work
 * (holding the gate) cannot; it must not wait for move_mu either: its
 * holder may be waiting for the gate. */
static int can_move(struct sh_pool *pool)
{
    return pool->mover.xfer && !sh_gate_held(pool->mover.gate);
}

int sh_pool_evict(struct sh_pool *pool, size_t need, const uintptr_t *protect, size_t np,
                  size_t *released)
{
    *released = sh_pool_trim(pool, need); /* freed regions go first, uncopied */
    if (*released >= need || !can_move(pool))
        return *released ? 0 : SH_ENOMEM;
    pthread_mutex_lock(&pool->move_mu);
    struct candidates c = {.protect = protect, .np = np};
    size_t n = pick_victims(pool, need - *released, &c);
    evict_batch(pool, &c, n, released, NULL, NULL);
    pthread_mutex_unlock(&pool->move_mu);
    free(c.r);
    sh_chunkcache_trim(pool->cc, *released); /* give the memory back to the device */
    return *released ? 0 : SH_ENOMEM;
}

int sh_pool_evict_these(struct sh_pool *pool, const uintptr_t *vas, size_t n, size_t *released,
                        uintptr_t *evicted, size_t *nevicted)
{
    *released = 0;
    *nevicted = 0;
    if (n == 0 || !can_move(pool))
        return SH_ENOMEM;
    struct candidates c = {.r = malloc(n * sizeof *c.r)};
    if (!c.r)
        return SH_ENOMEM;
    pthread_mutex_lock(&pool->move_mu);
    pthread_mutex_lock(&pool->mu);
    pthread_rwlock_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, vas[i]);
        if (r && r->va == vas[i] && r->path != SH_PATH_SLAB &&
            sh_state_move_from(&r->state, SH_RS_RESIDENT, SH_RS_EVICTING, r->id) == 0) {
            pool->st.regions[SH_RS_RESIDENT]--;
            pool->st.regions[SH_RS_EVICTING]++;
            c.r[c.n++] = r;
        }
    }
    pthread_rwlock_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
    evict_batch(pool, &c, c.n, released, evicted, nevicted);
    pthread_mutex_unlock(&pool->move_mu);
    free(c.r);
    sh_chunkcache_trim(pool->cc, *released);
    return *released ? 0 : SH_ENOMEM;
}

size_t sh_pool_bases(struct sh_pool *pool, const uintptr_t *addrs, size_t n, uintptr_t *bases)
{
    size_t m = 0;
    pthread_rwlock_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, addrs[i]);
        if (!r || r->path == SH_PATH_SLAB)
            continue;
        size_t k = 0;
        while (k < m && bases[k] != r->va)
            k++;
        if (k == m)
            bases[m++] = r->va;
    }
    pthread_rwlock_unlock(&pool->index_lock);
    return m;
}

/* ---- use and restore ---- */

void sh_pool_touch(struct sh_pool *pool, const uintptr_t *addrs, size_t n, size_t *host_bytes)
{
    uint64_t now = __atomic_add_fetch(&pool->clock, 1, __ATOMIC_RELAXED);
    *host_bytes = 0;
    pthread_rwlock_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, addrs[i]);
        if (!r)
            continue;
        __atomic_store_n(&r->last_use, now, __ATOMIC_RELAXED);
        if (__atomic_load_n(&r->state, __ATOMIC_RELAXED) == SH_RS_HOST)
            *host_bytes += r->mapped;
    }
    pthread_rwlock_unlock(&pool->index_lock);
}

/* The distinct HOST regions containing addrs, moved to RESTORING. */
static size_t pick_restores(struct sh_pool *pool, const uintptr_t *addrs, size_t n,
                            struct region **out)
{
    size_t m = 0;
    pthread_mutex_lock(&pool->mu); /* mu, then index_lock: region.c's order */
    pthread_rwlock_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, addrs[i]);
        if (r && r->state == SH_RS_HOST && sh_state_move(&r->state, SH_RS_RESTORING, r->id) == 0) {
            pool->st.regions[SH_RS_HOST]--;
            pool->st.regions[SH_RS_RESTORING]++;
            out[m++] = r;
        }
    }
    pthread_rwlock_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
    return m;
}

static void put_chunks(struct sh_pool *pool, struct region *r, unsigned n)
{
    for (unsigned k = 0; k < n; k++) {
        sh_chunkcache_put(pool->cc, r->chunks[k].handle, r->chunks[k].size);
        r->chunks[k].handle = 0;
    }
}

static int get_chunks(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        int rc = sh_chunkcache_get(pool->cc, r->chunks[i].size, &r->chunks[i].handle);
        if (rc) {
            put_chunks(pool, r, i);
            return rc;
        }
    }
    return 0;
}

static void verify(struct sh_pool *pool, struct region *r, const struct chunk *c)
{
    if (!pool->mover.checksums || crc_of(c) == c->crc)
        return;
    __atomic_add_fetch(&pool->st.checksum_mismatches, 1, __ATOMIC_RELAXED);
    sh_log(SH_LOG_ERROR,
           "checksum mismatch: region %llu (0x%llx, %zu bytes) chunk at +%zu changed while "
           "evicted (written by a kernel the launch scan could not see, or corrupted)",
           (unsigned long long)r->id, (unsigned long long)r->va, r->size, c->off);
}

/* Puts chunks [0, n) of r back on their slabs, which still hold the bytes. */
static void unrestore(struct sh_pool *pool, struct region *r, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        struct chunk *c = &r->chunks[i];
        remap(pool, r->va + c->off, c->size, c->handle, c->slab->handle);
    }
}

/* Remaps and fills a batch of RESTORING regions; the gate is held. Returns
 * how many of them (a prefix) completed; the rest are left host-mapped,
 * whole, on their slabs. */
static size_t restore_window(struct sh_pool *pool, struct region **v, size_t n)
{
    struct sh_xfer *x = pool->mover.xfer;
    if (sh_xfer_drain(x) != 0)
        return 0;
    size_t k = 0;
    unsigned moved = 0; /* chunks of v[k] mapped to their device handles */
    int failed = 0;
    while (k < n && !failed) {
        for (moved = 0; moved < v[k]->nchunks; moved++) {
            struct chunk *c = &v[k]->chunks[moved];
            verify(pool, v[k], c);
            if (remap(pool, v[k]->va + c->off, c->size, c->slab->handle, c->handle) != 0) {
                failed = 1;
                break;
            }
            if (sh_xfer_copy(x, SH_H2D, v[k]->va + c->off, c->slab->staging, c->size) != 0) {
                failed = 1;
                moved++; /* mapped, not filled */
                break;
            }
        }
        k += !failed;
    }
    /* Copies land before anything they write to is unmapped. */
    int flushed = sh_xfer_flush(x, SH_H2D) == 0;
    if (failed)
        unrestore(pool, v[k], moved);
    if (!flushed) { /* which copy failed is unknown: the whole batch stays */
        for (size_t j = 0; j < k; j++)
            unrestore(pool, v[j], v[j]->nchunks);
        k = 0;
    }
    return k;
}

static void restored(struct sh_pool *pool, struct region *r)
{
    give_back_slabs(pool, r);
    pthread_mutex_lock(&pool->mu);
    pool->st.restores++;
    pool->st.restored_bytes += r->mapped;
    pool->st.host_bytes -= r->mapped;
    pthread_mutex_unlock(&pool->mu);
    finish_state(pool, r, SH_RS_RESIDENT);
}

int sh_pool_restore(struct sh_pool *pool, const uintptr_t *addrs, size_t n)
{
    if (!pool->mover.xfer || n == 0)
        return 0;
    if (sh_gate_held(pool->mover.gate))
        return SH_EBUSY; /* as in sh_pool_evict */
    struct region **v = malloc(n * sizeof *v);
    if (!v)
        return SH_ENOMEM;
    pthread_mutex_lock(&pool->move_mu);
    size_t m = pick_restores(pool, addrs, n, v), ready = 0;
    int rc = 0;
    while (ready < m && (rc = get_chunks(pool, v[ready])) == 0)
        ready++;
    for (size_t k = ready; k < m; k++)
        finish_state(pool, v[k], SH_RS_HOST); /* no device memory: stays on the host */
    size_t done = 0;
    int gate = ready ? sh_gate_lock(pool->mover.gate) : 0;
    if (ready && gate == 0) {
        done = restore_window(pool, v, ready);
        sh_gate_unlock(pool->mover.gate);
        if (done < ready)
            sh_log(SH_LOG_ERROR,
                   "restore failed in the remap window; %zu region(s) stay on the host",
                   ready - done);
    }
    if (done < ready)
        rc = gate ? gate : SH_EDRIVER; /* SH_EBUSY: the caller holds the gate */
    for (size_t k = 0; k < ready; k++) {
        if (k < done) {
            restored(pool, v[k]);
        } else {
            put_chunks(pool, v[k], v[k]->nchunks);
            finish_state(pool, v[k], SH_RS_HOST);
        }
    }
    pthread_mutex_unlock(&pool->move_mu);
    free(v);
    return rc;
}
