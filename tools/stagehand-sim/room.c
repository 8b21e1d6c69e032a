/* room.c — the library's engine (engine/) run over stagehand-sim's model:
 * its ops table implemented on the bus-and-VMM model, so that the watermarks,
 * the Conductor's hints and the chain that makes room are decided by the
 * same code as in the library (interpose/cudart.c implements the same ops
 * over the pool).
 *
 * The model's pool keeps no freed region (its memory goes back at the
 * free): there is nothing to trim, and no LRU beside the policy's victims.
 * Evictions the engine asks for are synchronous, as the library's are
 * (a remap window that drains the device, copies and waits, then remaps),
 * and early evictions committed here open a window of their own; the
 * model's clock runs meanwhile.
 *
 * No shared state: everything lives in the run (replay.h).
 */
#include "tools/stagehand-sim/replay.h"

#include "engine/engine.h"
#include "policy/policy.h"
#include "sh_clock.h"
#include "sh_err.h"

#include <stdio.h>
#include <stdlib.h>

_Static_assert(sizeof(uintptr_t) == sizeof(uint64_t), "region ids are passed as addresses");

static size_t device_bytes(void *ctx)
{
    const struct run *r = ctx;
    return (size_t)(r->used + r->own);
}

/* The card as the driver would report it: the regions and the library's
 * own buffers are all it holds. */
static int mem_info(void *ctx, size_t *free_bytes, size_t *total)
{
    const struct run *r = ctx;
    uint64_t held = r->used + r->own;
    *total = (size_t)r->sp->vram_bytes;
    *free_bytes = held < r->sp->vram_bytes ? (size_t)(r->sp->vram_bytes - held) : 0;
    return 0;
}

static uint64_t released_since(const struct run *r, uint64_t before)
{
    return before > r->used ? before - r->used : 0;
}

/* Waits until none of the copies of direction dir numbered [from, to) is
 * still queued or on the link. */
static int wait_copies(struct run *r, size_t from, size_t to, int dir)
{
    for (size_t c = from; c < to && !r->failed; c++) {
        while (r->cp[c].dir == dir && (r->cp[c].state == C_QUEUED || r->cp[c].state == C_ISSUED))
            if (advance(r, r->cp[next_done(r)].done_ns))
                return SH_EINVAL;
    }
    return r->failed ? SH_EINVAL : 0;
}

/* Early evictions: those under way are waited for and committed in one
 * window, as sh_sched_evict_commit(1) does. */
static size_t commit_early(void *ctx)
{
    struct run *r = ctx;
    uint64_t before = r->used;
    size_t n = r->queued[D2H].n + r->issued[D2H].n, k = 0;
    if (n == 0 && !any_ready(r, D2H))
        return 0;
    int *flying = malloc((n ? n : 1) * sizeof *flying);
    if (!flying) {
        run_fail(r, "out of memory");
        return 0;
    }
    for (int q = 0; q < 2; q++) {
        const struct fifo *f = q ? &r->issued[D2H] : &r->queued[D2H];
        for (size_t i = 0; i < f->n; i++)
            flying[k++] = f->v[f->head + i];
    }
    for (size_t i = 0; i < k && !r->failed; i++)
        if (wait_copies(r, (size_t)flying[i], (size_t)flying[i] + 1, D2H))
            break;
    free(flying);
    if (!r->failed && any_ready(r, D2H))
        commit_window(r, 1 << D2H, 0, W_EARLY);
    return released_since(r, before);
}

/* The policy's victims, evicted on demand: copied, waited for, committed.
 * With none to give while restores hold the memory, those restores land
 * first (committed, they become evictable). */
static size_t evict_chosen(void *ctx, size_t need, const uintptr_t *protect, size_t np)
{
    struct run *r = ctx;
    uint64_t before = r->used;
    while (!r->failed) {
        if (reserve_buf(r, r->nreg + 16))
            break;
        uint64_t t0 = sh_clock_ns();
        size_t n =
            sh_policy_victims(r->pol, need, (const uint64_t *)protect, np, r->buf, r->capbuf);
        r->policy_ns += sh_clock_ns() - t0;
        if (n > 0) {
            /* as sh_pool_evict_these: the window drains the device, then copies */
            size_t first = r->ncp;
            if (drain(r) == 0 && evict_list(r, r->buf, n, 1) == 0 &&
                wait_copies(r, first, r->ncp, D2H) == 0 && any_ready(r, D2H))
                commit_window(r, 1 << D2H, first, W_EVICT);
            break;
        }
        if (any_ready(r, H2D)) {
            if (commit_all(r))
                break;
        } else if (r->issued[H2D].n + r->queued[H2D].n) {
            if (wait_one(r))
                break;
        } else {
            break;
        }
    }
    return released_since(r, before);
}

/* A region's bytes while it is on the host; 0 otherwise. */
static size_t sim_host_bytes(void *ctx, uintptr_t id)
{
    struct run *r = ctx;
    size_t g = idmap_get(&r->ids, id);
    if (g == SIZE_MAX || !r->reg[g].live || r->reg[g].res != SH_RES_HOST)
        return 0;
    return (size_t)r->reg[g].bytes;
}

