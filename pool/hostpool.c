/* hostpool.c — pinned host slabs for evicted chunks.
 *
 * A slab is a host-located physical handle (cuMemCreate on the GPU's NUMA
 * node) mapped at a staging address the CPU and the GPU can both reach, so
 * copies and checksums work on it while it is also mapped at a region's
 * address. Slabs come in size classes; a request takes the class of its
 * own size, since the driver maps a handle only whole. Pinning is slow
 * (1-2 GB/s), so it stays off the caller's path where it can: some slabs
 * may be pinned at create, and a background thread grows each class
 * towards its target of free slabs, up to the RAM budget; a dormant pool
 * (a device far below its limit) only from sh_hostpool_wake on. A caller
 * that finds nothing free waits for it; when the budget is spent, idle
 * slabs of other classes make room for its slab.
 *
 * With a shared budget (params.share: processes on one node), every slab's
 * bytes are reserved from it before the slab is pinned and given back after
 * it is unpinned. A refusal fails the callers waiting for that class, as a
 * spent budget of our own does, but only for now: the grower stops growing
 * towards its targets, and the next caller that finds nothing free asks
 * again (another process may have left, or died, meanwhile).
 *
 * Locking: hp->mu guards the free lists and counters; the grower creates
 * and maps slabs without it.
 */
#include "pool/pool.h"

#include "sh_err.h"
#include "sh_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct slab_class {
    size_t size;
    unsigned target; /* free slabs the grower keeps ready */
    unsigned total, free_count;
    uint64_t wanted;   /* requests that found the class empty */
    uint64_t refusals; /* times the shared budget refused a slab of this class */
    struct sh_slab *free;
};

struct sh_hostpool {
    struct sh_vmm_ops vmm;
    size_t gran, budget, pinned;
    unsigned nclasses;
    struct slab_class cls[SH_HOSTPOOL_MAX_CLASSES];
    pthread_mutex_t mu;
    pthread_cond_t more, grow;
    pthread_t grower;
    int running, stop, exhausted_logged;
    int awake;      /* grows towards the targets (sh_hostpool_wake) */
    int share_full; /* the shared budget refused the last slab asked for */
    struct sh_hostpool_share share;
    struct sh_slab *all; /* every slab, for teardown */
    struct sh_hostpool_stats st;
};

static size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

/* The staging mapping: the CPU reads slabs there too (pointer scan,
 * checksums), which a device address allows only when asked. */
static int map_staging(struct sh_hostpool *hp, struct sh_slab *s)
{
    if (hp->vmm.map_host)
        return hp->vmm.map_host(hp->vmm.ctx, s->staging, s->size, s->handle);
    return hp->vmm.map(hp->vmm.ctx, s->staging, s->size, s->handle);
}

