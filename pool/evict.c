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
 * The moves that overlap compute are move.c's (prefetch.c, early.c),
 * over the pieces here that both kinds share (region_int.h).
 *
 * Locking: pool->move_mu serialises batches (a prefetch's start and commit
 * are batches); states move under pool->mu; chunk handles and slabs change
 * only between EVICTING/RESTORING and the state that ends them, so nobody
 * else reads them meanwhile. Prefetches and early evictions in flight are
 * on pool->pf and pool->ev (pool->mu); the thread that takes one off owns
 * it until it leaves RESTORING or EVICTING (commit, or cancel by a free).
 * Issue stamps, pool->opaque, pool->opaque_streams, pool->lo/hi and
 * region->holds_ptrs are atomics; windows read them under move_mu. Which
 * regions hold pointers is ptrscan.c's.
 */
#include "pool/region_int.h"

#include "sh_clock.h"
#include "sh_err.h"
#include "sh_log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

void sh_pool_set_mover(struct sh_pool *pool, const struct sh_pool_mover *m)
{
    pthread_mutex_lock(&pool->mu);
    pool->mover = *m;
    pool->pf.dir = SH_H2D;
    pool->ev.dir = SH_D2H;
    pool->pf.cancel = sh_pool_pf_cancel;
    pool->ev.cancel = sh_pool_ev_cancel;
    pthread_mutex_unlock(&pool->mu);
}

/* The regions of one batch, moved to EVICTING by whoever collected them. */
struct candidates {
    struct region **r;
    size_t n;
};

/* ---- slabs and states ---- */

void sh_pool_give_back_slabs(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++)
        if (r->chunks[i].slab && r->chunks[i].handle) {
            sh_hostpool_put(pool->mover.host, r->chunks[i].slab);
            r->chunks[i].slab = NULL;
        }
}

/* A slab for c: a free one, else one a kept copy gives up (the first host
 * memory to go), else one the host pool grows within wait_ms. */
static int get_slab(struct sh_pool *pool, struct chunk *c, unsigned wait_ms)
{
    struct sh_hostpool *hp = pool->mover.host;
    int rc = sh_hostpool_get(hp, c->size, 0, &c->slab);
    while (rc == SH_ENOMEM && sh_pool_kept_reclaim(pool) > 0)
        rc = sh_hostpool_get(hp, c->size, 0, &c->slab);
    if (rc == SH_ENOMEM && wait_ms)
        rc = sh_hostpool_get(hp, c->size, wait_ms, &c->slab);
    return rc;
}

int sh_pool_get_slabs(struct sh_pool *pool, struct region *r, unsigned wait_ms)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        int rc = get_slab(pool, c, wait_ms);
        if (rc) {
            sh_pool_give_back_slabs(pool, r);
            return rc;
        }
    }
    return 0;
}

void sh_pool_finish_state(struct sh_pool *pool, struct region *r, int to)
{
    pthread_mutex_lock(&pool->mu);
    int from = r->state;
    sh_state_move(&r->state, to, r->id);
    pool->st.regions[from]--;
    pool->st.regions[to]++;
    pthread_mutex_unlock(&pool->mu);
}

uint32_t sh_pool_crc_of(const struct chunk *c)
{
    return (uint32_t)crc32(0, (const unsigned char *)c->slab->staging, (uInt)c->size);
}

/* ---- eviction ---- */

/* A move that failed and could not be rolled back whole: the region keeps
 * every handle and slab it has, whichever is mapped where, and never moves
 * again. Its bytes are where its mappings say (the caller checked). */
void sh_pool_make_stuck(struct sh_pool *pool, struct region *r, const char *what)
{
    r->stuck = 1;
    pthread_mutex_lock(&pool->mu);
    if (r->state == SH_RS_EVICTING) /* a restore's region counts as host already */
        sh_bytes_add(&pool->st.host_bytes, r->mapped);
    pthread_mutex_unlock(&pool->mu);
    sh_log(SH_LOG_ERROR,
           "region %llu (0x%llx, %zu bytes): a failed %s could not be undone; it stays where it "
           "is and is not moved again",
           (unsigned long long)r->id, (unsigned long long)r->va, r->size, what);
    sh_pool_finish_state(pool, r, SH_RS_HOST);
}

