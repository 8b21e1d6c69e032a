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

static size_t device_bytes(void)
{
    struct sh_pool_stats st;
    sh_pool_stats(sh_rt.pool, &st);
    return st.device_bytes;
}

static size_t room_device_bytes(void *ctx)
{
    (void)ctx;
    return device_bytes();
}

/* The managed device's figures, whichever device the caller has current. */
static int room_mem_info(void *ctx, size_t *free_b, size_t *total)
{
    (void)ctx;
    if (!sh_rt.drv.cuMemGetInfo)
        return -1;
    int pushed = sh_driver_enter(&sh_rt.drv);
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
    (void)ctx;
    return sh_pool_trim(sh_rt.pool, bytes);
}

static size_t room_commit_early(void *ctx)
{
    (void)ctx;
    return sh_sched_evict_commit(1);
}

/* Evicts the policy's choice of victims; returns the bytes released. */
static size_t room_evict_chosen(void *ctx, size_t need, const uintptr_t *protect, size_t np)
{
    (void)ctx;
    uintptr_t bases[MAX_VICTIMS], victims[MAX_VICTIMS], evicted[MAX_VICTIMS];
    size_t nb = sh_pool_bases(sh_rt.pool, protect, np < MAX_VICTIMS ? np : MAX_VICTIMS, bases);
    size_t n = sh_sched_victims(need, bases, nb, victims, MAX_VICTIMS), released = 0, ne = 0;
    if (n && sh_pool_evict_these(sh_rt.pool, victims, n, &released, evicted, &ne) == SH_OK) {
        sh_sched_residency(evicted, ne, 0);
        sh_sched_announce(evicted, ne, SH_TM_EV_EVICT);
    }
    return released;
}

static size_t room_evict_lru(void *ctx, size_t need, const uintptr_t *protect, size_t np)
{
    (void)ctx;
    size_t released = 0;
    sh_pool_evict(sh_rt.pool, need, protect, np, &released);
    return released;
}

static void room_pressure(void *ctx, size_t dev)
{
    (void)ctx;
    sh_monitor_event(SH_TM_EV_PRESSURE, 0, dev);
}

static void room_set_caps(void *ctx, unsigned max_d2h, unsigned max_h2d)
{
    (void)ctx;
    if (sh_rt.xfer)
        sh_xfer_set_caps(sh_rt.xfer, max_d2h, max_h2d);
}

void sh_room_init(void)
{
    const struct sh_config *c = &sh_rt.cfg;
    const struct sh_engine_cfg cfg = {
        .card = sh_rt.card_bytes,
        .budget = c->budget.vram_budget.bytes,
        .high = c->budget.vram_high_watermark.bytes,
        .low = c->budget.vram_low_watermark.bytes,
        .high_auto = c->budget.vram_high_watermark.is_auto,
        .low_auto = c->budget.vram_low_watermark.is_auto,
        .gran = sh_rt.gran,
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
        .evict_lru = room_evict_lru,
        .pressure = room_pressure,
        .set_caps = room_set_caps,
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
    sh_engine_init(&sh_rt.engine, &cfg, &ops, NULL);
}
