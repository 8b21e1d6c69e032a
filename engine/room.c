/* room.c — the watermarks, and the chain that makes room under them.
 *
 * Locking: room_mu (sh_engine_lock) is the caller's, around making room and
 * taking it: two threads must not both see the same free bytes and together
 * pass the budget. The counters and the hints are atomics.
 */
#include "engine/engine.h"

#include "policy/policy.h"
#include "sh_err.h"

void sh_engine_init(struct sh_engine *e, const struct sh_engine_cfg *cfg,
                    const struct sh_engine_ops *ops, void *ctx)
{
    e->cfg = *cfg;
    e->ops = *ops;
    e->ctx = ctx;
    pthread_mutex_init(&e->room_mu, NULL);
    atomic_init(&e->pressure, 0);
    atomic_init(&e->deferred, 0);
    atomic_init(&e->armed, cfg->record_pct == 0);
    atomic_init(&e->neared, 0);
    atomic_init(&e->outside, SIZE_MAX);
    atomic_init(&e->hint_high, SIZE_MAX);
    atomic_init(&e->hint_low, SIZE_MAX);
    atomic_init(&e->caps, (cfg->max_d2h & 0xffffu) << 16 | (cfg->max_h2d & 0xffffu));
    e->told = (struct sh_policy_hints){.prefetch_window = -1}; /* none passed on yet */
    e->told_gen = UINT64_MAX;
}

void sh_engine_destroy(struct sh_engine *e)
{
    pthread_mutex_destroy(&e->room_mu);
}

void sh_engine_lock(struct sh_engine *e)
{
    pthread_mutex_lock(&e->room_mu);
}

void sh_engine_unlock(struct sh_engine *e)
{
    pthread_mutex_unlock(&e->room_mu);
}

/* With the high watermark set, that. With it auto, the budget less what the
 * process holds outside the pool (pass-through allocations, libraries' own,
 * the driver's), as the driver counts it now, less one granule more, so
 * that the next small pass-through allocation does not fail first:
 * eviction starts only when an allocation would not fit beside them. */
/* The limit, given `outside` bytes held outside the pool (SIZE_MAX: not
 * known, the budget). */
static size_t limit_beside(const struct sh_engine *e, size_t outside)
{
    const struct sh_engine_cfg *c = &e->cfg;
    if (outside == SIZE_MAX)
        return c->budget;
    size_t cap = c->card && c->card < c->budget ? c->card : c->budget;
    return cap > outside ? cap - outside : 0;
}

/* Measures what is held outside the pool (SIZE_MAX without the driver's
 * view), and remembers it. */
static size_t measure_outside(struct sh_engine *e, size_t dev)
{
    size_t free_b = 0, total = 0, outside = SIZE_MAX;
    if (e->ops.mem_info && e->ops.mem_info(e->ctx, &free_b, &total) == 0 && free_b <= total) {
        size_t used = total - free_b;
        outside = (used > dev ? used - dev : 0) + e->cfg.gran;
    }
    atomic_store_explicit(&e->outside, outside, memory_order_relaxed);
    return outside;
}

size_t sh_engine_limit(struct sh_engine *e, size_t dev)
{
    if (!e->cfg.high_auto)
        return e->cfg.high;
    return limit_beside(e, measure_outside(e, dev));
}

static size_t reserve_of(const struct sh_engine *e, size_t limit)
{
    return e->cfg.high_auto && limit < e->cfg.budget ? e->cfg.budget - limit : 0;
}

size_t sh_engine_reserve(struct sh_engine *e, size_t dev)
{
    return reserve_of(e, sh_engine_limit(e, dev));
}

size_t sh_engine_reserve_recent(struct sh_engine *e, size_t dev, int fresh)
{
    if (!e->cfg.high_auto)
        return 0;
    size_t outside = atomic_load_explicit(&e->outside, memory_order_relaxed);
    if (fresh || outside == SIZE_MAX)
        outside = measure_outside(e, dev);
    return reserve_of(e, limit_beside(e, outside));
}

/* Where eviction stops: the low watermark, or with it auto no lower than
 * the request needs. */
static size_t evict_floor(const struct sh_engine *e, size_t high)
{
    return e->cfg.low_auto || e->cfg.low > high ? high : e->cfg.low;
}

/* A program far below its limit never evicts: its launches need no
 * recording, nor host memory pinned ahead, until the pool first holds
 * record_pct of the limit. */
static void arm_at(struct sh_engine *e, size_t held, size_t limit)
{
    if (atomic_load_explicit(&e->neared, memory_order_relaxed) ||
        (uint64_t)held * 100 < (uint64_t)limit * (uint64_t)e->cfg.record_pct)
        return;
    atomic_store(&e->armed, 1);
    if (!atomic_exchange(&e->neared, 1) && e->ops.near_limit)
        e->ops.near_limit(e->ctx);
}

