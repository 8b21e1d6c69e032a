/* prefetch.c — restores that overlap compute (move.c has the common
 * machinery and the whole story): started into device chunks mapped at a
 * scratch address, committed in a window that maps them at the region's
 * address, the copy redone there when a launch may have written the slabs
 * under it.
 *
 * Locking: move.c's.
 */
#include "pool/region_int.h"

#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

/* Drops the scratch side of a prefetch whose copies have finished (or were
 * never queued): scratch mappings of chunks [0, mapped), and the scratch VA
 * unless one of them is stranded (repair.c) and must keep it. */
static void drop_scratch(struct sh_pool *pool, struct region *r, unsigned mapped)
{
    int stranded = 0;
    for (unsigned i = 0; i < mapped; i++) {
        const struct chunk *c = &r->chunks[i];
        stranded |= sh_pool_unmap_or_strand(pool, r->scratch + c->off, c->size, c->handle) != 0;
    }
    if (!stranded)
        sh_vaarena_free(pool->va, r->scratch, r->mapped);
    r->scratch = 0;
}

/* Back to HOST, on its slabs; copies already finished or never queued. */
static void pf_abandon(struct sh_pool *pool, struct region *r, unsigned mapped)
{
    drop_scratch(pool, r, mapped);
    sh_pool_put_chunks(pool, r, r->nchunks);
    pthread_mutex_lock(&pool->mu);
    pool->st.prefetch_cancels++;
    pthread_mutex_unlock(&pool->mu);
    sh_pool_finish_state(pool, r, SH_RS_HOST);
}

/* Device chunks for r mapped at a fresh scratch address; 0 or an error,
 * with nothing held on error. */
static int pf_map_scratch(struct sh_pool *pool, struct region *r)
{
    int rc = sh_pool_get_chunks(pool, r);
    if (rc)
        return rc;
    rc = sh_vaarena_alloc(pool->va, r->mapped, pool->p.granularity, &r->scratch);
    if (rc) {
        sh_pool_put_chunks(pool, r, r->nchunks);
        return rc;
    }
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        rc = pool->vmm.map(pool->vmm.ctx, r->scratch + c->off, c->size, c->handle);
        if (rc) {
            drop_scratch(pool, r, i);
            sh_pool_put_chunks(pool, r, r->nchunks);
            return rc;
        }
        __atomic_add_fetch(&pool->st.vmm_maps, 1, __ATOMIC_RELAXED);
    }
    return 0;
}

/* Every byte that crosses the bus is counted, the copies of prefetches
 * later redone or cancelled included. */
static void count_h2d(struct sh_pool *pool, size_t bytes)
{
    pthread_mutex_lock(&pool->mu);
    pool->st.restored_bytes += bytes;
    pool->st.prefetched_bytes += bytes;
    pthread_mutex_unlock(&pool->mu);
}

/* Queues r's copies slab -> scratch; mv_first..mv_last number them. */
static int pf_copy(struct sh_pool *pool, struct region *r)
{
    struct sh_xfer *x = pool->mover.xfer;
    r->mv_first = sh_xfer_last(x, SH_H2D) + 1;
    int rc = 0;
    size_t queued = 0;
    for (unsigned i = 0; i < r->nchunks && rc == 0; i++) {
        const struct chunk *c = &r->chunks[i];
        rc = sh_xfer_copy(x, SH_H2D, r->scratch + c->off, c->slab->staging, c->size);
        queued += rc == 0 ? c->size : 0;
    }
    r->mv_last = sh_xfer_last(x, SH_H2D);
    count_h2d(pool, queued);
    return rc;
}

/* One RESTORING region: scratch, copies, then onto the prefetch list. */
static int pf_start_one(struct sh_pool *pool, struct region *r)
{
    int rc = pf_map_scratch(pool, r);
    if (rc) {
        sh_pool_finish_state(pool, r, SH_RS_HOST);
        return rc;
    }
    rc = pf_copy(pool, r);
    if (rc) {
        /* Nothing may land in a chunk after it went back to the cache. */
        sh_xfer_wait_seq(pool->mover.xfer, SH_H2D, r->mv_first, r->mv_last);
        pf_abandon(pool, r, r->nchunks);
        return rc;
    }
    sh_pool_move_push(pool, &pool->pf, r, &pool->st.prefetches);
    return 0;
}

/* A HOST region can be prefetched; mu held. */
static int pf_pick(struct sh_pool *pool, struct region *r)
{
    if (r->stuck || sh_state_move_from(&r->state, SH_RS_HOST, SH_RS_RESTORING, r->id) != 0)
        return 0;
    pool->st.regions[SH_RS_HOST]--;
    pool->st.regions[SH_RS_RESTORING]++;
    return 1;
}

int sh_pool_prefetch_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                           size_t *nstarted)
{
    if (__atomic_load_n(&pool->no_prefetch, __ATOMIC_RELAXED)) {
        *nstarted = 0;
        return 0; /* an unseen writer was found (sh_pool_unseen_write) */
    }
    return sh_pool_move_start(pool, vas, n, started, nstarted, pf_pick, pf_start_one);
}

/* Work that may write r was issued after r went to the host: it may have
 * written a slab while the prefetch copy read it. Both stamps are taken
 * with the gate held (issue on the read side, the window on the write
 * side), so the order between them is exact. */
static int pf_stale(const struct sh_pool *pool, const struct region *r)
{
    return sh_pool_issued_at(pool, r) > r->evict_clock && !pool->mover.plant_lost_write;
}

/* Maps r's device chunks at its address; on failure its slabs are mapped
 * there again, whole (they still hold the bytes: nothing ran). */
