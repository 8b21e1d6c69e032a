/* move.c — moves that overlap compute: prefetches and early evictions.
 *
 * Prefetch: a restore split in two. Start (no window): device chunks are
 * mapped at a scratch address and filled from the slabs by queued H2D
 * copies while kernels run; the region stays host-mapped at its own address.
 * Commit (one window for a batch): unmap the slabs at the region address,
 * map the device chunks there. A launch that referenced the region after it
 * went to the host may have written the slab under the copy, so then the
 * copy is redone inside the window, where nothing runs.
 *
 * Early eviction: an eviction split in two like a prefetch. Start (no
 * window): D2H copies into the slabs while the region stays on its device
 * chunks; commit (one window for a batch): map the slabs at its address.
 *
 * Locking: as evict.c's. Prefetches and early evictions in flight are on
 * pool->pf and pool->ev (pool->mu); the thread that takes one off owns it
 * until it leaves RESTORING or EVICTING (commit, or cancel by a free).
 */
#include "pool/region_int.h"

#include "sh_err.h"
#include "sh_log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
/* ---- moves in flight: prefetches and early evictions ---- */

/* Appends r to l; its copies are mv_first..mv_last. */
static void move_push(struct sh_pool *pool, struct move_list *l, struct region *r)
{
    pthread_mutex_lock(&pool->mu);
    r->mv_next = NULL;
    struct region **pp = &l->head;
    while (*pp)
        pp = &(*pp)->mv_next;
    *pp = r;
    r->mv_on = l;
    __atomic_store_n(&l->count, l->count + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pool->mu);
}

/* Unlinks r from its list; mu held. */
static void move_unlink(struct region *r)
{
    struct move_list *l = r->mv_on;
    struct region **pp = &l->head;
    while (*pp != r)
        pp = &(*pp)->mv_next;
    *pp = r->mv_next;
    r->mv_on = NULL;
    __atomic_store_n(&l->count, l->count - 1, __ATOMIC_RELAXED);
}

/* Takes up to max moves off l: all, or those whose copies have finished.
 * The caller owns them afterwards. */
static size_t move_take_batch(struct sh_pool *pool, struct move_list *l, int all, struct region **v,
                              size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&pool->mu); /* then the engine's lock, never the reverse */
    for (struct region *r = l->head, *next; r && n < max; r = next) {
        next = r->mv_next;
        if (all || sh_xfer_reached(pool->mover.xfer, l->dir, r->mv_last)) {
            move_unlink(r);
            v[n++] = r;
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* Moves on l whose copies have finished; *inflight (may be NULL) gets all. */
/* 1 when l is empty; without the lock, as a launch asks on every call:
 * a move that starts meanwhile is one a lock taken a moment earlier would
 * have missed too (the issue stamps cover what it copies). */
static int move_none(const struct move_list *l)
{
    return __atomic_load_n(&l->count, __ATOMIC_RELAXED) == 0;
}

static size_t move_ready(struct sh_pool *pool, struct move_list *l, size_t *inflight)
{
    size_t ready = 0;
    if (inflight)
        *inflight = 0;
    if (move_none(l))
        return 0;
    pthread_mutex_lock(&pool->mu);
    for (const struct region *r = l->head; r; r = r->mv_next)
        ready += sh_xfer_reached(pool->mover.xfer, l->dir, r->mv_last);
    if (inflight)
        *inflight = l->count;
    pthread_mutex_unlock(&pool->mu);
    return ready;
}

int sh_pool_move_take(struct sh_pool *pool, struct region *r)
{
    (void)pool;
    if (!r->mv_on)
        return 0;
    move_unlink(r);
    return 1;
}

static void pf_abandon(struct sh_pool *pool, struct region *r, unsigned mapped);
static void drop_scratch(struct sh_pool *pool, struct region *r, unsigned mapped);
static void ev_abandon(struct sh_pool *pool, struct region *r);
static int ev_fp_take(struct sh_pool *pool, struct region *r, int want);

void sh_pool_move_cancel(struct sh_pool *pool, struct region *r)
{
    int dir = r->state == SH_RS_RESTORING ? SH_H2D : SH_D2H;
    sh_xfer_wait_seq(pool->mover.xfer, dir, r->mv_first, r->mv_last);
    if (r->stuck) {
        if (dir == SH_H2D)
            drop_scratch(pool, r, r->nchunks);
        else
            ev_fp_take(pool, r, 0);
        sh_pool_make_stuck(pool, r, dir == SH_H2D ? "prefetch" : "early eviction");
    } else if (dir == SH_H2D)
        pf_abandon(pool, r, r->nchunks);
    else
        ev_abandon(pool, r);
}

/* Cancels every move on l (teardown). */
static void move_cancel_all(struct sh_pool *pool, struct move_list *l)
{
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        struct region *r = l->head;
        if (r)
            move_unlink(r);
        pthread_mutex_unlock(&pool->mu);
        if (!r)
            return;
        sh_pool_move_cancel(pool, r);
    }
}

/* One commit window over a batch of moves taken off l (all, or those whose
 * copies have finished): window() runs with the gate held and sets ok[k]
 * to 1 for each region it moved. committed() finishes those; the others
 * are cancelled, back where they were. Their bases go to out and back
 * (back may be NULL; *nback counts them anyway). SH_EBUSY when the caller
 * holds the gate. */
static int move_commit(struct sh_pool *pool, struct move_list *l, int all, size_t max,
                       void (*window)(struct sh_pool *, struct region **, size_t, char *),
                       void (*committed)(struct sh_pool *, struct region *, void *), void *arg,
                       uintptr_t *out, size_t *nout, uintptr_t *back, size_t *nback)
{
    *nout = *nback = 0;
    if (!pool->mover.xfer || max == 0)
        return 0;
    if (sh_gate_held(pool->mover.gate))
        return SH_EBUSY; /* as in sh_pool_evict */
    struct region **v = malloc(max * (sizeof *v + 1));
    if (!v)
        return SH_ENOMEM;
    char *ok = (char *)(v + max);
    pthread_mutex_lock(&pool->move_mu);
    size_t n = move_take_batch(pool, l, all, v, max);
    int rc = 0;
    memset(ok, 0, n);
    if (n && (rc = sh_gate_lock(pool->mover.gate)) == 0) {
        window(pool, v, n, ok);
        sh_gate_unlock(pool->mover.gate);
    }
    for (size_t k = 0; k < n; k++) {
        if (ok[k] == 1) {
            out[(*nout)++] = v[k]->va;
            committed(pool, v[k], arg);
        } else {
            if (back)
                back[*nback] = v[k]->va;
            ++*nback;
            sh_pool_move_cancel(pool, v[k]);
        }
    }
    pthread_mutex_unlock(&pool->move_mu);
    free(v);
    return rc;
}

/* ---- prefetch ---- */

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
    pthread_mutex_lock(&pool->mu);
    pool->st.prefetches++;
    pthread_mutex_unlock(&pool->mu);
    move_push(pool, &pool->pf, r);
    return 0;
}