int sh_pool_drain_device(struct sh_pool *pool)
{
    /* No work is being issued (the gate is held): all issued so far ends. */
    uint64_t now = __atomic_load_n(&pool->clock, __ATOMIC_RELAXED);
    int rc = sh_xfer_drain(pool->mover.xfer);
    if (rc == 0)
        __atomic_store_n(&pool->drained, now, __ATOMIC_RELAXED);
    return rc;
}

int sh_pool_window_lock(struct sh_pool *pool)
{
    int rc = sh_gate_lock(pool->mover.gate);
    if (rc == 0 && pool->mover.capturing && pool->mover.capturing()) {
        sh_gate_unlock(pool->mover.gate);
        rc = SH_EBUSY;
    }
    return rc;
}

/* Waits for the work that may touch the regions of a window: the whole
 * device, or with a tracked drain only the streams that used them. */
static int drain(struct sh_pool *pool, struct region **v, size_t n)
{
    if (!pool->mover.drain_streams)
        return sh_pool_drain_device(pool);
    /* Opaque work may use any region: its streams are drained too; so are
     * those of work on a neighbour that may reach into the window's. */
    uint64_t mask = __atomic_exchange_n(&pool->opaque_streams, 0, __ATOMIC_RELAXED);
    int near = 0;
    for (size_t k = 0; k < n; k++) {
        mask |= __atomic_exchange_n(&v[k]->use_streams, 0, __ATOMIC_RELAXED);
        near |= spans(v[k]);
    }
    if (near)
        mask |= __atomic_exchange_n(&pool->spanned_streams, 0, __ATOMIC_RELAXED);
    int rc = mask ? pool->mover.drain_streams(pool->mover.drain_ctx, mask) : 0;
    if (rc) /* not waited for: the next window waits for them all */
        __atomic_or_fetch(&pool->opaque_streams, mask, __ATOMIC_RELAXED);
    return rc;
}

