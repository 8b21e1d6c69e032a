/* policy.h — what to evict and what to bring back: pure logic.
 *
 * The policy receives events (alloc, free, launch, step, phase, residency
 * changes, pressure) and answers questions (which regions to evict to free N
 * bytes, which to prefetch now, what limits the Conductor rules set). It
 * makes no CUDA call and keeps no clock of its own: every event carries a
 * timestamp in microseconds from the caller, so the same code runs inside the
 * library, inside stagehand-sim and inside unit tests, deterministically.
 * docs/POLICY.md describes the behaviour in full.
 *
 * Regions are named by a 64-bit id chosen by the caller, unique among live
 * regions: an id may come back after the region's free and forget (the
 * library's ids are addresses, which its pool reuses); the policy tells the
 * two regions apart by allocation, never by id.
 * Not thread-safe: the caller serialises calls (the library holds one lock).
 *
 * Typical use by the eviction engine, in the launch hook:
 *
 *   restore what the launch needs (sh_policy_victims() when room is short,
 *       protect = the launch's regions and those of queued work);
 *   sh_policy_launch(p, now, kernel, stream, ids, n);
 *   sh_policy_pressure(p, device_bytes); sh_policy_slots(p, h2d, d2h);
 *   sh_policy_hints(p, &h);
 *   if (device_bytes - evicting_bytes > h.high_watermark)
 *       evict sh_policy_victims(p, device_bytes - evicting_bytes - h.low_watermark, ...);
 *   sh_policy_plan(p, device_bytes, protect, np, &plan): start plan.evict[]
 *       (D2H) and plan.fetch[] (H2D), reporting each through
 *       sh_policy_residency(); call it again whenever a copy finishes;
 *   commit finished copies when sh_policy_commit_due() says so (a stalled
 *   launch leaves the GPU idle: commit finished evictions at once then).
 */
#ifndef SH_POLICY_H
#define SH_POLICY_H

#include <stddef.h>
#include <stdint.h>

struct sh_config;

enum sh_policy_kind {
    SH_POLICY_REACTIVE = 0, /* evict least recently used; restore only on demand */
    SH_POLICY_LRU = 1,      /* LRU eviction, plus prefetch of what the last step used next */
    SH_POLICY_LEARNED = 2,  /* next-use distance from the previous step's trace */
    SH_POLICY_BELADY = 3,   /* offline oracle: knows the future trace (stagehand-sim only) */
};

enum sh_policy_residency {
    SH_RES_DEVICE = 0,   /* resident */
    SH_RES_HOST = 1,     /* evicted to host memory */
    SH_RES_TO_HOST = 2,  /* eviction copy in flight (or done, not yet committed) */
    SH_RES_TO_DEVICE = 3 /* restore or prefetch copy in flight (or done, not yet committed) */
};

/* Region classes, in the seeds' vocabulary. */
enum sh_policy_class { SH_CLASS_UNKNOWN = 0, SH_CLASS_PERSISTENT = 1, SH_CLASS_TRANSIENT = 2 };

/* Phases: the same numbers as stagehand.h's enum stagehand_phase_id. */
enum sh_policy_phase {
    SH_PHASE_STEP_BEGIN = 0,
    SH_PHASE_FORWARD = 1,
    SH_PHASE_BACKWARD = 2,
    SH_PHASE_OPTIMIZER = 3,
    SH_PHASE_STEP_END = 4,
};

struct sh_policy_params {
    int kind;                /* enum sh_policy_kind */
    uint64_t budget_bytes;   /* device bytes the regions may use */
    uint64_t high_watermark; /* eviction starts above this */
    uint64_t low_watermark;  /* ... and stops below this */
    int prefetch_window;     /* launches to look ahead */
    int prefetch_enabled;
    int max_inflight_h2d, max_inflight_d2h;
    int batch_max; /* most copies committed in one remap window */
    /* Conductor rules (seed 004); conductor_enabled 0 turns all off. */
    int conductor_enabled;
    int backward_pressure_pct;      /* rule 1: in BACKWARD, % of the high watermark */
    int backward_prefetch_window;   /* rule 1 window */
    int optimizer_max_inflight_h2d; /* rule 2 cap */
    int contention_checks;          /* rule 3: consecutive contended steps */
};

/* Fills *out from a resolved configuration ([budget], [transfer], [policy],
 * [conductor]); [policy] eviction picks SH_POLICY_LRU or SH_POLICY_LEARNED.
 * SH_EINVAL when cfg is not resolved. */
int sh_policy_params_from_config(const struct sh_config *cfg, struct sh_policy_params *out);

/* Limits in force now; within a step they only tighten (reset at STEP_BEGIN). */
struct sh_policy_hints {
    int prefetch_window;
    int max_inflight_h2d, max_inflight_d2h;
    int suppress_speculative; /* prefetch only what the next launch needs */
    uint64_t high_watermark;  /* evict above this; prefetch never goes past it */
    uint64_t low_watermark;   /* evict down to this */
    uint32_t rules_fired;     /* bit i: rule i+1 tightened something this step */
};

struct sh_policy;