void room_init(struct run *r, const struct sh_policy_params *pp)
{
    const struct sh_engine_cfg cfg = {
        .card = r->sp->vram_bytes,
        .budget = pp->budget_bytes < r->sp->vram_bytes ? pp->budget_bytes : r->sp->vram_bytes,
        .high = pp->high_watermark,
        .low = pp->low_watermark,
        .high_auto = r->sp->high_auto,
        .low_auto = r->sp->low_auto,
        .gran = r->sp->gran_bytes,
        .record_pct = 0, /* a trace holds every launch: the library recording it records all */
        .max_d2h = (unsigned)pp->max_inflight_d2h,
        .max_h2d = (unsigned)pp->max_inflight_h2d,
    };
    static const struct sh_engine_ops ops = {
        .device_bytes = device_bytes,
        .commit_early = commit_early,
        .evict_chosen = evict_chosen,
        .host_bytes = sim_host_bytes,
        .evicted_ready = sim_evicted_ready,
        .commit_evicted = sim_commit_evicted,
        .read = sim_read,
        .start_evictions = sim_start_evictions,
        .start_fetches = sim_start_fetches,
        .commit_fetched = sim_commit_fetched,
        .mem_info = mem_info,
    };
    sh_engine_init(&r->eng, &cfg, &ops, r);
}

void room_destroy(struct run *r)
{
    sh_engine_destroy(&r->eng);
}

/* What holds the device when nothing can be evicted (--verbose). */
static void dump_device(const struct run *r)
{
    for (size_t k = 0; k < r->nreg; k++)
        if (r->reg[k].live && r->reg[k].res != SH_RES_HOST)
            fprintf(stderr, "    region %llu res %d bytes %llu copy %d\n",
                    (unsigned long long)r->reg[k].id, r->reg[k].res,
                    (unsigned long long)r->reg[k].bytes, r->reg[k].copy);
    for (size_t i = 0; i < r->nprot; i++)
        fprintf(stderr, "    protected %llu\n", (unsigned long long)r->prot[i]);
}

uint64_t launch_host_bytes(struct run *r, const uint64_t *ids, size_t n)
{
    uint64_t host = 0;
    r->stamp++;
    for (size_t i = 0; i < n; i++) {
        struct sreg *s = &r->reg[idmap_get(&r->ids, ids[i])];
        if (s->res == SH_RES_HOST && s->seen != r->stamp)
            host += s->bytes;
        s->seen = r->stamp;
    }
    return host;
}

int room_make(struct run *r, uint64_t bytes, const uint64_t *ids, size_t n)
{
    /* An allocation holds the room it waits for: a plan made meanwhile that
     * restored into it (the launch after the allocation, say) would be
     * evicted again to make the same room, without end when that launch
     * cannot fit. */
    r->held = ids ? 0 : bytes;
    int rc = SH_OK;
    for (;;) {
        if (ids) /* while it waited, a decision may have fetched some */
            bytes = launch_host_bytes(r, ids, n);
        rc = SH_OK;
        if (bytes == 0)
            break;
        sh_engine_lock(&r->eng);
        rc = sh_engine_make_room(&r->eng, bytes, (const uintptr_t *)r->prot, r->nprot);
        sh_engine_unlock(&r->eng);
        if (rc != SH_ENOMEM || r->failed)
            break;
        /* restores planned while it waited took the room: they land, and
         * are evictable once committed */
        if (any_ready(r, H2D) || any_ready(r, D2H)) {
            if (commit_all(r))
                break;
        } else if (next_done(r) < 0 || wait_one(r)) {
            break;
        }
    }
    r->held = 0;
    if (r->failed)
        return SH_EINVAL;
    if (rc == SH_OK)
        return 0;
    if (ids) /* the engine picks those that fit (room_some) */
        return SH_ENOMEM;
    if (r->sp->verbose)
        dump_device(r);
    return run_fail(r,
                    "out of memory: %llu bytes more do not fit in %llu bytes of VRAM "
                    "(%llu in use, nothing evictable)",
                    (unsigned long long)bytes, (unsigned long long)r->sp->vram_bytes,
                    (unsigned long long)r->used);
}

int room_some(struct run *r, const uint64_t *ids, size_t n, uint64_t *fit, size_t *nfit)
{
    uintptr_t *was = malloc((n ? n : 1) * sizeof *was);
    if (!was)
        return run_fail(r, "out of memory");
    size_t nwas = 0;
    r->stamp++;
    for (size_t i = 0; i < n; i++) { /* distinct, in the launch's order */
        struct sreg *s = &r->reg[idmap_get(&r->ids, ids[i])];
        if (s->res == SH_RES_HOST && s->seen != r->stamp)
            was[nwas++] = ids[i];
        s->seen = r->stamp;
    }
    sh_engine_lock(&r->eng);
    sh_engine_resident(&r->eng, was, nwas, (const uintptr_t *)r->prot, r->nprot, (uintptr_t *)fit,
                       nfit);
    sh_engine_unlock(&r->eng);
    free(was);
    return r->failed ? SH_EINVAL : 0;
}
