/* sched.c — the scheduler inside the library: feeds the policy (policy/)
 * the program's events, asks it which regions to evict, and carries out its
 * plan around each launch: prefetches started ahead of need (their copies
 * overlap compute), evictions ahead of need, batched commits. Records the
 * same events to a trace file when [debug] trace_file (STAGEHAND_TRACE in the
 * environment) names one, with each launch's duration measured on the GPU
 * (timing.c).
 *
 * Region ids, for the policy and the trace, are region base addresses:
 * unique while a region lives, and stable when a freed region is reused for
 * the same size (which is what a training loop does every step).
 *
 * Each managed device has its own policy (struct sh_sched); the trace is
 * the first device's.
 *
 * Locking: a device's mu serialises every call into its policy and the
 * trace writer (neither is thread-safe). No CUDA call is made under it:
 * the pool's moves run between two sections. A device's quiet_at is
 * atomic: its engine pressure as it was when the planner last found
 * nothing on the host, nothing in flight. While the two are equal (so no
 * eviction since), a program that fits pays for no planning at all.
 */
#include "interpose/interpose.h"

#include "map/map.h"
#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_clock.h"
#include "sh_err.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <pthread.h>
#include <stdlib.h>

#define MAX_IDS 256

struct sh_sched {
    pthread_mutex_t mu;
    struct sh_policy *policy;
    struct sh_trace_writer *trace; /* the first device's only */
    /* What a recorded trace learns from clean regions: a region that an
     * eviction finds as its restore left it was only read by the launches
     * recorded since (`i unchanged`, docs/TRACE.md). since_seq: its first
     * launch number since it came back; since_clean: its count of
     * unchanged evictions then (sh_region_info.unchanged). Under mu. */
    struct sh_map since_seq, since_clean;
    /* Steps and phases the policy found by itself, for the monitor. */
    int64_t shown_step;
    int shown_phase;
};

static uint64_t t0_ns;
/* The trace's scheduler, for the launch timings and the exit. */
static struct sh_sched *traced;

static uint64_t now_us(void)
{
    return (sh_clock_ns() - t0_ns) / 1000;
}

static void close_trace(void)
{
    struct sh_sched *sc = traced;
    pthread_mutex_lock(&sc->mu);
    if (sc->trace && sh_trace_writer_close(sc->trace) != 0)
        sh_log(SH_LOG_WARN, "the trace file could not be written completely");
    sc->trace = NULL;
    pthread_mutex_unlock(&sc->mu);
}

static void open_trace(struct sh_sched *sc)
{
    const char *path = sh_rt.cfg.debug.trace_file; /* STAGEHAND_TRACE arrives here too */
    if (!*path)
        return;
    char why[SH_CONFIG_STR_MAX + 64];
    if (sh_trace_writer_create(path, "libstagehand", &sc->trace, why, sizeof why) != 0) {
        sh_log(SH_LOG_WARN, "cannot write the trace to %s; not recording", why);
        return;
    }
    traced = sc;
    atexit(close_trace);
    sh_log(SH_LOG_INFO, "recording a trace to %s", path);
}

/* Writes the measured durations of launches seqs[0..n) to the trace
 * (timing.c calls it back). */
static void write_durations(const uint64_t *seqs, const uint64_t *us, size_t n)
{
    struct sh_sched *sc = traced;
    if (!sc)
        return;
    pthread_mutex_lock(&sc->mu);
    for (size_t i = 0; i < n && sc->trace; i++)
        sh_trace_write_duration(sc->trace, seqs[i], us[i]);
    pthread_mutex_unlock(&sc->mu);
}