int sh_policy_create(const struct sh_policy_params *params, struct sh_policy **out);
void sh_policy_destroy(struct sh_policy *p);

/* ---- events (t_us: the caller's clock, non-decreasing) ---- */
int sh_policy_alloc(struct sh_policy *p, uint64_t t_us, uint64_t id, uint64_t bytes,
                    uint64_t stream);
/* The program freed the region. While it still holds device memory (resident
 * or a copy in flight) it stays known, as the first choice of victim (its
 * memory goes back without a copy); it is dropped when its residency becomes
 * SH_RES_HOST or on sh_policy_forget(). */
int sh_policy_free(struct sh_policy *p, uint64_t t_us, uint64_t id);
/* The caller released a freed region's memory (or gives up on a region). */
int sh_policy_forget(struct sh_policy *p, uint64_t id);
/* A launch that references regions ids[0..n) (already resident: the caller
 * restores what was evicted before issuing the launch). Duplicates and ids
 * the policy does not know are ignored. */
int sh_policy_launch(struct sh_policy *p, uint64_t t_us, uint64_t kernel, uint64_t stream,
                     const uint64_t *ids, size_t n);
/* Explicit marks; when never called, steps are found from the repeating
 * launch sequence (the first launch of step 0 recurring ends step 0). Once
 * marked, detection stays off. A boundary with no launch since the last one
 * is ignored, so stagehand_step() and phase(STEP_BEGIN) may both be used. */
int sh_policy_step(struct sh_policy *p, uint64_t t_us);
int sh_policy_phase(struct sh_policy *p, uint64_t t_us, int phase);
/* Residency as the mechanism carried it out. */
int sh_policy_residency(struct sh_policy *p, uint64_t id, int residency);
/* Whether the region, on the device, keeps a host copy of its bytes
 * ([policy] clean_skip): an eviction of it copies nothing unless it was
 * written since, so it is a cheaper victim than one that must be copied.
 * 0 for a region never told. */
int sh_policy_kept(struct sh_policy *p, uint64_t id, int kept);
/* The region never moves again (another party holds its pages): never a
 * victim from now on. SH_ENOTFOUND for a region never told. */
int sh_policy_pinned(struct sh_policy *p, uint64_t id);
/* Transfer-slot occupancy seen by the caller (feeds the contention rule). */
void sh_policy_slots(struct sh_policy *p, int h2d_busy, int d2h_busy);
/* Device bytes in use now (feeds the backward-pressure rule). */
void sh_policy_pressure(struct sh_policy *p, uint64_t device_bytes);
/* A launch waited wait_us for region id to arrive (counted; feeds rule 3). */
void sh_policy_stall(struct sh_policy *p, uint64_t t_us, uint64_t id, uint64_t wait_us);

/* ---- decisions ---- */
/* Up to max resident regions to evict, best victim first, whose sizes add
 * up to at least need bytes if possible. Never a region in protect[0..np) or
 * in flight. Freed regions come first; regions needed within the prefetch
 * window come last (learned: farthest next use first). Returns the count. */
size_t sh_policy_victims(struct sh_policy *p, uint64_t need, const uint64_t *protect, size_t np,
                         uint64_t *out, size_t max);
/* Up to max host regions to bring back now, soonest needed first, whose
 * sizes fit in `room` bytes (the caller passes what the high watermark
 * allows; what the next launch needs may also use the budget above it).
 * Respects the hints. Returns the count. sh_policy_plan() without
 * evictions. */
size_t sh_policy_prefetch(struct sh_policy *p, uint64_t room, uint64_t *out, size_t max);

/* The moves to start now (the caller's arrays and limits; pass the free
 * copy slots as the limits). fetch[]: host regions needed within the window,
 * soonest first, that fit under the high watermark; a region the very next
 * launch needs may use the whole budget (it would be restored on demand a
 * moment later anyway). evict[]: learned and belady only, regions to evict
 * ahead of need so that what the window needs sooner (restores and the
 * allocations the recording predicts) can come in: only regions needed
 * later than everything they make room for, never protect[] or in flight. */
struct sh_policy_plan {
    uint64_t *fetch;
    size_t fetch_max, nfetch;
    uint64_t *evict;
    size_t evict_max, nevict;
};
/* device_bytes: device memory in use now, regions whose copies are in
 * flight either way included. */
int sh_policy_plan(struct sh_policy *p, uint64_t device_bytes, const uint64_t *protect, size_t np,
                   struct sh_policy_plan *plan);
/* Whether to open a remap window now: nready copies have finished and wait
 * for their commit; `needed` is nonzero when the launch being issued needs
 * one of them or the memory of a finished eviction is needed now. */
int sh_policy_commit_due(const struct sh_policy *p, size_t nready, int needed);
/* 1 when telling the policy this pressure and these busy slots, then
 * planning and asking sh_policy_commit_due(p, nready, 0), would change
 * nothing and find nothing to do: the same inputs as it was last told, the
 * hints as the caller last read them, and a plan found idle since
 * which nothing it reads has changed. A launch's caller may then skip all
 * of them. told: sh_policy_hints_gen() as of the caller's last
 * sh_policy_hints(). */