/* Pins one slab of class c; mu not held. */
static int slab_make(struct sh_hostpool *hp, unsigned c, struct sh_slab **out)
{
    struct sh_slab *s = calloc(1, sizeof *s);
    if (!s)
        return SH_ENOMEM;
    s->size = hp->cls[c].size;
    s->cls = (int)c;
    int rc = hp->vmm.create(hp->vmm.ctx, s->size, SH_LOC_HOST, &s->handle);
    if (rc == 0) {
        rc = hp->vmm.reserve(hp->vmm.ctx, s->size, hp->gran, &s->staging);
        if (rc == 0 && (rc = map_staging(hp, s)) != 0)
            hp->vmm.unreserve(hp->vmm.ctx, s->staging, s->size);
        if (rc)
            hp->vmm.release(hp->vmm.ctx, s->handle);
    }
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* A slab's bytes from the shared budget: 0, or 1 when it has none to spare
 * (or the pid is a fork child's). */
static int share_take(struct sh_hostpool *hp, size_t bytes)
{
    return hp->share.reserve && hp->share.reserve(hp->share.ctx, bytes) != 0;
}

static void share_give(struct sh_hostpool *hp, size_t bytes)
{
    if (hp->share.release)
        hp->share.release(hp->share.ctx, bytes);
}

/* slab_make within the shared budget; *refused set when it said no. A
 * slab a caller waits for (wanted) may have other pools give back idle
 * ones first (a few times: another pool's grower may take the bytes back
 * before this one asks again). */
static int slab_pin(struct sh_hostpool *hp, unsigned c, int wanted, struct sh_slab **out,
                    int *refused)
{
    size_t size = hp->cls[c].size;
    *refused = share_take(hp, size);
    for (int tries = 0; *refused && wanted && hp->share.reclaim && tries < 3 &&
                        hp->share.reclaim(hp->share.ctx, size);
         tries++)
        *refused = share_take(hp, size);
    if (*refused)
        return SH_ENOMEM;
    int rc = slab_make(hp, c, out);
    if (rc)
        share_give(hp, hp->cls[c].size);
    return rc;
}

static void slab_unmake(struct sh_hostpool *hp, struct sh_slab *s)
{
    size_t size = s->size;
    hp->vmm.unmap(hp->vmm.ctx, s->staging, s->size);
    hp->vmm.unreserve(hp->vmm.ctx, s->staging, s->size);
    hp->vmm.release(hp->vmm.ctx, s->handle);
    free(s);
    share_give(hp, size);
}

/* Adds a new slab to its class; mu held. */
static void slab_add(struct sh_hostpool *hp, struct sh_slab *s)
{
    struct slab_class *k = &hp->cls[s->cls];
    s->next = k->free;
    k->free = s;
    s->all_next = hp->all;
    hp->all = s;
    k->total++;
    k->free_count++;
    hp->pinned += s->size;
}

/* Bytes of free slabs in classes other than c: a slab a caller waits for
 * may take their place when the budget is spent; mu held. */
static size_t idle_bytes(const struct sh_hostpool *hp, unsigned c)
{
    size_t b = 0;
    for (unsigned k = 0; k < hp->nclasses; k++)
        if (k != c)
            b += (size_t)hp->cls[k].free_count * hp->cls[k].size;
    return b;
}

/* 1 if a slab of class c fits the budget, counting idle slabs of other
 * classes as room when reclaim is set; mu held. */
static int fits(const struct sh_hostpool *hp, unsigned c, int reclaim)
{
    return hp->pinned + hp->cls[c].size <= hp->budget + (reclaim ? idle_bytes(hp, c) : 0);
}

/* The class the grower should add to next, or -1; mu held. Classes that
 * callers found empty go first, even at the cost of idle slabs of other
 * classes; then those below their target, within the budget. */
static int grow_choice(const struct sh_hostpool *hp)
{
    int best = -1;
    for (unsigned c = 0; c < hp->nclasses; c++) {
        const struct slab_class *k = &hp->cls[c];
        if (k->wanted && fits(hp, c, 1))
            return (int)c;
        if (best < 0 && hp->awake && !hp->share_full && k->free_count < k->target && fits(hp, c, 0))
            best = (int)c;
    }
    return best;
}

/* Takes the first free slab of class k off the pool; mu held. */
static struct sh_slab *unlink_free(struct sh_hostpool *hp, unsigned k)
{
    struct slab_class *sc = &hp->cls[k];
    struct sh_slab *s = sc->free, **pp = &hp->all;
    sc->free = s->next;
    sc->free_count--;
    sc->total--;
    hp->pinned -= s->size;
    while (*pp != s)
        pp = &(*pp)->all_next;
    *pp = s->all_next;
    return s;
}

/* Takes idle slabs of other classes, smallest first, off the pool until a
 * slab of class c fits the budget; they are unpinned without mu. mu held. */
static struct sh_slab *reclaim(struct sh_hostpool *hp, unsigned c)
{
    struct sh_slab *out = NULL;
    for (unsigned k = 0; k < hp->nclasses && !fits(hp, c, 0); k++)
        while (k != c && hp->cls[k].free && !fits(hp, c, 0)) {
            struct sh_slab *s = unlink_free(hp, k);
            s->next = out;
            out = s;
        }
    return out;
}

/* The shared budget refused a slab of class c: its waiters give up; mu held. */
static void refuse(struct sh_hostpool *hp, unsigned c)
{
    hp->share_full = 1;
    hp->st.refused++;
    hp->cls[c].refusals++;
    hp->cls[c].wanted = 0;
    pthread_cond_broadcast(&hp->more);
}

static void *grower_main(void *arg)
{
    struct sh_hostpool *hp = arg;
    pthread_mutex_lock(&hp->mu);
    while (!hp->stop) {
        int c = grow_choice(hp);
        if (c < 0) {
            pthread_cond_wait(&hp->grow, &hp->mu);
            continue;
        }
        struct sh_slab *idle = reclaim(hp, (unsigned)c);
        int wanted = hp->cls[c].wanted != 0;
        hp->pinned += hp->cls[c].size; /* claim the budget before dropping the lock */
        pthread_mutex_unlock(&hp->mu);
        while (idle) { /* unpinned before the new slab is pinned */
            struct sh_slab *next = idle->next;
            slab_unmake(hp, idle);
            idle = next;
        }
        struct sh_slab *s = NULL;
        int refused = 0;
        int rc = slab_pin(hp, (unsigned)c, wanted, &s, &refused);
        pthread_mutex_lock(&hp->mu);
        hp->pinned -= hp->cls[c].size;
        if (refused) {
            refuse(hp, (unsigned)c);
            continue;
        }
        if (rc) {
            /* The host is out of pinnable memory: stop at what we have. */
            hp->budget = hp->pinned;
            hp->cls[c].wanted = 0;
            pthread_cond_broadcast(&hp->more);
            continue;
        }
        if (hp->cls[c].wanted)
            hp->cls[c].wanted--;
        hp->share_full = 0;
        slab_add(hp, s);
        hp->st.grown++;
        pthread_cond_broadcast(&hp->more);
    }
    pthread_mutex_unlock(&hp->mu);
    return NULL;
}

/* Pins the targets, smallest classes first, up to `bytes`, and no further
 * than the shared budget allows. */
static int prepin(struct sh_hostpool *hp, size_t bytes)
{
    for (unsigned c = 0; c < hp->nclasses; c++)
        for (unsigned n = 0; n < hp->cls[c].target; n++) {
            size_t after = hp->pinned + hp->cls[c].size;
            if (after > bytes || after > hp->budget)
                break;
            struct sh_slab *s;
            int refused = 0, rc = slab_pin(hp, c, 0, &s, &refused);
            if (refused) {
                hp->st.refused++;
                hp->share_full = 1;
                return SH_OK;
            }
            if (rc)
                return rc;
            slab_add(hp, s);
        }
    return SH_OK;
}

static void configured_classes(struct sh_hostpool *hp, const struct sh_hostpool_params *p)
{
    for (unsigned i = 0; i < p->nclasses; i++) {
        /* A class below the granularity cannot back a chunk: lift it, merging duplicates. */
        size_t size = round_up(p->class_bytes[i], p->granularity);
        if (hp->nclasses && hp->cls[hp->nclasses - 1].size >= size) {
            hp->cls[hp->nclasses - 1].target += p->slabs[i];
            continue;
        }
        hp->cls[hp->nclasses++] = (struct slab_class){.size = size, .target = p->slabs[i]};
    }
}

/* One class per chunk size, increasing; the configured targets go to the
 * chunk size each configured class rounds up to. */
static void chunk_classes(struct sh_hostpool *hp, const struct sh_hostpool_params *p)
{
    size_t sizes[SH_HOSTPOOL_MAX_CLASSES];
    unsigned n = 0;
    for (size_t c = p->chunk_max; c >= p->granularity && n < SH_HOSTPOOL_MAX_CLASSES; c >>= 1)
        if (c % p->granularity == 0) /* no chunk has another size */
            sizes[n++] = c;
    for (unsigned i = 0; i < n; i++)
        hp->cls[i] = (struct slab_class){.size = sizes[n - 1 - i]};
    hp->nclasses = n;
    for (unsigned i = 0; i < p->nclasses; i++)
        for (unsigned k = 0; k < n; k++)
            if (hp->cls[k].size >= p->class_bytes[i]) {
                hp->cls[k].target += p->slabs[i];
                break;
            }
}

int sh_hostpool_create(const struct sh_hostpool_params *p, const struct sh_vmm_ops *vmm,
                       struct sh_hostpool **out)
{
    if (!p || !vmm || !out || p->nclasses == 0 || p->nclasses > SH_HOSTPOOL_MAX_CLASSES ||
        p->granularity == 0)
        return SH_EINVAL;
    struct sh_hostpool *hp = calloc(1, sizeof *hp);
    if (!hp)
        return SH_ENOMEM;
    hp->vmm = *vmm;
    hp->gran = p->granularity;
    hp->budget = p->ram_budget;
    hp->share = p->share;
    hp->awake = !p->dormant;
    if (p->chunk_max)
        chunk_classes(hp, p);
    else
        configured_classes(hp, p);
    if (hp->nclasses == 0) {
        free(hp);
        return SH_EINVAL; /* chunk_max below the granularity */
    }
    pthread_mutex_init(&hp->mu, NULL);
    pthread_cond_init(&hp->more, NULL);
    pthread_cond_init(&hp->grow, NULL);
    int rc = prepin(hp, p->prepin);
    if (rc) {
        sh_hostpool_destroy(hp);
        return rc;
    }
    hp->running = p->grow_in_background && pthread_create(&hp->grower, NULL, grower_main, hp) == 0;
    *out = hp;
    return 0;
}

void sh_hostpool_destroy(struct sh_hostpool *hp)
{
    if (!hp)
        return;
    if (hp->running) {
        pthread_mutex_lock(&hp->mu);
        hp->stop = 1;
        pthread_cond_broadcast(&hp->grow);
        pthread_mutex_unlock(&hp->mu);
        pthread_join(hp->grower, NULL);
    }
    while (hp->all) {
        struct sh_slab *s = hp->all;
        hp->all = s->all_next;
        slab_unmake(hp, s);
    }
    pthread_cond_destroy(&hp->more);
    pthread_cond_destroy(&hp->grow);
    pthread_mutex_destroy(&hp->mu);
    free(hp);
}

/* A free slab of class c, whose size is the request's: a larger one could
 * not be mapped at a chunk's address (only whole handles map); mu held. */
static struct sh_slab *take(struct sh_hostpool *hp, unsigned c)
{
    struct slab_class *sc = &hp->cls[c];
    struct sh_slab *s = sc->free;
    if (!s)
        return NULL;
    sc->free = s->next;
    sc->free_count--;
    hp->st.hits++;
    if (sc->free_count < sc->target)
        pthread_cond_signal(&hp->grow);
    return s;
}

static int can_grow(const struct sh_hostpool *hp, unsigned c)
{
    return fits(hp, c, 1);
}

int sh_hostpool_get(struct sh_hostpool *hp, size_t bytes, unsigned wait_ms, struct sh_slab **out)
{
    unsigned c = 0;
    while (c < hp->nclasses && hp->cls[c].size < bytes)
        c++;
    if (c == hp->nclasses || hp->cls[c].size != bytes)
        return SH_EINVAL; /* no class of this size */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += wait_ms / 1000;
    deadline.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&hp->mu);
    struct sh_slab *s;
    int asked = 0;
    uint64_t refusals = hp->cls[c].refusals;
    while (!(s = take(hp, c))) {
        if (!hp->running || !can_grow(hp, c) || hp->cls[c].refusals != refusals)
            break;
        /* One slab per caller: woken by growth elsewhere, it does not ask
         * again, unless what was grown for the class went to someone else. */
        if (!asked || !hp->cls[c].wanted) {
            hp->cls[c].wanted++;
            pthread_cond_signal(&hp->grow);
        }
        hp->st.waits += !asked;
        asked = 1;
        if (pthread_cond_timedwait(&hp->more, &hp->mu, &deadline) == ETIMEDOUT) {
            s = take(hp, c);
            hp->st.timeouts += !s && wait_ms > 0;
            break;
        }
    }
    if (!s)
        hp->st.misses++;
    pthread_mutex_unlock(&hp->mu);
    if (!s)
        return SH_ENOMEM;
    *out = s;
    return 0;
}

/* Takes free slabs off the pool, smallest first, until at least bytes or
 * none is left; mu held. */
static struct sh_slab *shed_list(struct sh_hostpool *hp, size_t bytes, size_t *got)
{
    struct sh_slab *out = NULL;
    for (unsigned k = 0; k < hp->nclasses && *got < bytes; k++)
        while (hp->cls[k].free && *got < bytes) {
            struct sh_slab *s = unlink_free(hp, k);
            *got += s->size;
            s->next = out;
            out = s;
        }
    return out;
}

void sh_hostpool_wake(struct sh_hostpool *hp)
{
    pthread_mutex_lock(&hp->mu);
    if (!hp->awake) {
        hp->awake = 1;
        pthread_cond_signal(&hp->grow);
    }
    pthread_mutex_unlock(&hp->mu);
}

size_t sh_hostpool_shed(struct sh_hostpool *hp, size_t bytes)
{
    size_t got = 0;
    pthread_mutex_lock(&hp->mu);
    struct sh_slab *s = shed_list(hp, bytes, &got);
    hp->st.shed += got;
    pthread_mutex_unlock(&hp->mu);
    while (s) { /* unpinned without mu, as the grower does */
        struct sh_slab *next = s->next;
        slab_unmake(hp, s);
        s = next;
    }
    return got;
}

void sh_hostpool_put(struct sh_hostpool *hp, struct sh_slab *s)
{
    pthread_mutex_lock(&hp->mu);
    struct slab_class *k = &hp->cls[s->cls];
    s->next = k->free;
    k->free = s;
    k->free_count++;
    pthread_cond_broadcast(&hp->more);
    pthread_mutex_unlock(&hp->mu);
}

void sh_hostpool_stats(struct sh_hostpool *hp, struct sh_hostpool_stats *st)
{
    pthread_mutex_lock(&hp->mu);
    *st = hp->st;
    st->pinned_bytes = hp->pinned;
    st->budget_bytes = hp->budget;
    st->nclasses = hp->nclasses;
    for (unsigned c = 0; c < hp->nclasses; c++) {
        st->class_bytes[c] = hp->cls[c].size;
        st->class_total[c] = hp->cls[c].total;
        st->class_free[c] = hp->cls[c].free_count;
    }
    pthread_mutex_unlock(&hp->mu);
}