int sh_sched_init(struct sh_dev *d)
{
    struct sh_sched *sc = calloc(1, sizeof *sc);
    if (!sc)
        return SH_ENOMEM;
    pthread_mutex_init(&sc->mu, NULL);
    d->sched = sc;
    struct sh_policy_params p;
    if (sh_policy_params_from_config(&sh_rt.cfg, &p) != 0 ||
        sh_policy_create(&p, &sc->policy) != 0) {
        sh_log(SH_LOG_WARN, "device %d: the scheduler could not start; nothing will be evicted",
               d->ordinal);
        sc->policy = NULL;
    }
    if (d != sh_dev_main())
        return 0;
    t0_ns = sh_clock_ns();
    open_trace(sc);
    if (sc->trace)
        sh_timing_init(write_durations);
    if (sc->trace) /* a trace has every launch */
        sh_engine_arm(&d->engine);
    return 0;
}

/* Allocations and frees of this size and more go to the monitor's events:
 * the ones worth seeing, without a stream of per-tensor lines. */
#define EVENT_MIN_BYTES ((size_t)256 << 20)

void sh_sched_alloc(struct sh_dev *d, uintptr_t va, size_t size, uint64_t stream)
{
    struct sh_sched *sc = d->sched;
    if (size >= EVENT_MIN_BYTES)
        sh_sched_announce(d, &va, 1, SH_TM_EV_ALLOC);
    pthread_mutex_lock(&sc->mu);
    uint64_t t = now_us();
    if (sc->policy)
        sh_policy_alloc(sc->policy, t, va, size, stream);
    if (sc->trace)
        sh_trace_write_alloc(sc->trace, t, va, size, stream, SH_CLASS_UNKNOWN);
    pthread_mutex_unlock(&sc->mu);
}

/* The seeds' activation figures: a transient region is an activation,
 * counted when freed, with how often it was spilled and restored. */
static void count_activation(struct sh_dev *d, uintptr_t va)
{
    struct sh_region_info info;
    if (sh_pool_lookup(d->pool, va, &info) != 0)
        return;
    sh_tm_inc(SH_TM_C_activations_saved);
    if (info.evicted == 0)
        sh_tm_inc(SH_TM_C_activations_kept);
    sh_tm_add(SH_TM_C_activations_spilled, info.evicted);
    sh_tm_add(SH_TM_C_activations_restored, info.restored);
    sh_tm_add(SH_TM_C_spill_bytes, (uint64_t)info.evicted * info.mapped);
    sh_tm_add(SH_TM_C_restore_bytes, (uint64_t)info.restored * info.mapped);
}

void sh_sched_free(struct sh_dev *d, uintptr_t va)
{
    struct sh_sched *sc = d->sched;
    struct sh_region_info info;
    if (sh_pool_lookup(d->pool, va, &info) == 0 && info.size >= EVENT_MIN_BYTES)
        sh_monitor_event(SH_TM_EV_FREE, info.id, info.size);
    pthread_mutex_lock(&sc->mu);
    if (sc->trace) { /* an address that comes back is another region */
        sh_map_del(&sc->since_seq, va);
        sh_map_del(&sc->since_clean, va);
    }
    uint64_t t = now_us();
    if (sc->policy) {
        sh_policy_free(sc->policy, t, va);
        int cls = sh_policy_class(sc->policy, va); /* transient: freed in the step it was made */
        sh_policy_forget(sc->policy, va); /* the pool drops or reuses freed regions itself */
        if (cls == SH_CLASS_TRANSIENT)
            count_activation(d, va);
        if (sc->trace)
            sh_trace_write_free(sc->trace, t, va, cls);
    } else if (sc->trace) {
        sh_trace_write_free(sc->trace, t, va, SH_CLASS_UNKNOWN);
    }
    pthread_mutex_unlock(&sc->mu);
}

/* For the helpers every launch runs: no call in the way. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* The policy and the trace told of a launch; sc->mu held. Returns in
 * step and phase what the monitor has not been shown yet (-1: nothing). */