/* Device bytes above goal, as the pool holds them now: each link is asked
 * for what is left, read again rather than summed from what the links say
 * they released (a release the device bytes do not show, or memory that
 * is no link's, would leave the request short). */
static size_t above(struct sh_engine *e, size_t goal)
{
    size_t dev = e->ops.device_bytes(e->ctx);
    return dev > goal ? dev - goal : 0;
}

/* The chain, cheapest first, until the device holds goal bytes or less.
 * The policy is asked again while its victims release something and the
 * goal is not met: a move may take device memory of its own (the first
 * fingerprint allocates the library's buffer). */
static void release(struct sh_engine *e, size_t goal, const uintptr_t *protect, size_t np)
{
    size_t left = above(e, goal);
    if (left && e->ops.trim) /* freed regions, uncopied */
        e->ops.trim(e->ctx, left);
    if ((left = above(e, goal)) && e->ops.commit_early) /* early evictions under way */
        e->ops.commit_early(e->ctx);
    for (int pass = 0; pass < 4 && (left = above(e, goal)); pass++)
        if (e->ops.evict_chosen(e->ctx, left, protect, np) == 0) /* the policy's victims */
            break;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

int sh_engine_make_room(struct sh_engine *e, size_t need, const uintptr_t *protect, size_t np)
{
    size_t dev = e->ops.device_bytes(e->ctx), limit = sh_engine_limit(e, dev);
    size_t cap = e->cfg.high_auto ? limit : e->cfg.budget;
    /* The hints restrain when eviction starts and where it stops, never
     * what may be held. */
    size_t high = min_size(limit, atomic_load_explicit(&e->hint_high, memory_order_relaxed));
    arm_at(e, dev + need, limit);
    if (dev + need <= high)
        return SH_OK;
    if (need > cap) /* would not fit with everything evicted: evict nothing */
        return SH_ERANGE;
    atomic_fetch_add(&e->pressure, 1); /* the planner runs from now on */
    if (e->ops.pressure)
        e->ops.pressure(e->ctx, dev);
    if (e->ops.capturing && e->ops.capturing(e->ctx)) { /* eviction waits for the capture */
        atomic_fetch_add(&e->deferred, 1);
        return dev + need <= cap ? SH_OK : SH_ENOMEM;
    }
    size_t floor =
        min_size(evict_floor(e, high), atomic_load_explicit(&e->hint_low, memory_order_relaxed));
    size_t goal = floor > need ? floor - need : 0;
    release(e, goal, protect, np);
    /* Still short of what the request needs: moves in flight hold the rest.
     * Landed, their regions are victims too. Only then: a prefetch undone
     * to reach the low watermark would be a copy for nothing. */
    dev = e->ops.device_bytes(e->ctx);
    if (dev + need > cap && e->ops.land && e->ops.land(e->ctx)) {
        release(e, goal, protect, np);
        dev = e->ops.device_bytes(e->ctx);
    }
    atomic_fetch_add(&e->pressure, 1);
    return dev + need <= cap ? SH_OK : SH_ENOMEM;
}

static unsigned cap_of(int v, unsigned configured)
{
    return v > 0 && (unsigned)v < configured ? (unsigned)v : configured;
}

void sh_engine_hints(struct sh_engine *e, const struct sh_policy_hints *h)
{
    atomic_store_explicit(&e->hint_high,
                          h->high_watermark < SIZE_MAX ? h->high_watermark : SIZE_MAX,
                          memory_order_relaxed);
    atomic_store_explicit(&e->hint_low, h->low_watermark < SIZE_MAX ? h->low_watermark : SIZE_MAX,
                          memory_order_relaxed);
    unsigned d2h = cap_of(h->max_inflight_d2h, e->cfg.max_d2h);
    unsigned h2d = cap_of(h->max_inflight_h2d, e->cfg.max_h2d);
    unsigned caps = (d2h & 0xffffu) << 16 | (h2d & 0xffffu);
    if (atomic_exchange(&e->caps, caps) != caps && e->ops.set_caps)
        e->ops.set_caps(e->ctx, d2h, h2d);
}

void sh_engine_caps(const struct sh_engine *e, unsigned *max_d2h, unsigned *max_h2d)
{
    unsigned caps = atomic_load_explicit(&e->caps, memory_order_relaxed);
    *max_d2h = caps >> 16;
    *max_h2d = caps & 0xffffu;
}

int sh_engine_armed(const struct sh_engine *e)
{
    return atomic_load_explicit(&e->armed, memory_order_relaxed);
}

void sh_engine_arm(struct sh_engine *e)
{
    atomic_store(&e->armed, 1);
}
