/* room.c — the engine's room (engine/) over the pool, the scheduler and the
 * driver: what making room for an allocation, a restore or a prefetch does
 * in the library (stagehand-sim implements the same ops over its model).
 *
 * Shared state: none of its own; the engine's lock is its callers'.
 */
#include "interpose/interpose.h"

#include "sh_err.h"
#include "telemetry/telemetry.h"

#define MAX_VICTIMS 256
#define MAX_ROUNDS  8 /* of asking the policy, for one request */

static size_t room_device_bytes(void *ctx)
{
    return sh_sched_device_bytes(ctx);
}

/* The device's figures, whichever device the caller has current. */
static int room_mem_info(void *ctx, size_t *free_b, size_t *total)
{
    const struct sh_dev *d = ctx;
    if (!sh_rt.drv.cuMemGetInfo)
        return -1;
    int pushed = sh_driver_enter_dev(&d->drvdev);
    CUresult r = sh_rt.drv.cuMemGetInfo(free_b, total);
    sh_driver_leave(&sh_rt.drv, pushed);
    return r == CUDA_SUCCESS ? 0 : -1;
}

static int room_capturing(void *ctx)
{
    (void)ctx;
    return sh_capturing();
}

static size_t room_trim(void *ctx, size_t bytes)
{
    const struct sh_dev *d = ctx;
    return sh_pool_trim(d->pool, bytes);
}

static size_t room_commit_early(void *ctx)
{
    return sh_sched_evict_commit(ctx, 1);
}

static int listed(uintptr_t va, const uintptr_t *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == va)
            return 1;
    return 0;
}

/* Adds to keep[*nk..] the victims[0..n) that are not in evicted[0..ne). */
static void keep_skipped(const uintptr_t *victims, size_t n, const uintptr_t *evicted, size_t ne,
                         uintptr_t *keep, size_t *nk, size_t cap)
{
    for (size_t i = 0; i < n && *nk < cap; i++)
        if (!listed(victims[i], evicted, ne))
            keep[(*nk)++] = victims[i];
}

/* Evicts the policy's choice of victims until need bytes are released or
 * it has none left; returns the bytes released. The policy is the only
 * source of victims. A victim that another move took meanwhile (an early
 * eviction that started, a restore) is passed over, and the next round
 * asks again with it kept: each round evicts a victim or keeps one more. */
static size_t room_evict_chosen(void *ctx, size_t need, const uintptr_t *protect, size_t np)
{
    struct sh_dev *d = ctx;
    uintptr_t keep[2 * MAX_VICTIMS], victims[MAX_VICTIMS], evicted[MAX_VICTIMS];
    size_t nk = sh_pool_bases(d->pool, protect, np < MAX_VICTIMS ? np : MAX_VICTIMS, keep);
    size_t released = 0;
    for (int round = 0; round < MAX_ROUNDS && released < need; round++) {
        size_t n = sh_sched_victims(d, need - released, keep, nk, victims, MAX_VICTIMS), got = 0,
               ne = 0;
        int rc = n ? sh_pool_evict_these(d->pool, victims, n, &got, evicted, &ne) : SH_ENOMEM;
        if (rc != SH_OK && rc != SH_EBUSY)
            break; /* no victim, or the host side is full */
        if (rc == SH_EBUSY && sh_capturing()) {
            /* begun since the engine asked: no window opens until it ends,
             * whose end makes the room (sh_graph_captures_ended) */
            atomic_fetch_add(&d->engine.deferred, 1);
            break;
        }
        released += got;
        sh_sched_residency(d, evicted, ne, 0);
        sh_sched_announce(d, evicted, ne, SH_TM_EV_EVICT);
        keep_skipped(victims, n, evicted, ne, keep, &nk, sizeof keep / sizeof *keep);
    }
    return released;
}

/* Prefetches in flight are committed, their copies waited for (early
 * evictions in flight were, by commit_early). */
static int room_land(void *ctx)
{
    return sh_sched_commit_all(ctx) > 0;
}

/* A region's bytes to bring back: its mapped bytes while it is on the
 * host (a restore maps them all again). */
static size_t room_host_bytes(void *ctx, uintptr_t region)
{
    const struct sh_dev *d = ctx;
    struct sh_region_info info;
    if (sh_pool_lookup(d->pool, region, &info) != 0 || info.state != SH_RS_HOST)
        return 0;
    return info.mapped;
}

static void room_pressure(void *ctx, size_t dev)
{
    (void)ctx;
    sh_monitor_event(SH_TM_EV_PRESSURE, 0, dev);
}

static void room_set_caps(void *ctx, unsigned max_d2h, unsigned max_h2d)
{
    const struct sh_dev *d = ctx;
    if (d->xfer)
        sh_xfer_set_caps(d->xfer, max_d2h, max_h2d);
}

/* Slabs are pinned ahead of need only from now on: a program far below
 * its limit pins no host memory. */
static void room_near_limit(void *ctx)
{
    const struct sh_dev *d = ctx;
    if (d->host)
        sh_hostpool_wake(d->host);
}

void sh_room_init(struct sh_dev *d, const struct sh_config *c)
{
    const struct sh_engine_cfg cfg = {
        .card = d->card_bytes,
        .budget = c->budget.vram_budget.bytes,
        .high = c->budget.vram_high_watermark.bytes,
        .low = c->budget.vram_low_watermark.bytes,
        .high_auto = c->budget.vram_high_watermark.is_auto,
        .low_auto = c->budget.vram_low_watermark.is_auto,
        .gran = d->gran,
        .record_pct = c->policy.record_above_pct,
        .max_d2h = (unsigned)c->transfer.max_inflight_d2h,
        .max_h2d = (unsigned)c->transfer.max_inflight_h2d,
    };
    static const struct sh_engine_ops ops = {
        .device_bytes = room_device_bytes,
        .mem_info = room_mem_info,
        .capturing = room_capturing,
        .trim = room_trim,
        .commit_early = room_commit_early,
        .evict_chosen = room_evict_chosen,
        .land = room_land,
        .host_bytes = room_host_bytes,
        .pressure = room_pressure,
        .set_caps = room_set_caps,
        .near_limit = room_near_limit,
        .evicted_ready = sh_sched_evicted_ready,
        .commit_evicted = sh_sched_commit_evicted,
        .read = sh_sched_read,
        .policy_lock = sh_sched_lock,
        .policy_unlock = sh_sched_unlock,
        .start_evictions = sh_sched_start_evictions,
        .start_fetches = sh_sched_start_fetches,
        .commit_fetched = sh_sched_commit_fetched,
        .hints = sh_sched_hints,
    };
    sh_engine_init(&d->engine, &cfg, &ops, d);
}