static ALWAYS_INLINE void launch_locked(struct sh_sched *sc, uint64_t kernel, uint64_t stream,
                                        const uintptr_t *bases, size_t n, int64_t *step, int *phase)
{
    uint64_t t = sc->trace ? now_us() : 0; /* the policy keeps launches in order, not in time */
    int64_t now_step = sc->shown_step;
    int now_phase = sc->shown_phase;
    if (sc->policy) {
        sh_policy_launch(sc->policy, t, kernel, stream, (const uint64_t *)bases, n);
        sh_policy_where(sc->policy, &now_step, &now_phase);
    }
    if (sc->trace) {
        /* The duration follows in a 'd' record once the GPU has run it. */
        uint64_t seq = UINT64_MAX;
        sh_trace_write_launch(sc->trace, t, SH_TRACE_NO_DUR, stream, kernel,
                              (const uint64_t *)bases, n, &seq);
        sh_timing_launch(seq);
    }
    *step = now_step != sc->shown_step ? (sc->shown_step = now_step) : -1;
    *phase = now_phase != sc->shown_phase ? (sc->shown_phase = now_phase) : -1;
}

/* The monitor reads the scheduler's figures, so it is above it: told of
 * what the policy finds through a pointer it sets when it starts. */
static void (*_Atomic where_to)(int64_t step, int phase);

void sh_sched_on_where(void (*fn)(int64_t step, int phase))
{
    atomic_store_explicit(&where_to, fn, memory_order_release);
}

/* After d's mu: the step and phase launch_locked found (the main device's
 * are shown). */
static ALWAYS_INLINE void show_where(const struct sh_dev *d, int64_t step, int phase)
{
    if (d != sh_dev_main())
        return;
    if (step >= 0 && atomic_load(&sh_rt.step)) /* explicit marks, when used, already did */
        step = -1;
    if (step < 0 && phase < 0)
        return;
    void (*fn)(int64_t, int) = atomic_load_explicit(&where_to, memory_order_acquire);
    if (fn)
        fn(step, phase);
}

void sh_sched_launch(struct sh_dev *d, uint64_t kernel, uint64_t stream, const uintptr_t *bases,
                     size_t n)
{
    if (!sh_engine_armed(&d->engine)) /* far below the limit: nothing to learn yet */
        return;
    int64_t step;
    int phase;
    pthread_mutex_lock(&d->sched->mu);
    launch_locked(d->sched, kernel, stream, bases, n, &step, &phase);
    pthread_mutex_unlock(&d->sched->mu);
    show_where(d, step, phase);
}

static void mark(struct sh_sched *sc, int step, int phase)
{
    pthread_mutex_lock(&sc->mu);
    uint64_t t = now_us();
    if (step) {
        if (sc->policy)
            sh_policy_step(sc->policy, t);
        if (sc->trace)
            sh_trace_write_step(sc->trace, t, (uint64_t)atomic_load(&sh_rt.step), 1);
    } else {
        if (sc->policy)
            sh_policy_phase(sc->policy, t, phase);
        if (sc->trace)
            sh_trace_write_phase(sc->trace, t, phase, 1);
    }
    pthread_mutex_unlock(&sc->mu);
}

void sh_sched_mark(int step, int phase)
{
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int i = 0; i < n; i++)
        mark(sh_rt.devs[i]->sched, step, phase);
}

/* Regions back on the device: which keep a host copy (clean regions), so
 * that learned weighs them as cheap victims. Asked of the pool before
 * sched_mu, which is never held over the pool's locks. */
#define KEPT_BATCH 64
static void tell_kept(struct sh_dev *d, const uintptr_t *bases, size_t n)
{
    if (!sh_rt.cfg.policy.clean_skip || sh_rt.cfg.policy.eviction != SH_CONFIG_EVICT_LEARNED)
        return;
    for (size_t at = 0; at < n; at += KEPT_BATCH) {
        size_t k = n - at < KEPT_BATCH ? n - at : KEPT_BATCH;
        uint8_t kept[KEPT_BATCH];
        sh_pool_kept_of(d->pool, bases + at, k, kept);
        pthread_mutex_lock(&d->sched->mu);
        for (size_t i = 0; i < k; i++)
            sh_policy_kept(d->sched->policy, bases[at + i], kept[i]);
        pthread_mutex_unlock(&d->sched->mu);
    }
}

