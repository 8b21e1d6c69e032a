/* keep.c — clean regions: host copies kept after a restore, and the
 * fingerprints that let an eviction skip its copy.
 *
 * When a region is restored (on demand or by a prefetch's commit) its
 * slabs can stay allocated, unmapped from its address, as a copy of its
 * bytes as they were then, with a fingerprint of them taken on the device
 * in the restore's window (clean.h). At its next eviction the slabs are the
 * eviction's own, and inside the window, drained and gated, so that
 * nothing can write the region from the fingerprint to the unmap, its
 * device bytes are fingerprinted again: chunks that match need no copy.
 * Whatever wrote the region meanwhile, seen by the launch scan or not, it
 * changed those bytes; nothing here trusts the scan.
 *
 * Kept copies are the first host memory given up when a slab is needed
 * (sh_pool_kept_reclaim, oldest first), and go with the region's free,
 * pin or unmapping. A region found dirty evictions in a row stops keeping
 * copies for a while (clean/learn.c), and so stops paying for
 * fingerprints.
 *
 * Locking: pool->mu guards the kept list, has_kept and each RESIDENT
 * region's chunk->kept: a region leaves RESIDENT under mu and its copies
 * leave the list with it (to its eviction as slabs, or back to the host
 * pool). From then on its owner (the thread that moved its state) alone
 * touches its slabs, fingerprints and learning record. Fingerprints run in
 * remap windows only.
 */
#include "pool/region_int.h"

#include "sh_clock.h"
#include "sh_err.h"
#include "sh_log.h"

#include <stdlib.h>

/* ---- the kept list (mu held) ---- */

static void list_push(struct sh_pool *pool, struct region *r)
{
    r->kept_next = NULL;
    r->kept_prev = pool->kept_tail;
    if (pool->kept_tail)
        pool->kept_tail->kept_next = r;
    else
        pool->kept_head = r;
    pool->kept_tail = r;
    r->has_kept = 1;
    pool->st.kept_bytes += r->mapped;
}

static void list_unlink(struct sh_pool *pool, struct region *r)
{
    if (r->kept_prev)
        r->kept_prev->kept_next = r->kept_next;
    else
        pool->kept_head = r->kept_next;
    if (r->kept_next)
        r->kept_next->kept_prev = r->kept_prev;
    else
        pool->kept_tail = r->kept_prev;
    r->kept_prev = r->kept_next = NULL;
    r->has_kept = 0;
    pool->st.kept_bytes -= r->mapped;
}

/* r's kept copies become its slabs. */
static void kept_to_slabs(struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        r->chunks[i].slab = r->chunks[i].kept;
        r->chunks[i].kept = NULL;
    }
}

void sh_pool_kept_take(struct sh_pool *pool, struct region *r, int early)
{
    r->from_kept = r->has_kept;
    r->spoiled = 0;
    r->ahead = 0;
    for (unsigned i = 0; i < r->nchunks; i++)
        r->chunks[i].clean = 0;
    if (!r->has_kept)
        return;
    list_unlink(pool, r);
    if (!early) /* an early eviction decides at its start (sh_pool_kept_changed) */
        kept_to_slabs(r);
}

int sh_pool_kept_changed(const struct region *r)
{
    int changed = 0;
    for (unsigned i = 0; i < r->nchunks && !changed; i++)
        changed = !sh_clean_fp_equal(r->chunks[i].ev_fp, r->chunks[i].fp);
    return changed;
}

void sh_pool_kept_ahead_off(struct region *r)
{
    r->ahead = 0;
    kept_to_slabs(r);
}

void sh_pool_kept_ahead(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        struct sh_slab *spare = c->clean ? c->slab : c->kept;
        if (c->clean) /* the copy kept is the bytes: the one made ahead is not needed */
            c->slab = c->kept;
        c->kept = NULL;
        sh_hostpool_put(pool->mover.host, spare);
    }
    r->spoiled = 1; /* its slabs are what the eviction made of them */
}

struct sh_slab *sh_pool_kept_detach(struct sh_pool *pool, struct region *r)
{
    struct sh_slab *list = NULL;
    if (!r->has_kept)
        return NULL;
    list_unlink(pool, r);
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct sh_slab *s = r->chunks[i].kept;
        r->chunks[i].kept = NULL;
        s->next = list; /* off every free list while kept: the link is ours */
        list = s;
    }
    return list;
}

void sh_pool_kept_put(struct sh_pool *pool, struct sh_slab *list)
{
    while (list) {
        struct sh_slab *next = list->next;
        sh_hostpool_put(pool->mover.host, list);
        list = next;
    }
}

size_t sh_pool_kept_reclaim(struct sh_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    struct region *r = pool->kept_head;
    size_t bytes = r ? r->mapped : 0;
    struct sh_slab *list = r ? sh_pool_kept_detach(pool, r) : NULL;
    if (r)
        pool->st.kept_dropped++;
    pthread_mutex_unlock(&pool->mu);
    sh_pool_kept_put(pool, list);
    return bytes;
}