int sh_policy_plan_idle(const struct sh_policy *p, uint64_t device_bytes, int h2d_busy,
                        int d2h_busy, size_t nready, uint64_t told);
void sh_policy_hints(const struct sh_policy *p, struct sh_policy_hints *out);
/* Equal between two calls, the hints did not change between them. */
uint64_t sh_policy_hints_gen(const struct sh_policy *p);

/* ---- what it knows ---- */
struct sh_policy_stats {
    int64_t step;    /* the step in progress, from 0 */
    int phase;       /* current enum sh_policy_phase */
    int trace_ready; /* a complete step has been recorded */
    int following;   /* the current step matches a recorded step so far */
    int diverged;    /* the current step departs from every recorded step */
    int marked;      /* steps come from explicit marks */
    uint64_t launches_this_step;
    uint64_t launches;              /* in all */
    uint64_t steps_matched;         /* completed steps that followed a recording */
    uint64_t steps_diverged;        /* completed steps that departed (or had none) */
    uint64_t recordings;            /* recorded steps kept */
    uint64_t persistent, transient; /* live persistent regions; regions freed within their step */
    uint64_t persistent_bytes;      /* bytes of live persistent regions */
    uint64_t step_bytes;            /* bytes of live regions allocated this step */
    uint64_t regions;               /* regions known (freed ones awaiting forget included) */
    uint64_t stalls, stall_us;      /* sh_policy_stall() */
    uint64_t unknown_refs;          /* launch references to unknown ids */
};
void sh_policy_stats(const struct sh_policy *p, struct sh_policy_stats *out);
/* The step in progress and the phase: what the stats say of them, cheaply
 * (asked after every launch). */
void sh_policy_where(const struct sh_policy *p, int64_t *step, int *phase);
/* The class of a region (persistent once it lives across a step boundary,
 * transient when freed in the step that allocated it, unknown until then);
 * SH_ENOTFOUND for an unknown id. */
int sh_policy_class(const struct sh_policy *p, uint64_t id);
/* Launches from now until region id is next needed (0: by the next launch);
 * UINT64_MAX when no recording predicts it. SH_ENOTFOUND for an unknown id. */
int sh_policy_next_use(struct sh_policy *p, uint64_t id, uint64_t *launches);

/* Belady only: the whole future before replay, in the order the events will
 * be given to the policy (allocations, frees and launches; other kinds are
 * skipped). The policy keeps its own copy. */
enum sh_policy_future_kind { SH_FUTURE_ALLOC = 0, SH_FUTURE_FREE = 1, SH_FUTURE_LAUNCH = 2 };
struct sh_policy_future {
    int kind;
    uint64_t id;         /* ALLOC, FREE */
    uint64_t bytes;      /* ALLOC */
    const uint64_t *ids; /* LAUNCH */
    size_t n;
};
int sh_policy_set_future(struct sh_policy *p, const struct sh_policy_future *ev, size_t n);

/* ---- the Conductor rules on their own (policy.c drives them) ----
 * They restrain guesses: while the policy is confident (it follows a
 * recording that a whole step has confirmed) none of them tightens anything.
 * Rule 1, backward pressure: in BACKWARD, once device bytes pass
 *   backward_pressure_pct % of the high watermark, both watermarks drop to
 *   that percentage, the window to backward_prefetch_window, and speculative
 *   prefetch stops.
 * Rule 2, optimizer protection: in OPTIMIZER, speculative prefetch stops and
 *   at most optimizer_max_inflight_h2d restores are in flight.
 * Rule 3, contention back-off: a step in which a launch waited, without
 *   confidence, while every H2D slot was busy is contended; after
 *   contention_checks contended steps in a row the window halves from the
 *   next step on, and after as many calm steps it doubles back, up to
 *   prefetch_window.
 * Within a step hints only tighten; sh_policy_rules_step() starts the next. */
struct sh_policy_rules;
int sh_policy_rules_create(const struct sh_policy_params *params, struct sh_policy_rules **out);
void sh_policy_rules_destroy(struct sh_policy_rules *r);
/* A new step; confident: it starts following a confirmed recording. */
void sh_policy_rules_step(struct sh_policy_rules *r, int confident);
/* Confidence lost (0) within a step: the rules apply from now on. */
void sh_policy_rules_confident(struct sh_policy_rules *r, int confident);
void sh_policy_rules_phase(struct sh_policy_rules *r, int phase);
void sh_policy_rules_pressure(struct sh_policy_rules *r, uint64_t device_bytes);
void sh_policy_rules_slots(struct sh_policy_rules *r, int h2d_busy, int d2h_busy);
void sh_policy_rules_stall(struct sh_policy_rules *r);
void sh_policy_rules_hints(const struct sh_policy_rules *r, struct sh_policy_hints *out);
/* Moves on at every call that may change the hints: equal, they are too. */
uint64_t sh_policy_rules_gen(const struct sh_policy_rules *r);
/* Back-off level of rule 3 (the window is prefetch_window >> level). */
int sh_policy_rules_level(const struct sh_policy_rules *r);

#endif