/* Regions that came back (on_device) or went to the host: the trace notes
 * when, or writes what an unchanged eviction taught. The pool is read
 * first: sched_mu is never held over its locks. */
static void trace_moved(struct sh_dev *d, const uintptr_t *bases, size_t n, int on_device)
{
    struct sh_sched *sc = d->sched;
    if (sc != traced)
        return;
    for (size_t at = 0; at < n; at += KEPT_BATCH) {
        size_t k = n - at < KEPT_BATCH ? n - at : KEPT_BATCH;
        uint32_t clean[KEPT_BATCH];
        for (size_t i = 0; i < k; i++) {
            struct sh_region_info info;
            clean[i] = sh_pool_lookup(d->pool, bases[at + i], &info) == 0 ? info.unchanged : 0;
        }
        pthread_mutex_lock(&sc->mu);
        uint64_t next = sc->trace ? sh_trace_writer_launches(sc->trace) : SH_MAP_NONE;
        for (size_t i = 0; sc->trace && i < k && next < SH_MAP_NONE; i++) {
            uintptr_t va = bases[at + i];
            uint32_t first = sh_map_get(&sc->since_seq, va), had = sh_map_get(&sc->since_clean, va);
            if (on_device && first == SH_MAP_NONE) {
                sh_map_set(&sc->since_clean, va, clean[i]); /* no room: nothing learnt, no harm */
                sh_map_set(&sc->since_seq, va, (uint32_t)next);
            } else if (!on_device && first != SH_MAP_NONE) {
                if (had != SH_MAP_NONE && clean[i] > had && next > first)
                    sh_trace_write_unchanged(sc->trace, va, first, next - 1);
                sh_map_del(&sc->since_seq, va);
                sh_map_del(&sc->since_clean, va);
            }
        }
        pthread_mutex_unlock(&sc->mu);
    }
}

void sh_sched_residency(struct sh_dev *d, const uintptr_t *bases, size_t n, int on_device)
{
    struct sh_sched *sc = d->sched;
    trace_moved(d, bases, n, on_device);
    if (!sc->policy)
        return;
    pthread_mutex_lock(&sc->mu);
    for (size_t i = 0; i < n; i++)
        sh_policy_residency(sc->policy, bases[i], on_device ? SH_RES_DEVICE : SH_RES_HOST);
    pthread_mutex_unlock(&sc->mu);
    if (on_device)
        tell_kept(d, bases, n);
}

void sh_sched_pinned(struct sh_dev *d, uintptr_t va)
{
    struct sh_sched *sc = d->sched;
    if (!sc->policy)
        return;
    pthread_mutex_lock(&sc->mu);
    sh_policy_pinned(sc->policy, va);
    pthread_mutex_unlock(&sc->mu);
}

size_t sh_sched_victims(struct sh_dev *d, size_t need, const uintptr_t *protect, size_t np,
                        uintptr_t *out, size_t max)
{
    struct sh_sched *sc = d->sched;
    if (!sc->policy)
        return 0;
    pthread_mutex_lock(&sc->mu);
    size_t n =
        sh_policy_victims(sc->policy, need, (const uint64_t *)protect, np, (uint64_t *)out, max);
    pthread_mutex_unlock(&sc->mu);
    return n;
}

int sh_sched_stats(struct sh_dev *d, struct sh_sched_stats *out)
{
    struct sh_sched *sc = d->sched;
    if (!sc->policy)
        return -1;
    struct sh_policy_stats st;
    pthread_mutex_lock(&sc->mu);
    sh_policy_stats(sc->policy, &st);
    pthread_mutex_unlock(&sc->mu);
    *out = (struct sh_sched_stats){.step = st.step,
                                   .phase = st.phase,
                                   .trace_ready = st.trace_ready,
                                   .persistent = st.persistent,
                                   .transient = st.transient,
                                   .launches = st.launches,
                                   .steps_followed = st.steps_matched,
                                   .steps_departed = st.steps_diverged};
    return 0;
}