int sh_pool_drain(struct sh_pool *pool, struct region **v, size_t n)
{
    uint64_t t0 = sh_clock_ns();
    int rc = drain(pool, v, n);
    __atomic_add_fetch(&pool->st.drain_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    return rc;
}

/* sh_xfer_flush, timed: a window's copies, waited for. */
int sh_pool_flush(struct sh_pool *pool, int dir)
{
    uint64_t t0 = sh_clock_ns();
    int rc = sh_xfer_flush(pool->mover.xfer, dir);
    __atomic_add_fetch(&pool->st.copy_wait_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    return rc;
}

/* sh_xfer_copy in a window, timed: with its direction full it first waits
 * for the oldest copy, which is waiting for the window's copies too. */
int sh_pool_window_copy(struct sh_pool *pool, int dir, uintptr_t dst, uintptr_t src, size_t n)
{
    uint64_t t0 = sh_clock_ns();
    int rc = sh_xfer_copy(pool->mover.xfer, dir, dst, src, n);
    __atomic_add_fetch(&pool->st.copy_wait_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    return rc;
}

/* The latest issue stamp of work that may have used r: its own, that of
 * opaque work, which may use any region, and for a region work may reach
 * from a neighbour, that of work on any such region. */
uint64_t sh_pool_issued_at(const struct sh_pool *pool, const struct region *r)
{
    uint64_t own = __atomic_load_n(&r->issued, __ATOMIC_ACQUIRE);
    uint64_t any = __atomic_load_n(&pool->opaque, __ATOMIC_ACQUIRE);
    if (spans(r)) {
        uint64_t near = __atomic_load_n(&pool->spanned, __ATOMIC_ACQUIRE);
        any = near > any ? near : any;
    }
    return own > any ? own : any;
}

/* Copies and remaps a batch of EVICTING regions; the gate is held. Returns
 * how many of them (a prefix) completed; the rest are left device-mapped,
 * whole: their slabs go back to the pool, so none may stay mapped. */
static size_t evict_window(struct sh_pool *pool, struct region **v, size_t n)
{
    struct sh_xfer *x = pool->mover.xfer;
    if (sh_pool_drain(pool, v, n) != 0)
        return 0;
    sh_pool_kept_compare(pool, v, n, 0); /* chunks whose kept copy is still right stay uncopied */
    for (size_t k = 0; k < n; k++)
        for (unsigned i = 0; i < v[k]->nchunks; i++) {
            struct chunk *c = &v[k]->chunks[i];
            if (c->clean)
                continue;
            v[k]->spoiled = 1;
            if (sh_pool_window_copy(pool, SH_D2H, c->slab->staging, v[k]->va + c->off, c->size) !=
                0) {
                sh_xfer_flush(x, SH_D2H); /* nothing lands in a slab after it went back */
                return 0;
            }
        }
    if (sh_pool_flush(pool, SH_D2H) != 0)
        return 0;
    for (size_t k = 0; k < n; k++) /* verify_moves: what clean chunks left uncopied matches */
        if (v[k]->from_kept)
            sh_pool_check_move(pool, v[k], v[k]->va, "clean eviction");
    sh_pool_scan_prefilter(pool, v, n); /* the device bytes, before they leave */
    /* Work issued from here on runs on the slabs (sh_pool_issued). */
    uint64_t now = __atomic_load_n(&pool->clock, __ATOMIC_RELAXED);
    for (size_t k = 0; k < n; k++)
        v[k]->evict_clock = now;
    for (size_t k = 0; k < n; k++)
        for (unsigned i = 0; i < v[k]->nchunks; i++) {
            struct chunk *c = &v[k]->chunks[i];
            if (pool->mover.checksums)
                c->crc = sh_pool_crc_of(c);
            if (sh_pool_remap(pool, v[k], c, c->handle, c->slab->handle, c->handle) != 0) {
                /* Both copies hold the bytes: nothing ran since the copy. A
                 * chunk that cannot go back leaves the region stuck. */
                while (i-- > 0) {
                    c = &v[k]->chunks[i];
                    if (sh_pool_remap(pool, v[k], c, c->slab->handle, c->handle, c->handle))
                        v[k]->stuck = 1;
                }
                for (size_t j = k; j < n; j++)
                    v[j]->no_ptrs = 0; /* they stay: no landing to skip */
                return k;
            }
        }
    return n;
}

void sh_pool_evicted_one(struct sh_pool *pool, struct region *r, size_t *released)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        sh_chunkcache_put(pool->cc, r->chunks[i].handle, r->chunks[i].size);
        r->chunks[i].handle = 0;
    }
    *released += r->mapped;
    __atomic_add_fetch(&r->evictions, 1, __ATOMIC_RELAXED);
    sh_pool_scan_landed(pool, r); /* outside the window: launches go on */
    size_t copied = sh_pool_kept_evicted(pool, r);
    pthread_mutex_lock(&pool->mu);
    pool->st.evictions++;
    pool->st.evicted_bytes += copied;
    sh_bytes_add(&pool->st.host_bytes, r->mapped);
    pthread_mutex_unlock(&pool->mu);
    sh_pool_finish_state(pool, r, SH_RS_HOST);
}

/* Copies and remaps a batch of EVICTING regions; move_mu held. Regions
 * that could not go return to RESIDENT. Adds the bytes released. */
static int evict_batch(struct sh_pool *pool, struct candidates *c, size_t n, size_t *released,
                       uintptr_t *evicted, size_t *nevicted)
{
    size_t ready = 0;
    unsigned wait_ms = pool->mover.slab_wait_ms;
    for (size_t k = 0; k < n; k++) {
        if (c->r[k]->from_kept || sh_pool_get_slabs(pool, c->r[k], wait_ms) == 0) {
            c->r[ready++] = c->r[k];
        } else {
            /* No slabs for its chunk sizes: it stays, the others may still go,
             * with what the host pool has now. */
            sh_pool_finish_state(pool, c->r[k], SH_RS_RESIDENT);
            wait_ms = 0;
        }
    }
    size_t done = 0;
    int rc = ready ? sh_pool_window_lock(pool) : 0;
    if (ready && rc == 0) {
        done = evict_window(pool, c->r, ready);
        sh_gate_unlock(pool->mover.gate);
    }
    for (size_t k = 0; k < ready; k++) {
        if (k < done) {
            if (evicted)
                evicted[(*nevicted)++] = c->r[k]->va;
            sh_pool_evicted_one(pool, c->r[k], released);
        } else if (c->r[k]->stuck) {
            sh_pool_make_stuck(pool, c->r[k], "eviction");
        } else {
            sh_pool_kept_unevict(pool, c->r[k]);
        }
    }
    return rc;
}

/* 1 when this caller may open a remap window now. A caller issuing work
 * (holding any device's gate) cannot; it must not wait for move_mu either:
 * its holder may be waiting for a gate this caller holds, or for the
 * readers of its own, one of which may wait for another pool's move_mu.
 * While a hole stays open (repair.c) the driver maps nothing: no move
 * starts that would make another. */
int sh_pool_can_move(struct sh_pool *pool)
{
    return pool->mover.xfer && !sh_gate_held_any() && sh_pool_heal(pool) == 0;
}

int sh_pool_evict_these(struct sh_pool *pool, const uintptr_t *vas, size_t n, size_t *released,
                        uintptr_t *evicted, size_t *nevicted)
{
    *released = 0;
    *nevicted = 0;
    if (n == 0 || !sh_pool_can_move(pool))
        return SH_ENOMEM;
    struct candidates c = {.r = malloc(n * sizeof *c.r)};
    if (!c.r)
        return SH_ENOMEM;
    pthread_mutex_lock(&pool->move_mu);
    pthread_mutex_lock(&pool->mu);
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, vas[i]);
        if (r && r->va == vas[i] && r->path != SH_PATH_SLAB && !r->pinned &&
            sh_state_move_from(&r->state, SH_RS_RESIDENT, SH_RS_EVICTING, r->id) == 0) {
            pool->st.regions[SH_RS_RESIDENT]--;
            pool->st.regions[SH_RS_EVICTING]++;
            sh_pool_kept_take(pool, r, 0);
            c.r[c.n++] = r;
        }
    }
    sh_rw_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
    size_t movable = c.n;
    int rc = evict_batch(pool, &c, c.n, released, evicted, nevicted);
    pthread_mutex_unlock(&pool->move_mu);
    free(c.r);
    sh_chunkcache_trim(pool->cc, *released);
    return *released ? 0 : rc ? rc : movable ? SH_ENOMEM : SH_EBUSY;
}

