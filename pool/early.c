/* early.c — evictions that overlap compute (move.c has the common
 * machinery and the whole story): fingerprinted at the start (queued ahead
 * of the copies where the mover can), copied into slabs while the region
 * stays on its device chunks, committed in a window that compares the
 * fingerprints and maps the slabs at its address; dropped when work was
 * issued against the region meanwhile or its bytes changed unseen.
 *
 * Locking: move.c's.
 */
#include "pool/region_int.h"

#include "sh_err.h"
#include "sh_log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int ev_fp_take(struct sh_pool *pool, struct region *r, int want);

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
    struct sh_clean_fp *fp;
    int rc = sh_pool_fingerprint_all(pool, &r, NULL, 1, &fp, &pool->st.fingerprint_start_ns);
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
        sh_pool_move_push(pool, &pool->ev, r, &pool->st.early_evictions);
        return 0;
    }
    /* Copied ahead: its slabs were taken above, and taking more here
     * would lose those for the process's life. */
    if (!r->ahead && sh_pool_get_slabs(pool, r, 0) != 0) {
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
    sh_pool_move_push(pool, &pool->ev, r, &pool->st.early_evictions);
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
    if (spans(r))
        mask |= __atomic_load_n(&pool->spanned_streams, __ATOMIC_RELAXED);
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

/* 1 when a region at vas[0..n) could move early but for work issued
 * against it since the last drain (ev_idle says no). */
static int any_used(struct sh_pool *pool, const uintptr_t *vas, size_t n)
{
    int used = 0;
    pthread_mutex_lock(&pool->mu);
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n && !used; i++) {
        const struct region *r = sh_rindex_lookup(pool->index, vas[i]);
        used = r && r->va == vas[i] && r->path != SH_PATH_SLAB && !r->pinned &&
               __atomic_load_n(&r->state, __ATOMIC_RELAXED) == SH_RS_RESIDENT &&
               !ev_idle(pool, r, sh_pool_issued_at(pool, r));
    }
    sh_rw_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
    return used;
}

/* Under pressure the windows that drain come as moves land or allocations
 * wait, and a region used since the last one waited for the next while the
 * link idled: ResNet-50's first activations went out only once the card was
 * full. A drain now costs what a window's does (the work issued so far and
 * the copies on the link) and lets the planner's choice start at once. */
int sh_pool_evict_drain(struct sh_pool *pool, const uintptr_t *vas, size_t n)
{
    if (n == 0 || pool->mover.drain_streams || !pool->mover.xfer || sh_gate_held_any() ||
        __atomic_load_n(&pool->no_early, __ATOMIC_RELAXED) || !any_used(pool, vas, n) ||
        sh_pool_window_lock(pool) != 0)
        return 0;
    int rc = sh_pool_drain_device(pool);
    sh_gate_unlock(pool->mover.gate);
    return rc == 0;
}

int sh_pool_evict_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                        size_t *nstarted)
{
    if (__atomic_load_n(&pool->no_early, __ATOMIC_RELAXED)) {
        *nstarted = 0;
        return 0; /* no fingerprint to tell a lost write by (ev_snapshot) */
    }
    return sh_pool_move_start(pool, vas, n, started, nstarted, ev_startable, ev_start_one);
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
static void ev_compare(struct sh_pool *pool, struct region **v, size_t n, uint64_t window,
                       char *bad)
{
    struct region **sel = malloc(n * sizeof *sel);
    size_t m = 0;
    for (size_t k = 0; sel && k < n; k++)
        if (v[k]->from_kept && sh_pool_issued_at(pool, v[k]) == v[k]->ev_issued)
            sel[m++] = v[k];
    sh_pool_kept_compare(pool, sel, m, window);
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
            failed = sh_pool_window_copy(pool, SH_D2H, c->slab->staging, sel[j]->va + c->off,
                                         c->size) != 0;
        }
    failed |= m && sh_pool_flush(pool, SH_D2H) != 0; /* which copy failed is unknown */
    for (size_t k = 0; k < n; k++)
        bad[k] = !sel || (failed && v[k]->from_kept);
    free(sel);
}

/* 1 when r's chunks hold the bytes its copy ahead read: clean against its
 * kept copy, or now_fp (this window's) equal to ev_fp (its start's). */
static int same_as_start(const struct region *r)
{
    int same = 1;
    for (unsigned i = 0; i < r->nchunks; i++)
        same &= r->chunks[i].clean || sh_clean_fp_equal(r->chunks[i].now_fp, r->chunks[i].ev_fp);
    return same;
}

/* In the window (drained), for each region of v that cand[k] names (its
 * copies done, no work issued on it since its start): whether its device
 * bytes are those its copy ahead read, by fingerprint, into verdict[k]: 1
 * yes, 0 they changed, -1 they could not be fingerprinted (the region
 * stays, nothing is proved); -1 too for the others. Chunks found clean keep
 * their kept copy and need no match; a region whose copies were all made
 * in the window (kept copies, nothing copied ahead) needs none. One call
 * to the device for all. */