/* ---- fingerprints (in windows) ---- */

/* The chunks of v[0..n) as ranges, v[k]'s at base[k] (its own address when
 * base is NULL): addr[] then len[] in one allocation, *total of them. */
static uintptr_t *ranges_of(struct region *const *v, const uintptr_t *base, size_t n, size_t **len,
                            size_t *total)
{
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        m += v[k]->nchunks;
    uintptr_t *addr = malloc((m ? m : 1) * (sizeof *addr + sizeof(size_t)));
    if (!addr)
        return NULL;
    *len = (size_t *)(addr + m);
    *total = m;
    for (size_t k = 0, j = 0; k < n; k++)
        for (unsigned i = 0; i < v[k]->nchunks; i++, j++) {
            addr[j] = (base ? base[k] : v[k]->va) + v[k]->chunks[i].off;
            (*len)[j] = v[k]->chunks[i].size;
        }
    return addr;
}

static void count_fingerprints(struct sh_pool *pool, struct region *const *v, size_t n, int rc,
                               const uint64_t bus[2])
{
    pthread_mutex_lock(&pool->mu);
    for (size_t k = 0; k < n; k++) {
        pool->st.fingerprints += v[k]->nchunks;
        pool->st.fingerprinted_bytes += rc == 0 ? v[k]->mapped : 0;
    }
    pool->st.evicted_bytes += bus[SH_D2H]; /* every byte that crosses the bus */
    pool->st.restored_bytes += bus[SH_H2D];
    pthread_mutex_unlock(&pool->mu);
}

int sh_pool_fingerprint_all(struct sh_pool *pool, struct region *const *v, const uintptr_t *base,
                            size_t n, struct sh_clean_fp **out, uint64_t *waited_ns)
{
    *out = NULL;
    if (!pool->mover.fingerprint)
        return SH_EDRIVER;
    size_t *len, total = 0;
    uintptr_t *addr = ranges_of(v, base, n, &len, &total);
    struct sh_clean_fp *fp = addr ? malloc((total ? total : 1) * sizeof *fp) : NULL;
    if (!fp) {
        free(addr);
        return SH_ENOMEM;
    }
    uint64_t bus[2] = {0, 0}, t0 = sh_clock_ns();
    int rc = total ? pool->mover.fingerprint(pool->mover.fp_ctx, addr, len, total, fp, bus) : 0;
    uint64_t waited = sh_clock_ns() - t0;
    __atomic_add_fetch(&pool->st.fingerprint_ns, waited, __ATOMIC_RELAXED);
    if (waited_ns)
        __atomic_add_fetch(waited_ns, waited, __ATOMIC_RELAXED);
    free(addr);
    count_fingerprints(pool, v, n, rc, bus);
    if (rc)
        free(fp);
    else
        *out = fp;
    return rc;
}

int sh_pool_fingerprint_queue(struct sh_pool *pool, struct region *r, int dir, uint64_t *ticket)
{
    if (!pool->mover.fingerprint_queue || !pool->mover.fingerprint_take)
        return SH_EDRIVER;
    size_t *len, total;
    uintptr_t *addr = ranges_of(&r, NULL, 1, &len, &total);
    if (!addr)
        return SH_ENOMEM;
    uint64_t bus[2] = {0, 0};
    int rc = pool->mover.fingerprint_queue(pool->mover.fp_ctx, addr, len, total, dir, ticket, bus);
    free(addr);
    if (rc == 0) /* one that was not queued is taken at once, and counted then */
        count_fingerprints(pool, &r, 1, 0, bus);
    return rc;
}