int sh_sched_class(struct sh_dev *d, uintptr_t va)
{
    struct sh_sched *sc = d->sched;
    if (!sc->policy)
        return SH_CLASS_UNKNOWN;
    pthread_mutex_lock(&sc->mu);
    int cls = sh_policy_class(sc->policy, va);
    pthread_mutex_unlock(&sc->mu);
    return cls < 0 ? SH_CLASS_UNKNOWN : cls;
}

/* ---- prefetch: the policy's plan carried out ---- */

#define MAX_PLAN 64

static int prefetching(const struct sh_dev *d)
{
    return d->sched->policy && d->xfer && sh_rt.cfg.policy.prefetch_enabled;
}

/* Records that the pool was all on the device, nothing in flight, as of
 * pressure count p (read before the pool was). */
static void note_quiet(struct sh_dev *d, uint64_t p, size_t host_bytes, size_t inflight,
                       size_t evicting)
{
    if (host_bytes == 0 && inflight == 0 && evicting == 0)
        atomic_store_explicit(&d->quiet_at, p, memory_order_release);
}

void sh_sched_announce(struct sh_dev *d, const uintptr_t *bases, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++) {
        struct sh_region_info info;
        if (sh_pool_lookup(d->pool, bases[i], &info) == 0)
            sh_monitor_event(kind, info.id, info.size);
    }
}

static void tell(struct sh_dev *d, const uintptr_t *bases, size_t n, int residency)
{
    if (residency == SH_RES_DEVICE || residency == SH_RES_HOST)
        trace_moved(d, bases, n, residency == SH_RES_DEVICE);
    pthread_mutex_lock(&d->sched->mu);
    for (size_t i = 0; i < n; i++)
        sh_policy_residency(d->sched->policy, bases[i], residency);
    pthread_mutex_unlock(&d->sched->mu);
    if (residency == SH_RES_DEVICE)
        tell_kept(d, bases, n);
    if (residency == SH_RES_HOST)
        sh_sched_announce(d, bases, n, SH_TM_EV_EVICT);
    else if (residency == SH_RES_TO_DEVICE)
        sh_sched_announce(d, bases, n, SH_TM_EV_PREFETCH);
}

/* Launches held for residency, and how long: with or without the policy. */
static uint64_t stalls, stall_us;

void sh_sched_stalls(uint64_t *n, uint64_t *us)
{
    *n = __atomic_load_n(&stalls, __ATOMIC_RELAXED);
    *us = __atomic_load_n(&stall_us, __ATOMIC_RELAXED);
}

void sh_sched_stall(struct sh_dev *d, uintptr_t base, uint64_t wait_us)
{
    __atomic_add_fetch(&stalls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&stall_us, wait_us, __ATOMIC_RELAXED);
    struct sh_region_info info;
    if (sh_pool_lookup(d->pool, base, &info) == 0)
        sh_monitor_event(SH_TM_EV_STALL, info.id, wait_us);
    if (!d->sched->policy)
        return;
    pthread_mutex_lock(&d->sched->mu);
    sh_policy_stall(d->sched->policy, now_us(), base, wait_us);
    pthread_mutex_unlock(&d->sched->mu);
}

/* Commits every prefetch in flight. The window's drain waits for all copies
 * queued anyway, so those not finished yet cost no more than the others.
 * The room lock held: a move and the policy's hearing of it happen as one
 * to a caller making room. Else, between a commit taking its regions off
 * their list and telling the policy they landed, an allocation on another
 * thread found their device memory neither a victim's nor in flight, and
 * ran out of memory (test_e2e_evict's stress, one run in fifteen to thirty). */