/* Starts the moves of the regions starting at vas[0..n) that pick() takes
 * (it moves their state; mu and the index lock held) with start_one(). */
static int move_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                      size_t *nstarted, int (*pick)(struct sh_pool *, struct region *),
                      int (*start_one)(struct sh_pool *, struct region *))
{
    *nstarted = 0;
    if (n == 0)
        return 0;
    if (!sh_pool_can_move(pool))
        return pool->mover.xfer ? SH_EBUSY : SH_ENOMEM;
    struct region **v = malloc(n * sizeof *v);
    if (!v)
        return SH_ENOMEM;
    pthread_mutex_lock(&pool->move_mu);
    size_t m = 0;
    pthread_mutex_lock(&pool->mu);
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, vas[i]);
        if (r && r->va == vas[i] && r->path != SH_PATH_SLAB && pick(pool, r))
            v[m++] = r;
    }
    sh_rw_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
    int rc = 0;
    for (size_t k = 0; k < m; k++) {
        sh_pool_scan_settle(pool, v[k], 1); /* off the host: what its bytes held is known */
        int r1 = start_one(pool, v[k]);
        if (r1 == 0)
            started[(*nstarted)++] = v[k]->va;
        rc = rc ? rc : r1;
    }
    pthread_mutex_unlock(&pool->move_mu);
    free(v);
    return *nstarted || m == 0 ? 0 : rc;
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
    return move_start(pool, vas, n, started, nstarted, pf_pick, pf_start_one);
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
    struct sh_xfer *x = pool->mover.xfer;
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
    int flushed = sh_xfer_flush(x, SH_H2D) == 0;
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
    int rc = move_commit(pool, &pool->pf, all, max, pf_window, pf_committed_cb, NULL, out, nout,
                         NULL, &failed);
    return rc == 0 && failed ? SH_EDRIVER : rc;
}

void sh_pool_prefetch_cancel_all(struct sh_pool *pool)
{
    move_cancel_all(pool, &pool->pf);
}

size_t sh_pool_prefetch_needed(struct sh_pool *pool, const uintptr_t *addrs, size_t n)
{
    size_t m = 0;
    if (move_none(&pool->pf))
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
    return move_ready(pool, &pool->pf, inflight);
}

