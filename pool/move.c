/* move.c — moves that overlap compute, whatever their direction: the
 * lists of those in flight, their start (pick, then start each), their
 * commit (a batch in one window) and their cancel. prefetch.c and early.c
 * are the two directions.
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

#include <stdlib.h>
#include <string.h>

/* Appends r to l, counting it in *started (a pool->st counter); its
 * copies are mv_first..mv_last. */
void sh_pool_move_push(struct sh_pool *pool, struct move_list *l, struct region *r,
                       uint64_t *started)
{
    pthread_mutex_lock(&pool->mu);
    ++*started;
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

/* 1 when l is empty; without the lock, as a launch asks on every call:
 * a move that starts meanwhile is one a lock taken a moment earlier would
 * have missed too (the issue stamps cover what it copies). */
int sh_pool_move_none(const struct move_list *l)
{
    return __atomic_load_n(&l->count, __ATOMIC_RELAXED) == 0;
}

/* Moves on l whose copies have finished; *inflight (may be NULL) gets all. */
size_t sh_pool_move_ready(struct sh_pool *pool, struct move_list *l, size_t *inflight)
{
    size_t ready = 0;
    if (inflight)
        *inflight = 0;
    if (sh_pool_move_none(l))
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

void sh_pool_move_cancel(struct sh_pool *pool, struct region *r)
{
    struct move_list *l = r->state == SH_RS_RESTORING ? &pool->pf : &pool->ev;
    sh_xfer_wait_seq(pool->mover.xfer, l->dir, r->mv_first, r->mv_last);
    l->cancel(pool, r);
}

/* Cancels every move on l (teardown). */
void sh_pool_move_cancel_all(struct sh_pool *pool, struct move_list *l)
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
 * holds the gate or a stream captures. */
int sh_pool_move_commit(struct sh_pool *pool, struct move_list *l, int all, size_t max,
                        void (*window)(struct sh_pool *, struct region **, size_t, char *),
                        void (*committed)(struct sh_pool *, struct region *, void *), void *arg,
                        uintptr_t *out, size_t *nout, uintptr_t *back, size_t *nback)
{
    *nout = *nback = 0;
    if (!pool->mover.xfer || max == 0)
        return 0;
    if (sh_gate_held_any())
        return SH_EBUSY; /* as in sh_pool_evict_these */
    struct region **v = malloc(max * (sizeof *v + 1));
    if (!v)
        return SH_ENOMEM;
    char *ok = (char *)(v + max);
    pthread_mutex_lock(&pool->move_mu);
    size_t n = move_take_batch(pool, l, all, v, max);
    int rc = 0;
    memset(ok, 0, n);
    if (n && (rc = sh_pool_window_lock(pool)) == 0) {
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

/* Starts the moves of the regions starting at vas[0..n) that pick() takes
 * (it moves their state; mu and the index lock held) with start_one(). */
int sh_pool_move_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
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

int sh_pool_moving(const struct sh_pool *pool)
{
    return !sh_pool_move_none(&pool->pf) || !sh_pool_move_none(&pool->ev);
}