/* ---- use and restore ---- */

/* The distinct HOST regions containing addrs, moved to RESTORING. */
static size_t pick_restores(struct sh_pool *pool, const uintptr_t *addrs, size_t n,
                            struct region **out)
{
    size_t m = 0;
    pthread_mutex_lock(&pool->mu); /* mu, then index_lock: region.c's order */
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, addrs[i]);
        if (r && r->state == SH_RS_HOST && !r->stuck &&
            sh_state_move(&r->state, SH_RS_RESTORING, r->id) == 0) {
            pool->st.regions[SH_RS_HOST]--;
            pool->st.regions[SH_RS_RESTORING]++;
            out[m++] = r;
        }
    }
    sh_rw_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
    return m;
}

void sh_pool_put_chunks(struct sh_pool *pool, struct region *r, unsigned n)
{
    for (unsigned k = 0; k < n; k++) {
        sh_chunkcache_put(pool->cc, r->chunks[k].handle, r->chunks[k].size);
        r->chunks[k].handle = 0;
    }
}

int sh_pool_get_chunks(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        int rc = sh_chunkcache_get(pool->cc, r->chunks[i].size, &r->chunks[i].handle);
        if (rc) {
            sh_pool_put_chunks(pool, r, i);
            return rc;
        }
    }
    return 0;
}

/* Checks a chunk's slab against its CRC from the eviction window. Work
 * issued against the region since then may have written it legitimately:
 * then there is nothing to compare, and a mismatch is always a real one
 * (bytes changed that no work seen by the library could change). */