static void ev_unchanged(struct sh_pool *pool, struct region **v, size_t n, uint64_t window,
                         const char *cand, signed char *verdict)
{
    struct region **sel = malloc((n ? n : 1) * (sizeof *sel + sizeof(size_t)));
    size_t *idx = sel ? (size_t *)(sel + (n ? n : 1)) : NULL, m = 0;
    for (size_t k = 0; k < n; k++) {
        struct region *r = v[k];
        verdict[k] = -1;
        if (!cand[k])
            continue;
        if ((r->from_kept && !r->ahead) || pool->mover.plant_lost_write) {
            verdict[k] = 1;
        } else if (r->now_window == window && ev_fp_take(pool, r, 1) == 0) {
            verdict[k] = (signed char)same_as_start(r); /* ev_compare fingerprinted it */
        } else if (ev_fp_take(pool, r, 1) == 0 && sel) {
            sel[m] = r;
            idx[m++] = k;
        }
    }
    struct sh_clean_fp *now = NULL;
    if (m && sh_pool_fingerprint_all(pool, sel, NULL, m, &now, NULL) == 0)
        for (size_t s = 0, j = 0; s < m; s++) {
            struct region *r = sel[s];
            for (unsigned i = 0; i < r->nchunks; i++, j++)
                r->chunks[i].now_fp = now[j];
            verdict[idx[s]] = (signed char)same_as_start(r);
        }
    free(now);
    free(sel);
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

/* Moves the regions that ok[k] marks 2 to their slabs (gate held), their
 * device bytes read by one prefilter first; ok[k] becomes 1 or 0. */
static void ev_switch_all(struct sh_pool *pool, struct region **v, size_t n, char *ok)
{
    struct region **go = malloc(n * sizeof *go);
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        if (ok[k] == 2) {
            v[k]->no_ptrs = 0; /* without the prefilter the CPU scans the landing whole */
            if (go)
                go[m++] = v[k];
        }
    sh_pool_scan_prefilter(pool, go, m); /* the device bytes, before they leave */
    free(go);
    uint64_t now = __atomic_load_n(&pool->clock, __ATOMIC_RELAXED);
    for (size_t k = 0; k < n; k++) {
        if (ok[k] != 2)
            continue;
        ok[k] = ev_switch(pool, v[k]) == 0;
        if (ok[k])
            v[k]->evict_clock = now; /* work issued from here on runs on the slabs */
        else
            v[k]->no_ptrs = 0; /* it stays: no landing to skip */
    }
}

/* The commit window (gate held): ok[k] is 1 for each region of v now on
 * its slabs, 0 for those left on their device chunks. */
static void ev_window(struct sh_pool *pool, struct region **v, size_t n, char *ok)
{
    struct sh_xfer *x = pool->mover.xfer;
    memset(ok, 0, n);
    if (sh_pool_drain(pool, v, n) != 0)
        return;
    uint64_t window = ++pool->ev_windows; /* fingerprints taken in it serve it alone */
    ev_compare(pool, v, n, window, ok);   /* ok[k] says "failed" until the loop below */
    char *cand = malloc((n ? n : 1) * 2);
    signed char *verdict = cand ? (signed char *)cand + n : NULL;
    for (size_t k = 0; k < n; k++) {
        struct region *r = v[k];
        /* Drained: the copies are done. Work issued since they began may
         * have written the device chunks under them: that region stays. So
         * does one whose bytes changed with no work naming it. */
        int copied = !ok[k] && sh_xfer_wait_seq(x, SH_D2H, r->mv_first, r->mv_last) == 0;
        int unused = sh_pool_issued_at(pool, r) == r->ev_issued || pool->mover.plant_lost_write;
        ok[k] = 0;
        if (cand)
            cand[k] = (char)(copied && unused);
    }
    if (!cand)
        return; /* they all stay */
    ev_unchanged(pool, v, n, window, cand, verdict);
    for (size_t k = 0; k < n; k++) {
        ok[k] = verdict[k] == 1 ? 2 : 0; /* 2: to move */
        if (verdict[k] == 0)
            sh_pool_unseen_write(pool, v[k], "under an early eviction (which stays resident)");
        if (verdict[k] == 1)
            sh_pool_check_move(pool, v[k], v[k]->va, "early eviction");
    }
    free(cand);
    ev_switch_all(pool, v, n, ok);
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
    int rc = sh_pool_move_commit(pool, &pool->ev, all, max, ev_window, ev_committed, released, out,
                                 nout, back, nback);
    sh_chunkcache_trim(pool->cc, *released);
    return rc;
}

void sh_pool_evict_cancel_all(struct sh_pool *pool)
{
    sh_pool_move_cancel_all(pool, &pool->ev);
}

size_t sh_pool_evict_ready(struct sh_pool *pool, size_t *inflight)
{
    return sh_pool_move_ready(pool, &pool->ev, inflight);
}

void sh_pool_ev_cancel(struct sh_pool *pool, struct region *r)
{
    if (r->stuck) {
        ev_fp_take(pool, r, 0);
        sh_pool_make_stuck(pool, r, "early eviction");
    } else {
        ev_abandon(pool, r);
    }
}
