/* policy.h — what to evict and what to bring back: pure logic.
 *
 * The policy receives events (alloc, free, launch, step, phase, residency
 * changes) and answers questions (which regions to evict to free N bytes,
 * which to prefetch now, what limits the Conductor rules set). It makes no
 * CUDA call and keeps no clock of its own: every event carries a timestamp
 * in microseconds from the caller, so the same code runs inside the library,
 * inside stagehand-sim and inside unit tests, deterministically.
 *
 * Regions are named by a 64-bit id chosen by the caller (never reused).
 * Not thread-safe: the caller serialises calls (the library holds one lock).
 */
#ifndef SH_POLICY_H
#define SH_POLICY_H

#include <stddef.h>
#include <stdint.h>

enum sh_policy_kind {
    SH_POLICY_REACTIVE = 0, /* evict least recently used; restore only on demand */
    SH_POLICY_LRU = 1,      /* LRU eviction, plus prefetch of what the last step used next */
    SH_POLICY_LEARNED = 2,  /* next-use distance from the previous step's trace */
    SH_POLICY_BELADY = 3,   /* offline oracle: knows the future trace (stagehand-sim only) */
};

enum sh_policy_residency {
    SH_RES_DEVICE = 0,   /* resident */
    SH_RES_HOST = 1,     /* evicted to host memory */
    SH_RES_TO_HOST = 2,  /* eviction copy in flight */
    SH_RES_TO_DEVICE = 3 /* restore or prefetch copy in flight */
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
    /* Conductor rules (seed 004); conductor_enabled 0 turns all off. */
    int conductor_enabled;
    int backward_pressure_pct;      /* rule 1 threshold, % of budget */
    int backward_prefetch_window;   /* rule 1 window */
    int optimizer_max_inflight_h2d; /* rule 2 cap */
    int contention_checks;          /* rule 3: consecutive full-slot checks */
};

/* Limits in force now; within a step they only tighten (reset at STEP_BEGIN). */
struct sh_policy_hints {
    int prefetch_window;
    int max_inflight_h2d, max_inflight_d2h;
    int suppress_speculative; /* no prefetch at all */
    uint32_t rules_fired;     /* bit i: rule i+1 tightened something this step */
};

struct sh_policy;

int sh_policy_create(const struct sh_policy_params *params, struct sh_policy **out);
void sh_policy_destroy(struct sh_policy *p);

/* ---- events (t_us: the caller's clock, non-decreasing) ---- */
int sh_policy_alloc(struct sh_policy *p, uint64_t t_us, uint64_t id, uint64_t bytes,
                    uint64_t stream);
int sh_policy_free(struct sh_policy *p, uint64_t t_us, uint64_t id);
/* A launch that references regions ids[0..n) (already resident: the caller
 * restores what was evicted before issuing the launch). */
int sh_policy_launch(struct sh_policy *p, uint64_t t_us, uint64_t kernel, uint64_t stream,
                     const uint64_t *ids, size_t n);
/* Explicit marks; when never called, steps are found from the repeating
 * launch sequence (the first launch of step 0 recurring ends step 0). */
int sh_policy_step(struct sh_policy *p, uint64_t t_us);
int sh_policy_phase(struct sh_policy *p, uint64_t t_us, int phase);
/* Residency as the mechanism carried it out. */
int sh_policy_residency(struct sh_policy *p, uint64_t id, int residency);
/* Transfer-slot occupancy seen by the caller (feeds the contention rule). */
void sh_policy_slots(struct sh_policy *p, int h2d_busy, int d2h_busy);

/* ---- decisions ---- */
/* Up to max resident regions to evict, best victim first, whose sizes add
 * up to at least need bytes if possible. Never a region in protect[0..np),
 * in flight, or (for the learned policy) inside the prefetch window.
 * Returns the count. */
size_t sh_policy_victims(struct sh_policy *p, uint64_t need, const uint64_t *protect, size_t np,
                         uint64_t *out, size_t max);
/* Up to max host regions to bring back now, soonest needed first, whose
 * sizes fit in `room` bytes (the caller passes what the high watermark
 * allows). Respects the hints. Returns the count. */
size_t sh_policy_prefetch(struct sh_policy *p, uint64_t room, uint64_t *out, size_t max);
void sh_policy_hints(const struct sh_policy *p, struct sh_policy_hints *out);

/* ---- what it knows ---- */
struct sh_policy_stats {
    int64_t step;     /* current step, -1 before the first is complete */
    int phase;        /* current enum sh_policy_phase */
    int trace_ready;  /* a complete step has been recorded */
    int diverged;     /* the current step departs from the recorded one */
    uint64_t launches_this_step;
    uint64_t persistent, transient; /* regions by class */
};
void sh_policy_stats(const struct sh_policy *p, struct sh_policy_stats *out);
/* The class of a region (persistent once it lives across a step boundary). */
int sh_policy_class(const struct sh_policy *p, uint64_t id);

/* Belady only: gives the policy the whole future (a trace's launches in
 * order) before replay. */
int sh_policy_set_future(struct sh_policy *p, const uint64_t *launch_ids, const size_t *launch_n,
                         size_t nlaunches);

#endif