void sh_pool_verify(struct sh_pool *pool, struct region *r, const struct chunk *c)
{
    if (!pool->mover.checksums || sh_pool_issued_at(pool, r) > r->evict_clock ||
        sh_pool_crc_of(c) == c->crc)
        return;
    __atomic_add_fetch(&pool->st.checksum_mismatches, 1, __ATOMIC_RELAXED);
    sh_log(SH_LOG_ERROR,
           "checksum mismatch: region %llu (0x%llx, %zu bytes) chunk at +%zu changed while "
           "evicted, with no work issued against it (written through a pointer the library "
           "could not see, or corrupted)",
           (unsigned long long)r->id, (unsigned long long)r->va, r->size, c->off);
}

/* ---- the move verifier (verify_moves) ---- */

/* 1 when the n device bytes at dev differ from the host bytes at host, 0
 * when equal, negative when they could not be read. The device side is
 * read back by a copy: device memory need not be readable from the host.
 * Only inside a window, where nothing writes either side. */
static int differs(struct sh_pool *pool, uintptr_t dev, uintptr_t host, size_t n)
{
    unsigned char *tmp = malloc(n);
    if (!tmp)
        return SH_ENOMEM;
    int rc = sh_xfer_copy(pool->mover.xfer, SH_D2H, (uintptr_t)tmp, dev, n);
    int flushed = sh_xfer_flush(pool->mover.xfer, SH_D2H);
    rc = rc ? rc : flushed ? flushed : memcmp(tmp, (const void *)host, n) != 0;
    free(tmp);
    return rc;
}

/* Compares each chunk of r as committing would leave it (the device side
 * at dev) with the side the program used until now (its slab), and reports
 * the bytes the commit would lose. */
void sh_pool_check_move(struct sh_pool *pool, struct region *r, uintptr_t dev, const char *kind)
{
    if (!pool->mover.verify_moves)
        return;
    for (unsigned i = 0; i < r->nchunks; i++) {
        const struct chunk *c = &r->chunks[i];
        int d = differs(pool, dev + c->off, c->slab->staging, c->size);
        if (d < 0)
            sh_log(SH_LOG_WARN, "verify_moves: cannot read back region 0x%llx: not checked",
                   (unsigned long long)r->va);
        if (d <= 0)
            continue;
        __atomic_add_fetch(&pool->st.lost_writes, 1, __ATOMIC_RELAXED);
        sh_log(SH_LOG_ERROR,
               "LOST WRITE: %s of region %llu (0x%llx, %zu bytes), chunk at +%zu: the device "
               "and host copies differ at commit; a write the library did not see is lost",
               kind, (unsigned long long)r->id, (unsigned long long)r->va, r->size, c->off);
    }
}

/* Puts chunks [0, n) of r back on their slabs, which still hold the
 * bytes. A chunk that cannot go back stays on its device chunk, filled
 * again from its slab (its copy may not have landed), and r is stuck. */
void sh_pool_unrestore(struct sh_pool *pool, struct region *r, unsigned n)
{
    struct sh_xfer *x = pool->mover.xfer;
    for (unsigned i = 0; i < n; i++) {
        struct chunk *c = &r->chunks[i];
        /* The slab holds the bytes: the copy to the device may not have landed. */
        int rc = sh_pool_remap(pool, r, c, c->handle, c->slab->handle, c->slab->handle);
        if (rc == 0 || rc == SH_ELOST) /* a hole is filled from the slab */
            continue;
        r->stuck = 1;
        if (sh_xfer_copy(x, SH_H2D, r->va + c->off, c->slab->staging, c->size) != 0 ||
            sh_xfer_flush(x, SH_H2D) != 0)
            sh_log(SH_LOG_ERROR, "region %llu (0x%llx): %zu bytes at +%zu are lost",
                   (unsigned long long)r->id, (unsigned long long)r->va, c->size, c->off);
    }
}

/* Remaps and fills a batch of RESTORING regions; the gate is held. Returns
 * how many of them (a prefix) completed; the rest are left host-mapped,
 * whole, on their slabs. */