static int pf_switch(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++)
        sh_pool_verify(pool, r, &r->chunks[i]);
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        if (sh_pool_remap(pool, r, c, c->slab->handle, c->handle, c->slab->handle) != 0) {
            sh_pool_unrestore(pool, r, i);
            return SH_EDRIVER;
        }
    }
    return 0;
}

enum { PF_FAIL = 0, PF_OK = 1, PF_REDO = 2 };

/* Redoes the copies of the regions marked PF_REDO; those that cannot be
 * redone are marked PF_FAIL. Nothing runs meanwhile (drained, gate held). */
static void pf_redo(struct sh_pool *pool, struct region **v, size_t n, char *st)
{
    int any = 0;
    for (size_t k = 0; k < n; k++) {
        if (st[k] != PF_REDO)
            continue;
        if (pf_copy(pool, v[k]) != 0)
            st[k] = PF_FAIL; /* the flush below waits for what was queued */
        any = 1;
    }
    if (!any)
        return;
    int flushed = sh_pool_flush(pool, SH_H2D) == 0;
    for (size_t k = 0; k < n; k++) {
        if (st[k] != PF_REDO)
            continue;
        st[k] = flushed ? PF_OK : PF_FAIL; /* which copy failed is unknown */
        if (flushed) {
            pthread_mutex_lock(&pool->mu);
            pool->st.prefetch_redos++;
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

/* Which of the regions about to commit keep their slabs as host copies, of
 * the bytes their device chunks now hold at scratch (copies landed or
 * redone, nothing running). A prefetch that missed a write the launch scan
 * could not see (DESIGN.md: prefetch leans on that scan) already lost it;
 * its kept copy then holds it where the device does not. */
static void pf_keep(struct sh_pool *pool, struct region **v, size_t n, const char *st)
{
    struct region **sel = malloc(n * (sizeof *sel + sizeof(uintptr_t)));
    if (!sel)
        return; /* nothing kept: each keep_next is still 0 */
    uintptr_t *at = (uintptr_t *)(sel + n);
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        if (st[k] == PF_OK) {
            at[m] = v[k]->scratch;
            sel[m++] = v[k];
        }
    sh_pool_kept_mark(pool, sel, at, m);
    free(sel);
}

/* The commit window (gate held): st[k] ends PF_OK for each region of v now
 * on its device chunks, PF_FAIL for those left on their slabs. */
static void pf_window(struct sh_pool *pool, struct region **v, size_t n, char *st)
{
    struct sh_xfer *x = pool->mover.xfer;
    memset(st, PF_FAIL, n);
    if (sh_pool_drain(pool, v, n) != 0)
        return;
    for (size_t k = 0; k < n; k++) {
        /* Drained: the copies are done; a failed one is redone from the slab. */
        int bad = sh_xfer_wait_seq(x, SH_H2D, v[k]->mv_first, v[k]->mv_last) != 0;
        st[k] = bad || pf_stale(pool, v[k]) ? PF_REDO : PF_OK;
    }
    pf_redo(pool, v, n, st);
    pf_keep(pool, v, n, st);
    for (size_t k = 0; k < n; k++) {
        if (st[k] != PF_OK)
            continue;
        sh_pool_check_move(pool, v[k], v[k]->scratch, "prefetch");
        if (pf_switch(pool, v[k]) != 0)
            st[k] = PF_FAIL;
    }
}

/* r is on its device chunks: the scratch side and the slabs go. */
static void pf_committed(struct sh_pool *pool, struct region *r)
{
    drop_scratch(pool, r, r->nchunks);
    pthread_mutex_lock(&pool->mu);
    pool->st.prefetch_commits++;
    __atomic_add_fetch(&r->restores, 1, __ATOMIC_RELAXED);
    pool->st.restores++; /* its bytes were counted as they were copied */
    sh_bytes_sub(&pool->st.host_bytes, r->mapped);
    pthread_mutex_unlock(&pool->mu);
    sh_pool_kept_restored(pool, r); /* its slabs kept as a copy, or given back */
}

static void pf_committed_cb(struct sh_pool *pool, struct region *r, void *arg)
{
    (void)arg;
    pf_committed(pool, r);
}

int sh_pool_prefetch_commit(struct sh_pool *pool, int all, uintptr_t *out, size_t max, size_t *nout)
{
    size_t failed = 0;
    int rc = sh_pool_move_commit(pool, &pool->pf, all, max, pf_window, pf_committed_cb, NULL, out,
                                 nout, NULL, &failed);
    return rc == 0 && failed ? SH_EDRIVER : rc;
}

void sh_pool_prefetch_cancel_all(struct sh_pool *pool)
{
    sh_pool_move_cancel_all(pool, &pool->pf);
}

size_t sh_pool_prefetch_needed(struct sh_pool *pool, const uintptr_t *addrs, size_t n)
{
    size_t m = 0;
    if (sh_pool_move_none(&pool->pf))
        return 0;
    pthread_mutex_lock(&pool->mu);
    if (pool->pf.count) {
        sh_rw_rdlock(&pool->index_lock);
        for (size_t i = 0; i < n; i++) {
            const struct region *r = sh_rindex_lookup(pool->index, addrs[i]);
            m += r && r->mv_on == &pool->pf;
        }
        sh_rw_unlock(&pool->index_lock);
    }
    pthread_mutex_unlock(&pool->mu);
    return m;
}

size_t sh_pool_prefetch_ready(struct sh_pool *pool, size_t *inflight)
{
    return sh_pool_move_ready(pool, &pool->pf, inflight);
}

void sh_pool_pf_cancel(struct sh_pool *pool, struct region *r)
{
    if (r->stuck) {
        drop_scratch(pool, r, r->nchunks);
        sh_pool_make_stuck(pool, r, "prefetch");
    } else {
        pf_abandon(pool, r, r->nchunks);
    }
}