size_t sh_sched_commit_all(struct sh_dev *d)
{
    size_t max = sh_rt.cfg.transfer.batch_max > 0 ? (size_t)sh_rt.cfg.transfer.batch_max : 16;
    uintptr_t done[MAX_PLAN];
    size_t total = 0, n = 0;
    size_t inflight = 0;
    sh_pool_prefetch_ready(d->pool, &inflight);
    while (inflight > 0) {
        size_t want = max < MAX_PLAN ? max : MAX_PLAN;
        if (sh_pool_prefetch_commit(d->pool, 1, done, want, &n) != 0 && n == 0)
            break;
        tell(d, done, n, SH_RES_DEVICE);
        total += n;
        inflight = inflight > want ? inflight - want : 0;
    }
    return total;
}

size_t sh_sched_prefetch_wait(struct sh_dev *d, const uintptr_t *bases, size_t n)
{
    if (!d->xfer || sh_sched_quiet(d) || sh_pool_prefetch_needed(d->pool, bases, n) == 0)
        return 0;
    sh_engine_lock(&d->engine);
    size_t landed = sh_sched_commit_all(d);
    sh_engine_unlock(&d->engine);
    return landed;
}

/* Commits early evictions: all, or those whose copies have finished.
 * Returns the device bytes released. The room lock held, as for
 * sh_sched_commit_all. */
size_t sh_sched_evict_commit(struct sh_dev *d, int all)
{
    if (!d->xfer)
        return 0;
    size_t max = sh_rt.cfg.transfer.batch_max > 0 ? (size_t)sh_rt.cfg.transfer.batch_max : 16;
    uintptr_t done[MAX_PLAN], back[MAX_PLAN];
    size_t total = 0, inflight = 0;
    size_t ready = sh_pool_evict_ready(d->pool, &inflight);
    size_t left = all ? inflight : ready;
    while (left > 0) {
        size_t want = max < MAX_PLAN ? max : MAX_PLAN, n = 0, nback = 0, released = 0;
        if (sh_pool_evict_commit(d->pool, all, done, back, want, &n, &nback, &released) != 0 &&
            n + nback == 0)
            break;
        tell(d, done, n, SH_RES_HOST);
        tell(d, back, nback, SH_RES_DEVICE);
        total += released;
        left = left > want ? left - want : 0;
    }
    return total;
}

/* Plans between two measures of the memory held outside the pool (each
 * a driver call); allocations measure it too. */
#define RESERVE_EVERY 256

static int planning(const struct sh_dev *d)
{
    return prefetching(d) && !sh_capturing() && !sh_sched_quiet(d);
}

/* What a plan reads from the pool, read before sched_mu: evicting counts
 * the early evictions whose copies are on the link, inflight every
 * prefetch not yet committed, ready those whose copies are done. */
struct plan_in {
    size_t evicting, inflight, ready, dev;
};

/* The engine's view: a prefetch whose copies are done waits for its
 * commit, not for the link, so it takes none of the max_inflight_h2d
 * slots (its device chunks count in dev); stagehand-sim counts the same. */
static ALWAYS_INLINE struct sh_engine_plan_in engine_in(const struct plan_in *in)
{
    return (struct sh_engine_plan_in){.dev = in->dev,
                                      .fetching = in->inflight - in->ready,
                                      .evicting = in->evicting,
                                      .fetched = in->ready};
}

/* Reads the pool for a plan; evicting as sh_pool_evict_ready found it;
 * moving 0: sh_pool_moving() said nothing is in flight. */