/* ---- early eviction ---- */

/* Back to RESIDENT: its copies have finished or were never queued. */
static void ev_abandon(struct sh_pool *pool, struct region *r)
{
    ev_fp_take(pool, r, 0);
    pthread_mutex_lock(&pool->mu);
    pool->st.early_abandons++;
    pthread_mutex_unlock(&pool->mu);
    sh_pool_kept_unevict(pool, r); /* kept copies nothing was copied into stay */
}

/* The fingerprints of r's device bytes before anything is copied ahead
 * (chunk->ev_fp): work the scan did not see may write r under the copy,
 * and its window compares again. 0, or r could not be fingerprinted. */
static int ev_snapshot(struct sh_pool *pool, struct region *r)
{
    struct sh_clean_fp *fp = malloc(r->nchunks * sizeof *fp);
    int rc = fp ? sh_pool_fingerprint(pool, r, r->va, fp) : SH_ENOMEM;
    for (unsigned i = 0; i < r->nchunks && rc == 0; i++)
        r->chunks[i].ev_fp = fp[i];
    free(fp);
    if (rc && !__atomic_exchange_n(&pool->no_early, 1, __ATOMIC_RELAXED))
        sh_log(SH_LOG_WARN, "a region could not be fingerprinted: early evictions wait for "
                            "pressure instead (they could not tell whether a write was lost)");
    return rc;
}

/* r's start fingerprints, queued on the copy stream ahead of its copies
 * where the mover can: the launching thread does not wait for the kernel,
 * which runs before the copies read the bytes. Else taken now. */
static int ev_fingerprint(struct sh_pool *pool, struct region *r)
{
    if (sh_pool_fingerprint_queue(pool, r, SH_D2H, &r->ev_ticket) == 0)
        return 0;
    r->ev_ticket = 0;
    return ev_snapshot(pool, r);
}

/* The start fingerprints queued for r, into chunk->ev_fp (want), or given
 * up; 0 when none was queued. Each ticket is taken once. */
static int ev_fp_take(struct sh_pool *pool, struct region *r, int want)
{
    uint64_t t = r->ev_ticket;
    if (!t)
        return 0;
    r->ev_ticket = 0;
    struct sh_clean_fp *fp = want ? malloc(r->nchunks * sizeof *fp) : NULL;
    int rc = sh_pool_fingerprint_take(pool, r, t, fp);
    for (unsigned i = 0; fp && i < r->nchunks && rc == 0; i++)
        r->chunks[i].ev_fp = fp[i];
    free(fp);
    return want && !fp ? SH_ENOMEM : rc;
}

/* Queues r's copies device -> slabs and lists it; 0, or r is RESIDENT. A
 * region with kept copies that still match queues none: its window
 * fingerprints it and copies only what changed. */
static int ev_start_one(struct sh_pool *pool, struct region *r)
{
    struct sh_xfer *x = pool->mover.xfer;
    /* A region with kept copies decides now whether to copy ahead. */
    if (r->from_kept && ev_snapshot(pool, r) != 0) {
        sh_pool_kept_ahead_off(r); /* the kept copies as slabs, as ev_abandon expects */
        ev_abandon(pool, r);
        return SH_EDRIVER;
    }
    if (r->from_kept) {
        /* Changed since its restore (a guess: its window compares again):
         * copy ahead as usual, so that the copy overlaps compute. */
        r->ahead = sh_pool_kept_changed(r) && sh_pool_get_slabs(pool, r, 0) == 0;
        if (!r->ahead)
            sh_pool_kept_ahead_off(r);
    }
    if (r->from_kept && !r->ahead) {
        r->mv_first = 1;
        r->mv_last = 0; /* no copy to wait for */
        pthread_mutex_lock(&pool->mu);
        pool->st.early_evictions++;
        pthread_mutex_unlock(&pool->mu);
        move_push(pool, &pool->ev, r);
        return 0;
    }
    if (sh_pool_get_slabs(pool, r, 0) != 0) {
        sh_pool_finish_state(pool, r, SH_RS_RESIDENT);
        return SH_ENOMEM;
    }
    if (!r->from_kept && ev_fingerprint(pool, r) != 0) {
        ev_abandon(pool, r); /* the slabs go back with it */
        return SH_EDRIVER;
    }
    r->mv_first = sh_xfer_last(x, SH_D2H) + 1;
    int rc = 0;
    size_t queued = 0;
    for (unsigned i = 0; i < r->nchunks && rc == 0; i++) {
        const struct chunk *c = &r->chunks[i];
        rc = sh_xfer_copy(x, SH_D2H, c->slab->staging, r->va + c->off, c->size);
        queued += rc == 0 ? c->size : 0;
    }
    r->mv_last = sh_xfer_last(x, SH_D2H);
    pthread_mutex_lock(&pool->mu);
    pool->st.evicted_bytes += queued; /* every byte that crosses the bus */
    pthread_mutex_unlock(&pool->mu);
    if (rc) {
        /* Nothing may land in a slab after it went back to the pool. */
        sh_xfer_wait_seq(x, SH_D2H, r->mv_first, r->mv_last);
        ev_abandon(pool, r);
        return rc;
    }
    pthread_mutex_lock(&pool->mu);
    pool->st.early_evictions++;
    pthread_mutex_unlock(&pool->mu);
    move_push(pool, &pool->ev, r);
    return 0;
}

