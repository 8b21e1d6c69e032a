/* engine.h — the library's decisions that need no CUDA, driven by events
 * and acting through an ops table, so that they are unit-tested against
 * fakes (tests/unit/test_engine.c).
 *
 * Room: how much device memory the pool may hold now (the watermarks, or
 * with them auto what fits beside the memory held outside the pool), and
 * the chain that makes room when an allocation or a restore would pass it:
 * freed regions kept for reuse first (no copy), then early evictions whose
 * copies are already under way, then the policy's victims, and only when
 * the request would fail, the moves in flight landed. Residency
 * (resident.c): which of a launch's evicted regions come back before it
 * runs, all or as many as fit. Hints: the Conductor's limits in force (sh_policy_hints),
 * which lower the watermarks that trigger eviction and the copies in flight
 * per direction, for the library and stagehand-sim alike. Recording:
 * whether launches are worth recording yet. Planning (plan.c): one
 * decision point of the planner, which both make the same way; and what
 * it chose, started through the same ops table (decide.c).
 *
 * Thread safety: sh_engine_lock() is held around making room and taking
 * it; the counters are atomics read without it.
 */
#ifndef SH_ENGINE_H
#define SH_ENGINE_H

#include "policy/policy.h"
#include "sh_err.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

/* Sizes in bytes. */
struct sh_engine_cfg {
    size_t card;               /* the device's memory; 0: not known */
    size_t budget;             /* device memory the pool may use */
    size_t high, low;          /* watermarks; ignored where *_auto */
    int high_auto;             /* only what would not fit beside the memory outside */
    int low_auto;              /* evict no lower than the request needs */
    size_t gran;               /* the allocation granularity */
    int record_pct;            /* launches are recorded from this % of the limit */
    unsigned max_d2h, max_h2d; /* copies in flight per direction, configured */
};

/* What a decision point reads: device bytes in use as the plan counts
 * them, the moves whose copies are still on the link each way (slots
 * busy), and the prefetches finished and waiting for their window (they
 * hold device memory, counted in dev, but no slot). */
struct sh_engine_plan_in {
    size_t dev;
    size_t fetching, evicting;
    size_t fetched;
};

/* What the engine acts through. Each eviction op returns the device bytes
 * it released, at most about `bytes` more than asked; trim, commit_early,
 * land, pressure and set_caps may be NULL (nothing of the kind).
 * evict_chosen evicts the policy's victims: the only source of them. land
 * brings every move in flight to its end, waiting for its copies (a
 * prefetch's scratch memory is room that no other op can give back; once
 * committed, its region is a victim like any other); nonzero when any
 * did. */
struct sh_engine_ops {
    size_t (*device_bytes)(void *ctx); /* the pool's device memory now */
    /* The driver's view of the card; nonzero when it has none. */
    int (*mem_info)(void *ctx, size_t *free_bytes, size_t *total);
    int (*capturing)(void *ctx); /* a stream capture is under way */
    size_t (*trim)(void *ctx, size_t bytes);
    size_t (*commit_early)(void *ctx);
    size_t (*evict_chosen)(void *ctx, size_t bytes, const uintptr_t *protect, size_t np);
    int (*land)(void *ctx);
    /* The device bytes restoring the region at `region` takes; 0 when it
     * is not on the host (sh_engine_resident only). */
    size_t (*host_bytes)(void *ctx, uintptr_t region);
    void (*pressure)(void *ctx, size_t device_bytes); /* an eviction begins */
    /* The copies allowed in flight per direction changed (sh_engine_hints). */
    void (*set_caps)(void *ctx, unsigned max_d2h, unsigned max_h2d);
    /* Called once, when the pool first holds record_pct of its limit:
     * evictions may come, so the host side gets ready (may be NULL). */
    void (*near_limit)(void *ctx);

    /* What a decision point does (sh_engine_decide, decide.c); each is
     * needed there, and only there. Early evictions whose copies have
     * finished: commit_evicted commits them when evicted_ready counts any,
     * so the room they free is the plan's. read: what the plan reads, now.
     * policy_lock/unlock (may be NULL) are held around the policy only.
     * The plan's copies start evictions first (the room they make is what
     * fetches beyond the next launch wait for), then fetches; a due commit
     * of the finished fetches follows. hints (may be NULL): the Conductor's
     * hints changed. Returning nonzero stops the decision point. */
    size_t (*evicted_ready)(void *ctx);
    int (*commit_evicted)(void *ctx);
    void (*read)(void *ctx, struct sh_engine_plan_in *in);
    void (*policy_lock)(void *ctx);
    void (*policy_unlock)(void *ctx);
    int (*start_evictions)(void *ctx, const uint64_t *ids, size_t n);
    int (*start_fetches)(void *ctx, const uint64_t *ids, size_t n);
    int (*commit_fetched)(void *ctx);
    void (*hints)(void *ctx, const struct sh_policy_hints *h);
};

struct sh_engine {
    struct sh_engine_cfg cfg;
    struct sh_engine_ops ops;
    void *ctx;
    pthread_mutex_t room_mu;
    atomic_ullong pressure;            /* bumped before and after every eviction */
    atomic_ullong deferred;            /* evictions put off by a stream capture */
    atomic_int armed;                  /* launches are recorded */
    atomic_int neared;                 /* the pool has held record_pct of its limit */
    atomic_size_t outside;             /* held outside the pool, last measured; SIZE_MAX: never */
    atomic_size_t hint_high, hint_low; /* the Conductor's watermarks; SIZE_MAX: none */
    atomic_uint caps;                  /* in force: max_d2h << 16 | max_h2d */
    /* The hints last passed on, and the policy's generation of them then
     * (plan.c; the caller's policy lock). */
    struct sh_policy_hints told;
    uint64_t told_gen;
};