static ALWAYS_INLINE void plan_read(struct sh_dev *d, struct plan_in *in, uint64_t pressure,
                                    int moving)
{
    in->ready = moving ? sh_pool_prefetch_ready(d->pool, &in->inflight) : 0;
    size_t device_bytes, host_bytes;
    sh_pool_bytes(d->pool, &device_bytes, &host_bytes);
    /* The policy plans against the budget: memory held outside the pool
     * counts as used, so that prefetches leave it room. */
    static atomic_uint plans;
    int fresh = atomic_fetch_add_explicit(&plans, 1, memory_order_relaxed) % RESERVE_EVERY == 0;
    in->dev = device_bytes + sh_engine_reserve_recent(&d->engine, device_bytes, fresh);
    note_quiet(d, pressure, host_bytes, in->inflight, in->evicting);
}

/* The policy's plan (engine/plan.c); sched_mu held. Returns whether a
 * commit is due; negative when there is nothing to start (idle, or the
 * plan failed). */
static ALWAYS_INLINE int plan_locked(struct sh_dev *d, const struct plan_in *in,
                                     const uintptr_t *bases, size_t nb, struct sh_policy_plan *plan)
{
    const struct sh_engine_plan_in pin = engine_in(in);
    struct sh_policy_hints h;
    int changed = 0;
    plan->fetch_max = plan->evict_max = MAX_PLAN;
    int due = sh_engine_plan(&d->engine, d->sched->policy, &pin, (const uint64_t *)bases, nb, plan,
                             &h, &changed);
    if (changed)
        sh_sched_hints(d, &h);
    return due;
}

/* ---- a decision point's moves, on the pool (the engine's ops) ---- */

size_t sh_sched_evicted_ready(void *ctx)
{
    struct sh_dev *d = ctx;
    size_t inflight = 0;
    return sh_pool_evict_ready(d->pool, &inflight);
}

int sh_sched_commit_evicted(void *ctx)
{
    struct sh_dev *d = ctx;
    sh_engine_lock(&d->engine);
    sh_sched_evict_commit(d, 0);
    sh_engine_unlock(&d->engine);
    return 0;
}

void sh_sched_read(void *ctx, struct sh_engine_plan_in *out)
{
    struct sh_dev *d = ctx;
    struct plan_in in = {0};
    uint64_t pressure = atomic_load_explicit(&d->engine.pressure, memory_order_acquire);
    size_t done = sh_pool_evict_ready(d->pool, &in.evicting);
    in.evicting -= done; /* finished, not committed (a window that failed): no slot */
    plan_read(d, &in, pressure, 1);
    *out = engine_in(&in);
}

void sh_sched_lock(void *ctx)
{
    struct sh_dev *d = ctx;
    pthread_mutex_lock(&d->sched->mu);
}

void sh_sched_unlock(void *ctx)
{
    struct sh_dev *d = ctx;
    pthread_mutex_unlock(&d->sched->mu);
}

int sh_sched_start_evictions(void *ctx, const uint64_t *ids, size_t n)
{
    struct sh_dev *d = ctx;
    uintptr_t moved[MAX_PLAN];
    size_t nm = 0;
    n = n < MAX_PLAN ? n : MAX_PLAN;
    sh_pool_evict_drain(d->pool, (const uintptr_t *)ids, n);
    sh_engine_lock(&d->engine); /* started and told as one (sh_sched_commit_all) */
    if (sh_pool_evict_start(d->pool, (const uintptr_t *)ids, n, moved, &nm) == SH_OK) {
        atomic_fetch_add(&d->engine.pressure, 1); /* not quiet while they fly */
        tell(d, moved, nm, SH_RES_TO_HOST);
    }
    sh_engine_unlock(&d->engine);
    return 0; /* what could not start stays where it is: the next plan sees it */
}

size_t sh_sched_device_bytes(struct sh_dev *d)
{
    size_t dev = 0, host = 0;
    sh_pool_bytes(d->pool, &dev, &host);
    return dev + sh_fingerprint_device_bytes(d->fp);
}

/* How many of the fetches ids[0..n), in order, fit the budget now; the
 * room lock held. The plan read the pool before taking it, and another
 * thread may have taken room since (an allocation, a restore on demand):
 * what no longer fits waits for the next plan. */