int sh_pool_fingerprint_take(struct sh_pool *pool, const struct region *r, uint64_t ticket,
                             struct sh_clean_fp *out)
{
    uint64_t t0 = sh_clock_ns();
    int rc = pool->mover.fingerprint_take(pool->mover.fp_ctx, ticket, r->nchunks, out);
    __atomic_add_fetch(&pool->st.fingerprint_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    return rc;
}

/* A drain of the whole device, where the window's own drain may have
 * waited only for the streams the scan named: a writer it did not see
 * must be done before its bytes are judged. */
static int drain_all(struct sh_pool *pool)
{
    if (!pool->mover.drain_streams)
        return 0; /* the window drained the device already */
    return sh_pool_drain_device(pool);
}

void sh_pool_kept_compare(struct sh_pool *pool, struct region **v, size_t n, uint64_t window)
{
    struct region **sel = malloc((n ? n : 1) * sizeof *sel);
    size_t m = 0;
    for (size_t k = 0; sel && k < n; k++)
        if (v[k]->from_kept)
            sel[m++] = v[k];
    struct sh_clean_fp *now = NULL;
    /* none to compare, or the device cannot be waited for: copy all */
    if (m && drain_all(pool) == 0 && sh_pool_fingerprint_all(pool, sel, NULL, m, &now, NULL) == 0)
        for (size_t k = 0, j = 0; k < m; k++) {
            struct region *r = sel[k];
            int dirty = 0;
            for (unsigned i = 0; i < r->nchunks; i++, j++) {
                r->chunks[i].clean = sh_clean_fp_equal(now[j], r->chunks[i].fp);
                r->chunks[i].now_fp = now[j];
                dirty |= !r->chunks[i].clean;
            }
            r->now_window = window;
            /* Changed, and no work named it since its restore: copied in
             * this window all the same, but something writes through
             * pointers the library cannot see. */
            if (dirty && sh_pool_issued_at(pool, r) == r->kept_issued)
                sh_pool_unseen_write(pool, r, "since its restore");
        }
    free(now);
    free(sel);
}

void sh_pool_kept_mark(struct sh_pool *pool, struct region **v, const uintptr_t *base, size_t n)
{
    struct region **sel = malloc((n ? n : 1) * (sizeof *sel + sizeof *base));
    uintptr_t *at = sel ? (uintptr_t *)(sel + (n ? n : 1)) : NULL;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        struct region *r = v[k];
        r->keep_next = 0;
        if (sel && pool->mover.clean_skip && !r->pinned && !r->stuck &&
            sh_clean_learn_keep(&r->learn)) {
            sel[m] = r;
            at[m++] = base[k];
        }
    }
    struct sh_clean_fp *fp = NULL;
    if (m && sh_pool_fingerprint_all(pool, sel, at, m, &fp, NULL) == 0)
        for (size_t k = 0, j = 0; k < m; k++) {
            struct region *r = sel[k];
            for (unsigned i = 0; i < r->nchunks; i++, j++)
                r->chunks[i].fp = fp[j];
            r->keep_next = 1;
            r->kept_issued = sh_pool_issued_at(pool, r); /* in the window: nothing is issued */
        }
    free(fp);
    free(sel);
}

/* ---- after the window ---- */

/* r is RESIDENT again, on its device chunks; its slabs become its kept
 * copies (keep) or go back to the host pool. */
static void settle_resident(struct sh_pool *pool, struct region *r, int keep)
{
    if (!keep)
        sh_pool_give_back_slabs(pool, r);
    pthread_mutex_lock(&pool->mu);
    if (keep) {
        for (unsigned i = 0; i < r->nchunks; i++) {
            r->chunks[i].kept = r->chunks[i].slab;
            r->chunks[i].slab = NULL;
        }
        list_push(pool, r); /* with the state: a RESIDENT region's copies are on the list */
    }
    int from = r->state;
    sh_state_move(&r->state, SH_RS_RESIDENT, r->id);
    pool->st.regions[from]--;
    pool->st.regions[SH_RS_RESIDENT]++;
    pthread_mutex_unlock(&pool->mu);
}

void sh_pool_kept_restored(struct sh_pool *pool, struct region *r)
{
    int keep = r->keep_next;
    r->keep_next = 0;
    settle_resident(pool, r, keep);
}

void sh_pool_kept_unevict(struct sh_pool *pool, struct region *r)
{
    if (r->ahead && !r->spoiled) { /* the slabs copied ahead go; the kept copy stays */
        sh_pool_give_back_slabs(pool, r);
        kept_to_slabs(r);
    }
    int keep = r->from_kept && !r->spoiled;
    r->from_kept = r->ahead = 0;
    settle_resident(pool, r, keep);
}

size_t sh_pool_kept_evicted(struct sh_pool *pool, struct region *r)
{
    size_t dirty = 0, clean = 0;
    for (unsigned i = 0; i < r->nchunks; i++) {
        if (r->chunks[i].clean)
            clean += r->chunks[i].size;
        else
            dirty += r->chunks[i].size;
    }
    if (r->from_kept) {
        sh_clean_learn_note(&r->learn, dirty == 0);
        if (dirty == 0)
            __atomic_add_fetch(&r->unchanged, 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&pool->mu);
        pool->st.clean_evictions += dirty == 0;
        pool->st.dirty_evictions += dirty != 0;
        pool->st.clean_bytes += r->ahead ? 0 : clean; /* copied ahead: nothing was saved */
        pthread_mutex_unlock(&pool->mu);
    }
    size_t copied = r->ahead ? r->mapped : dirty;
    r->from_kept = r->ahead = 0;
    return copied;
}

void sh_pool_kept_of(struct sh_pool *pool, const uintptr_t *bases, size_t n, uint8_t *out)
{
    pthread_mutex_lock(&pool->mu); /* guards has_kept; then the index */
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        const struct region *r = sh_rindex_lookup(pool->index, bases[i]);
        out[i] = r && r->has_kept;
    }
    sh_rw_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->mu);
}