/* Every piece of work issued against r up to stamp `issued` has finished:
 * a full drain came after it, or (tracked drain) the streams that used r
 * since it last moved are idle. */
static int ev_idle(struct sh_pool *pool, const struct region *r, uint64_t issued)
{
    if (issued <= __atomic_load_n(&pool->drained, __ATOMIC_RELAXED))
        return 1;
    if (!pool->mover.drain_streams || !pool->mover.streams_idle)
        return 0;
    uint64_t mask = __atomic_load_n(&r->use_streams, __ATOMIC_RELAXED) |
                    __atomic_load_n(&pool->opaque_streams, __ATOMIC_RELAXED);
    return mask == 0 || pool->mover.streams_idle(pool->mover.drain_ctx, mask);
}

/* r can start now: RESIDENT, and every piece of work issued against it has
 * finished. Its issue stamp is kept: any later issue changes it. mu held. */
static int ev_startable(struct sh_pool *pool, struct region *r)
{
    uint64_t issued = sh_pool_issued_at(pool, r);
    if (r->pinned || !ev_idle(pool, r, issued) ||
        sh_state_move_from(&r->state, SH_RS_RESIDENT, SH_RS_EVICTING, r->id) != 0)
        return 0;
    r->ev_issued = issued;
    pool->st.regions[SH_RS_RESIDENT]--;
    pool->st.regions[SH_RS_EVICTING]++;
    sh_pool_kept_take(pool, r, 1);
    return 1;
}

int sh_pool_evict_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                        size_t *nstarted)
{
    if (__atomic_load_n(&pool->no_early, __ATOMIC_RELAXED)) {
        *nstarted = 0;
        return 0; /* no fingerprint to tell a lost write by (ev_snapshot) */
    }
    return move_start(pool, vas, n, started, nstarted, ev_startable, ev_start_one);
}

/* Maps r's slabs at its address; on failure its device chunks are mapped
 * there again, whole (they still hold the bytes: nothing ran). */
static int ev_switch(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        if (pool->mover.checksums)
            c->crc = sh_pool_crc_of(c);
        if (sh_pool_remap(pool, r, c, c->handle, c->slab->handle, c->handle) != 0) {
            while (i-- > 0) {
                c = &r->chunks[i];
                if (sh_pool_remap(pool, r, c, c->slab->handle, c->handle, c->handle))
                    r->stuck = 1;
            }
            return SH_EDRIVER;
        }
    }
    return 0;
}

/* The regions of v that took kept copies and were not used since their
 * start: fingerprinted here (drained, gated), their changed chunks copied
 * now. Those whose copies fail are marked in bad[]. */
static void ev_compare(struct sh_pool *pool, struct region **v, size_t n, char *bad)
{
    struct sh_xfer *x = pool->mover.xfer;
    struct region **sel = malloc(n * sizeof *sel);
    size_t m = 0;
    for (size_t k = 0; sel && k < n; k++)
        if (v[k]->from_kept && sh_pool_issued_at(pool, v[k]) == v[k]->ev_issued)
            sel[m++] = v[k];
    sh_pool_kept_compare(pool, sel, m);
    int failed = 0;
    for (size_t j = 0; j < m; j++)
        if (sel[j]->ahead) /* copied ahead, unused since: each chunk picks its slab */
            sh_pool_kept_ahead(pool, sel[j]);
    for (size_t j = 0; j < m; j++)
        for (unsigned i = 0; i < sel[j]->nchunks && !failed && !sel[j]->ahead; i++) {
            struct chunk *c = &sel[j]->chunks[i];
            if (c->clean)
                continue;
            sel[j]->spoiled = 1;
            failed = sh_xfer_copy(x, SH_D2H, c->slab->staging, sel[j]->va + c->off, c->size) != 0;
        }
    failed |= m && sh_xfer_flush(x, SH_D2H) != 0; /* which copy failed is unknown */
    for (size_t k = 0; k < n; k++)
        bad[k] = !sel || (failed && v[k]->from_kept);
    free(sel);
}