void sh_engine_init(struct sh_engine *e, const struct sh_engine_cfg *cfg,
                    const struct sh_engine_ops *ops, void *ctx);
void sh_engine_destroy(struct sh_engine *e);

/* The most device memory the pool may hold now, holding dev. */
size_t sh_engine_limit(struct sh_engine *e, size_t dev);
/* With auto watermarks, the device bytes the pool must leave free for
 * memory held outside it (measured now, plus a granule); 0 otherwise. */
size_t sh_engine_reserve(struct sh_engine *e, size_t dev);
/* The same as last measured (by either call, or by making room), measuring
 * only when it never was or `fresh`: asking the driver costs a system call,
 * too much for every launch, and the memory outside the pool seldom moves.
 * For estimates only (the planner's); making room always measures. */
size_t sh_engine_reserve_recent(struct sh_engine *e, size_t dev, int fresh);

/* Makes room for need more device bytes: above the high watermark, evicts
 * until below the low one, never a region containing protect[0..np) (auto
 * watermarks: above what fits beside the memory held outside the pool, only
 * as much as need). SH_ENOMEM if the budget cannot take need bytes even
 * then; SH_ERANGE, evicting nothing, if it never could. Call it under
 * sh_engine_lock(), and take the room before unlocking. */
int sh_engine_make_room(struct sh_engine *e, size_t need, const uintptr_t *protect, size_t np);
void sh_engine_lock(struct sh_engine *e);
void sh_engine_unlock(struct sh_engine *e);

/* A launch's regions back on the device (resident.c): room for all of
 * regions[0..n) (distinct) that are on the host, in one request, protecting
 * protect[0..np) (the launch's own addresses). When the budget cannot take
 * them all, as many as fit: each in the launch's order is kept when room
 * for it can be made beside those kept before. fit[0..*nfit) (room for n)
 * gets the regions to restore now. SH_OK when that is every one on the
 * host; SH_ENOMEM when the others stay there, where the launch reaches
 * them over the bus. Under sh_engine_lock(); needs ops.host_bytes. */
int sh_engine_resident(struct sh_engine *e, const uintptr_t *regions, size_t n,
                       const uintptr_t *protect, size_t np, uintptr_t *fit, size_t *nfit);

/* The Conductor's hints as the policy gives them now: watermarks below the
 * configured ones trigger eviction earlier (backward pressure), and the
 * copies in flight per direction are capped (optimizer protection) through
 * ops.set_caps when they change. Hints never raise what the configuration
 * sets. Callable from any thread. */
void sh_engine_hints(struct sh_engine *e, const struct sh_policy_hints *h);
/* The copies allowed in flight per direction now. */
void sh_engine_caps(const struct sh_engine *e, unsigned *max_d2h, unsigned *max_h2d);

/* One decision point, under the caller's lock around the policy: tells
 * the policy the pressure and the busy slots, passes the Conductor's hints
 * on when they change (*hints gets them, *changed whether they changed;
 * either may be NULL), and plans into plan, whose fetch_max and evict_max
 * say the room in its arrays and come back as the copies it may start. Returns whether a
 * window for the finished prefetches is due (1 or 0); SH_EBUSY when
 * nothing the plan reads changed since a plan that found nothing (most
 * launches, and then this is all a decision point costs); or the policy's
 * error when the plan failed. */
int sh_engine_plan_now(struct sh_engine *e, struct sh_policy *pol,
                       const struct sh_engine_plan_in *in, const uint64_t *protect, size_t np,
                       struct sh_policy_plan *plan, struct sh_policy_hints *hints, int *changed);
/* Inline: the idle answer, which most launches get, costs no more call. */
static inline int sh_engine_plan(struct sh_engine *e, struct sh_policy *pol,
                                 const struct sh_engine_plan_in *in, const uint64_t *protect,
                                 size_t np, struct sh_policy_plan *plan,
                                 struct sh_policy_hints *hints, int *changed)
{
    if (sh_policy_plan_idle(pol, in->dev, (int)in->fetching, (int)in->evicting, in->fetched,
                            e->told_gen))
        return SH_EBUSY;
    return sh_engine_plan_now(e, pol, in, protect, np, plan, hints, changed);
}

/* One decision point whole, for callers with nothing to add under the
 * policy's lock: commits the finished early evictions, reads, plans
 * (sh_engine_plan, under ops.policy_lock) into plan (its arrays and their
 * room given), and starts what it chose (sh_engine_start). 0, or the
 * error of the plan or of an op. */
int sh_engine_decide(struct sh_engine *e, struct sh_policy *pol, const uint64_t *protect, size_t np,
                     struct sh_policy_plan *plan);
/* Starts what a plan chose, through the ops: evictions, then fetches, then
 * the commit of the finished fetches when due (sh_engine_plan's answer). */
int sh_engine_start(struct sh_engine *e, const struct sh_policy_plan *plan, int due);

/* 1 once launches are worth recording: the pool has held record_pct of
 * its limit (or sh_engine_arm() said so). Never goes back to 0. */
int sh_engine_armed(const struct sh_engine *e);
void sh_engine_arm(struct sh_engine *e);

#endif