static size_t fetches_fitting(struct sh_dev *d, const uint64_t *ids, size_t n)
{
    size_t dev = sh_sched_device_bytes(d);
    size_t used = dev + sh_engine_reserve_recent(&d->engine, dev, 0);
    size_t k = 0;
    for (; k < n; k++) {
        struct sh_region_info info;
        size_t need = sh_pool_lookup(d->pool, (uintptr_t)ids[k], &info) == 0 ? info.mapped : 0;
        if (used + need > d->engine.cfg.budget)
            break;
        used += need;
    }
    return k;
}

int sh_sched_start_fetches(void *ctx, const uint64_t *ids, size_t n)
{
    struct sh_dev *d = ctx;
    uintptr_t moved[MAX_PLAN];
    size_t nm = 0;
    n = n < MAX_PLAN ? n : MAX_PLAN;
    sh_engine_lock(&d->engine);
    n = fetches_fitting(d, ids, n);
    if (n > 0 && sh_pool_prefetch_start(d->pool, (const uintptr_t *)ids, n, moved, &nm) == SH_OK)
        tell(d, moved, nm, SH_RES_TO_DEVICE);
    sh_engine_unlock(&d->engine);
    return 0;
}

int sh_sched_commit_fetched(void *ctx)
{
    struct sh_dev *d = ctx;
    sh_engine_lock(&d->engine);
    sh_sched_commit_all(d);
    sh_engine_unlock(&d->engine);
    return 0;
}

/* stagehand-top shows the hints in force. */
void sh_sched_hints(void *ctx, const struct sh_policy_hints *h)
{
    if (ctx != sh_dev_main())
        return;
    sh_tm_hints(h->prefetch_window, h->max_inflight_h2d, h->max_inflight_d2h,
                h->suppress_speculative, h->rules_fired);
}

void sh_sched_plan(struct sh_dev *d, const uintptr_t *bases, size_t nb)
{
    if (!planning(d))
        return;
    uint64_t fetch[MAX_PLAN], evict[MAX_PLAN];
    struct sh_policy_plan plan = {
        .fetch = fetch, .fetch_max = MAX_PLAN, .evict = evict, .evict_max = MAX_PLAN};
    sh_engine_decide(&d->engine, d->sched->policy, (const uint64_t *)bases, nb, &plan);
}

/* A launch's recording and plan under one hold of sched_mu: the pool is
 * read first (recording a launch changes nothing there). With early
 * evictions to commit first, the two go one after the other as before. */
void sh_sched_launch_plan(struct sh_dev *d, uint64_t kernel, uint64_t stream,
                          const uintptr_t *bases, size_t n)
{
    struct plan_in in = {0};
    uint64_t pressure = atomic_load_explicit(&d->engine.pressure, memory_order_acquire);
    int moving = 0;
    if (!planning(d) ||
        ((moving = sh_pool_moving(d->pool)) && sh_pool_evict_ready(d->pool, &in.evicting) > 0)) {
        sh_sched_launch(d, kernel, stream, bases, n);
        sh_sched_plan(d, bases, n);
        return;
    }
    plan_read(d, &in, pressure, moving);
    uint64_t fetch[MAX_PLAN], evict[MAX_PLAN];
    struct sh_policy_plan plan = {.fetch = fetch, .evict = evict};
    int armed = sh_engine_armed(&d->engine);
    int64_t step = -1;
    int phase = -1;
    pthread_mutex_lock(&d->sched->mu);
    if (armed) /* far below the limit: nothing to learn yet */
        launch_locked(d->sched, kernel, stream, bases, n, &step, &phase);
    int due = plan_locked(d, &in, bases, n, &plan);
    pthread_mutex_unlock(&d->sched->mu);
    show_where(d, step, phase);
    if (due >= 0)
        sh_engine_start(&d->engine, &plan, due);
}