/* In r's window (drained): 1 when its device bytes are those its copy
 * ahead read, by fingerprint; chunks found clean keep their kept copy and
 * need no match. A region whose copies were all made in the window (kept
 * copies, nothing copied ahead) needs none. 0: they changed; -1: they
 * could not be fingerprinted (the region stays, and nothing is proved). */
static int ev_unchanged(struct sh_pool *pool, struct region *r)
{
    if ((r->from_kept && !r->ahead) || pool->mover.plant_lost_write)
        return 1;
    if (ev_fp_take(pool, r, 1) != 0)
        return -1;
    struct sh_clean_fp *now = malloc(r->nchunks * sizeof *now);
    int same = now && sh_pool_fingerprint(pool, r, r->va, now) == 0 ? 1 : -1;
    for (unsigned i = 0; i < r->nchunks && same == 1; i++)
        same = r->chunks[i].clean || sh_clean_fp_equal(now[i], r->chunks[i].ev_fp);
    free(now);
    return same;
}

void sh_pool_unseen_write(struct sh_pool *pool, const struct region *r, const char *when)
{
    __atomic_add_fetch(&pool->st.unseen_writes, 1, __ATOMIC_RELAXED);
    if (!__atomic_exchange_n(&pool->no_prefetch, 1, __ATOMIC_RELAXED))
        sh_log(SH_LOG_WARN,
               "region %" PRIu64 " (0x%" PRIxPTR ") changed %s with no work naming it: a kernel "
               "writes through pointers the library cannot see; prefetch is off from now on",
               r->id, r->va, when);
}

/* The commit window (gate held): ok[k] is 1 for each region of v now on
 * its slabs, 0 for those left on their device chunks. */
static void ev_window(struct sh_pool *pool, struct region **v, size_t n, char *ok)
{
    struct sh_xfer *x = pool->mover.xfer;
    memset(ok, 0, n);
    if (sh_pool_drain(pool, v, n) != 0)
        return;
    ev_compare(pool, v, n, ok); /* ok[k] says "failed" until the loop below */
    uint64_t now = __atomic_load_n(&pool->clock, __ATOMIC_RELAXED);
    for (size_t k = 0; k < n; k++) {
        struct region *r = v[k];
        /* Drained: the copies are done. Work issued since they began may
         * have written the device chunks under them: that region stays. So
         * does one whose bytes changed with no work naming it. */
        int copied = !ok[k] && sh_xfer_wait_seq(x, SH_D2H, r->mv_first, r->mv_last) == 0;
        int unused = sh_pool_issued_at(pool, r) == r->ev_issued || pool->mover.plant_lost_write;
        int verdict = copied && unused ? ev_unchanged(pool, r) : -1, same = verdict == 1;
        ok[k] = 0;
        if (verdict == 0)
            sh_pool_unseen_write(pool, r, "under an early eviction (which stays resident)");
        if (same)
            sh_pool_check_move(pool, r, r->va, "early eviction");
        if (same && ev_switch(pool, r) == 0) {
            r->evict_clock = now; /* work issued from here on runs on the slabs */
            ok[k] = 1;
        }
    }
}

static void ev_committed(struct sh_pool *pool, struct region *r, void *released)
{
    ev_fp_take(pool, r, 0); /* one ev_unchanged did not take (a planted loss) */
    pthread_mutex_lock(&pool->mu);
    pool->st.early_commits++;
    if (!r->from_kept || r->ahead)
        pool->st.evicted_bytes -= r->mapped; /* counted as they were copied */
    pthread_mutex_unlock(&pool->mu);
    sh_pool_evicted_one(pool, r, released);
}

int sh_pool_evict_commit(struct sh_pool *pool, int all, uintptr_t *out, uintptr_t *back, size_t max,
                         size_t *nout, size_t *nback, size_t *released)
{
    *released = 0;
    int rc = move_commit(pool, &pool->ev, all, max, ev_window, ev_committed, released, out, nout,
                         back, nback);
    sh_chunkcache_trim(pool->cc, *released);
    return rc;
}

void sh_pool_evict_cancel_all(struct sh_pool *pool)
{
    move_cancel_all(pool, &pool->ev);
}

int sh_pool_moving(const struct sh_pool *pool)
{
    return !move_none(&pool->pf) || !move_none(&pool->ev);
}

size_t sh_pool_evict_ready(struct sh_pool *pool, size_t *inflight)
{
    return move_ready(pool, &pool->ev, inflight);
}