static size_t restore_window(struct sh_pool *pool, struct region **v, size_t n)
{
    if (sh_pool_drain(pool, v, n) != 0)
        return 0;
    size_t k = 0;
    unsigned moved = 0; /* chunks of v[k] mapped to their device handles */
    int failed = 0;
    while (k < n && !failed) {
        for (moved = 0; moved < v[k]->nchunks; moved++) {
            struct chunk *c = &v[k]->chunks[moved];
            sh_pool_verify(pool, v[k], c);
            if (sh_pool_remap(pool, v[k], c, c->slab->handle, c->handle, c->slab->handle) != 0) {
                failed = 1;
                break;
            }
            if (sh_pool_window_copy(pool, SH_H2D, v[k]->va + c->off, c->slab->staging, c->size) !=
                0) {
                failed = 1;
                moved++; /* mapped, not filled */
                break;
            }
        }
        k += !failed;
    }
    /* Copies land before anything they write to is unmapped. */
    int flushed = sh_pool_flush(pool, SH_H2D) == 0;
    if (failed)
        sh_pool_unrestore(pool, v[k], moved);
    if (!flushed) { /* which copy failed is unknown: the whole batch stays */
        for (size_t j = 0; j < k; j++)
            sh_pool_unrestore(pool, v[j], v[j]->nchunks);
        k = 0;
    }
    uintptr_t *at = k ? malloc(k * sizeof *at) : NULL;
    for (size_t j = 0; at && j < k; j++)
        at[j] = v[j]->va;
    if (at) /* the bytes landed and nothing runs: what the slabs hold, fingerprinted */
        sh_pool_kept_mark(pool, v, at, k);
    free(at);
    return k;
}

static void restored(struct sh_pool *pool, struct region *r)
{
    __atomic_add_fetch(&r->restores, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&pool->mu);
    pool->st.restores++;
    pool->st.restored_bytes += r->mapped;
    sh_bytes_sub(&pool->st.host_bytes, r->mapped);
    pthread_mutex_unlock(&pool->mu);
    sh_pool_kept_restored(pool, r); /* its slabs kept as a copy, or given back */
}

int sh_pool_restore(struct sh_pool *pool, const uintptr_t *addrs, size_t n)
{
    if (!pool->mover.xfer || n == 0)
        return 0;
    if (sh_gate_held_any())
        return SH_EBUSY; /* as in sh_pool_evict_these */
    if (sh_pool_heal(pool) != 0)
        return SH_ELOST;
    struct region **v = malloc(n * sizeof *v);
    if (!v)
        return SH_ENOMEM;
    pthread_mutex_lock(&pool->move_mu);
    size_t m = pick_restores(pool, addrs, n, v), ready = 0;
    for (size_t k = 0; k < m; k++)
        sh_pool_scan_settle(pool, v[k], 1); /* off the host: what its bytes held is known */
    int rc = 0;
    while (ready < m && (rc = sh_pool_get_chunks(pool, v[ready])) == 0)
        ready++;
    for (size_t k = ready; k < m; k++)
        sh_pool_finish_state(pool, v[k], SH_RS_HOST); /* no device memory: stays on the host */
    size_t done = 0;
    int gate = ready ? sh_pool_window_lock(pool) : 0;
    if (ready && gate == 0) {
        done = restore_window(pool, v, ready);
        sh_gate_unlock(pool->mover.gate);
        if (done < ready)
            sh_log(SH_LOG_ERROR,
                   "restore failed in the remap window; %zu region(s) stay on the host",
                   ready - done);
    }
    if (done < ready)
        rc = gate ? gate : SH_EDRIVER; /* SH_EBUSY: the caller holds the gate, or a capture */
    for (size_t k = 0; k < ready; k++) {
        if (k < done) {
            restored(pool, v[k]);
        } else if (v[k]->stuck) {
            sh_pool_make_stuck(pool, v[k], "restore");
        } else {
            sh_pool_put_chunks(pool, v[k], v[k]->nchunks);
            sh_pool_finish_state(pool, v[k], SH_RS_HOST);
        }
    }
    pthread_mutex_unlock(&pool->move_mu);
    free(v);
    return rc;
}
