/* sched.c — the scheduler inside the library: feeds the policy (policy/)
 * the program's events, asks it which regions to evict, and carries out its
 * plan around each launch: prefetches started ahead of need (their copies
 * overlap compute), evictions ahead of need, batched commits. Records the
 * same events to a trace file when [debug] trace_file (STAGEHAND_TRACE in the
 * environment) names one, with each launch's duration measured on the GPU.
 *
 * Region ids, for the policy and the trace, are region base addresses:
 * unique while a region lives, and stable when a freed region is reused for
 * the same size (which is what a training loop does every step).
 *
 * Locking: sched_mu serialises every call into the policy and the trace
 * writer (neither is thread-safe). No CUDA call is made
 * under it: the pool's moves run between two sections. timing_mu guards the
 * ring of launch timings; the event calls made under it never block.
 * quiet_at is atomic: sh_rt.engine.pressure as it was when the planner last found
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

static pthread_mutex_t sched_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sh_policy *policy;
static struct sh_trace_writer *trace;
/* What a recorded trace learns from clean regions: a region that an
 * eviction finds as its restore left it was only read by the launches
 * recorded since (`i unchanged`, docs/TRACE.md). since_seq: its first
 * launch number since it came back; since_clean: its count of unchanged
 * evictions then (sh_region_info.unchanged). Under sched_mu. */
static struct sh_map since_seq, since_clean;
static uint64_t t0_ns;
static atomic_ullong quiet_at;
static _Thread_local uint64_t last_seq = UINT64_MAX; /* this thread's last launch in the trace */

static uint64_t now_us(void)
{
    return (sh_clock_ns() - t0_ns) / 1000;
}

static void close_trace(void)
{
    pthread_mutex_lock(&sched_mu);
    if (trace && sh_trace_writer_close(trace) != 0)
        sh_log(SH_LOG_WARN, "the trace file could not be written completely");
    trace = NULL;
    pthread_mutex_unlock(&sched_mu);
}

static void open_trace(void)
{
    const char *path = sh_rt.cfg.debug.trace_file; /* STAGEHAND_TRACE arrives here too */
    if (!*path)
        return;
    char why[SH_CONFIG_STR_MAX + 64];
    if (sh_trace_writer_create(path, "libstagehand", &trace, why, sizeof why) != 0) {
        sh_log(SH_LOG_WARN, "cannot write the trace to %s; not recording", why);
        return;
    }
    atexit(close_trace);
    sh_log(SH_LOG_INFO, "recording a trace to %s", path);
}

/* ---- launch durations, measured on the GPU ----
 *
 * Two timing events per launch on the legacy default stream: one recorded
 * just before the launch is issued, and the next launch's first (recorded
 * as its preparation starts, before any remap window). The time between
 * them on the GPU is the launch's run time, plus any time the GPU waited
 * for the program to issue the next one (host work the simulator then
 * counts as part of the launch). Remap windows fall outside every launch:
 * stagehand-sim models them itself. Only while a trace is recorded: an
 * event on the legacy stream orders it against the program's blocking
 * streams. A launch still pending at exit keeps no duration. */

#define TIMINGS 1024

struct timing {
    uint64_t seq;
    CUevent start, end;
};

static pthread_mutex_t timing_mu = PTHREAD_MUTEX_INITIALIZER;
static struct timing ring[TIMINGS];
static unsigned ring_head, ring_count;
static CUresult (*event_elapsed)(float *, CUevent, CUevent);
static int timing_on;

static void timing_init(void)
{
    CUdriverProcAddressQueryResult q;
    if (!trace || sh_rt.drv.cuGetProcAddress("cuEventElapsedTime", (void **)&event_elapsed,
                                             SH_DRIVER_ABI, 0, &q) != CUDA_SUCCESS)
        event_elapsed = NULL;
    timing_on = event_elapsed != NULL;
}

static CUevent timing_event(void)
{
    CUevent ev = NULL;
    if (sh_rt.drv.cuEventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    if (sh_rt.drv.cuEventRecord(ev, NULL) != CUDA_SUCCESS) {
        sh_rt.drv.cuEventDestroy(ev);
        return NULL;
    }
    return ev;
}

static void drop_timing(const struct timing *t)
{
    if (t->start)
        sh_rt.drv.cuEventDestroy(t->start);
    if (t->end)
        sh_rt.drv.cuEventDestroy(t->end);
}

/* Takes the measured launches off the ring, oldest first; timing_mu held. */
static size_t timings_done(struct timing *out, uint64_t *us, size_t max)
{
    size_t n = 0;
    while (ring_count > 0 && n < max) {
        struct timing *t = &ring[ring_head];
        float ms = 0;
        if (!t->end || sh_rt.drv.cuEventQuery(t->end) != CUDA_SUCCESS)
            break;
        us[n] = event_elapsed(&ms, t->start, t->end) == CUDA_SUCCESS && ms >= 0
                    ? (uint64_t)((double)ms * 1000.0 + 0.5)
                    : SH_TRACE_NO_DUR;
        out[n++] = *t;
        ring_head = (ring_head + 1) % TIMINGS;
        ring_count--;
    }
    return n;
}

void sh_sched_timing_begin(void)
{
    if (!timing_on)
        return;
    CUevent ev = timing_event();
    struct timing done[64];
    uint64_t us[64];
    pthread_mutex_lock(&timing_mu);
    struct timing *last = ring_count ? &ring[(ring_head + ring_count - 1) % TIMINGS] : NULL;
    if (last && !last->end) {
        last->end = ev;
        ev = NULL;
    }
    size_t n = timings_done(done, us, 64);
    pthread_mutex_unlock(&timing_mu);
    if (ev)
        sh_rt.drv.cuEventDestroy(ev);
    pthread_mutex_lock(&sched_mu);
    for (size_t i = 0; i < n && trace; i++)
        sh_trace_write_duration(trace, done[i].seq, us[i]);
    pthread_mutex_unlock(&sched_mu);
    for (size_t i = 0; i < n; i++)
        drop_timing(&done[i]);
}

void sh_sched_timing_issue(void)
{
    if (!timing_on || last_seq == UINT64_MAX)
        return;
    struct timing t = {.seq = last_seq, .start = timing_event()}, old = {0};
    last_seq = UINT64_MAX;
    if (!t.start)
        return;
    pthread_mutex_lock(&timing_mu);
    if (ring_count == TIMINGS) { /* never measured: that launch keeps no duration */
        old = ring[ring_head];
        ring_head = (ring_head + 1) % TIMINGS;
        ring_count--;
    }
    ring[(ring_head + ring_count) % TIMINGS] = t;
    ring_count++;
    pthread_mutex_unlock(&timing_mu);
    drop_timing(&old);
}

int sh_sched_init(void)
{
    t0_ns = sh_clock_ns();
    struct sh_policy_params p;
    if (sh_policy_params_from_config(&sh_rt.cfg, &p) != 0 || sh_policy_create(&p, &policy) != 0) {
        sh_log(SH_LOG_WARN, "the scheduler could not start; nothing will be evicted");
        policy = NULL;
    }
    open_trace();
    timing_init();
    if (trace) /* a trace has every launch */
        sh_engine_arm(&sh_rt.engine);
    return 0;
}

/* Allocations and frees of this size and more go to the monitor's events:
 * the ones worth seeing, without a stream of per-tensor lines. */
#define EVENT_MIN_BYTES ((size_t)256 << 20)

void sh_sched_alloc(uintptr_t va, size_t size, uint64_t stream)
{
    if (size >= EVENT_MIN_BYTES)
        sh_sched_announce(&va, 1, SH_TM_EV_ALLOC);
    pthread_mutex_lock(&sched_mu);
    uint64_t t = now_us();
    if (policy)
        sh_policy_alloc(policy, t, va, size, stream);
    if (trace)
        sh_trace_write_alloc(trace, t, va, size, stream, SH_CLASS_UNKNOWN);
    pthread_mutex_unlock(&sched_mu);
}

/* The seeds' activation figures: a transient region is an activation,
 * counted when freed, with how often it was spilled and restored. */
static void count_activation(uintptr_t va)
{
    struct sh_region_info info;
    if (sh_pool_lookup(sh_rt.pool, va, &info) != 0)
        return;
    sh_tm_inc(SH_TM_C_activations_saved);
    if (info.evicted == 0)
        sh_tm_inc(SH_TM_C_activations_kept);
    sh_tm_add(SH_TM_C_activations_spilled, info.evicted);
    sh_tm_add(SH_TM_C_activations_restored, info.restored);
    sh_tm_add(SH_TM_C_spill_bytes, (uint64_t)info.evicted * info.mapped);
    sh_tm_add(SH_TM_C_restore_bytes, (uint64_t)info.restored * info.mapped);
}

void sh_sched_free(uintptr_t va)
{
    struct sh_region_info info;
    if (sh_pool_lookup(sh_rt.pool, va, &info) == 0 && info.size >= EVENT_MIN_BYTES)
        sh_monitor_event(SH_TM_EV_FREE, info.id, info.size);
    pthread_mutex_lock(&sched_mu);
    if (trace) { /* an address that comes back is another region */
        sh_map_del(&since_seq, va);
        sh_map_del(&since_clean, va);
    }
    uint64_t t = now_us();
    if (policy) {
        sh_policy_free(policy, t, va);
        int cls = sh_policy_class(policy, va); /* transient: freed in the step it was made */
        sh_policy_forget(policy, va);          /* the pool drops or reuses freed regions itself */
        if (cls == SH_CLASS_TRANSIENT)
            count_activation(va);
        if (trace)
            sh_trace_write_free(trace, t, va, cls);
    } else if (trace) {
        sh_trace_write_free(trace, t, va, SH_CLASS_UNKNOWN);
    }
    pthread_mutex_unlock(&sched_mu);
}

/* Steps and phases the policy found by itself, for the monitor. */
static int64_t shown_step;
static int shown_phase;

/* For the helpers every launch runs: no call in the way. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* The policy and the trace told of a launch; sched_mu held. Returns in
 * step and phase what the monitor has not been shown yet (-1: nothing). */
static ALWAYS_INLINE void launch_locked(uint64_t kernel, uint64_t stream, const uintptr_t *bases,
                                        size_t n, int64_t *step, int *phase)
{
    uint64_t t = trace ? now_us() : 0; /* the policy keeps launches in order, not in time */
    int64_t now_step = shown_step;
    int now_phase = shown_phase;
    if (policy) {
        sh_policy_launch(policy, t, kernel, stream, (const uint64_t *)bases, n);
        sh_policy_where(policy, &now_step, &now_phase);
    }
    if (trace) {
        /* The duration follows in a 'd' record once the GPU has run it. */
        uint64_t seq = UINT64_MAX;
        sh_trace_write_launch(trace, t, SH_TRACE_NO_DUR, stream, kernel, (const uint64_t *)bases, n,
                              &seq);
        last_seq = seq;
    }
    *step = now_step != shown_step ? (shown_step = now_step) : -1;
    *phase = now_phase != shown_phase ? (shown_phase = now_phase) : -1;
}

/* The monitor reads the scheduler's figures, so it is above it: told of
 * what the policy finds through a pointer it sets when it starts. */
static void (*_Atomic where_to)(int64_t step, int phase);

void sh_sched_on_where(void (*fn)(int64_t step, int phase))
{
    atomic_store_explicit(&where_to, fn, memory_order_release);
}

/* After sched_mu: the step and phase launch_locked found. */
static ALWAYS_INLINE void show_where(int64_t step, int phase)
{
    if (step >= 0 && atomic_load(&sh_rt.step)) /* explicit marks, when used, already did */
        step = -1;
    if (step < 0 && phase < 0)
        return;
    void (*fn)(int64_t, int) = atomic_load_explicit(&where_to, memory_order_acquire);
    if (fn)
        fn(step, phase);
}

void sh_sched_launch(uint64_t kernel, uint64_t stream, const uintptr_t *bases, size_t n)
{
    if (!sh_engine_armed(&sh_rt.engine)) /* far below the limit: nothing to learn yet */
        return;
    int64_t step;
    int phase;
    pthread_mutex_lock(&sched_mu);
    launch_locked(kernel, stream, bases, n, &step, &phase);
    pthread_mutex_unlock(&sched_mu);
    show_where(step, phase);
}

void sh_sched_mark(int step, int phase)
{
    pthread_mutex_lock(&sched_mu);
    uint64_t t = now_us();
    if (step) {
        if (policy)
            sh_policy_step(policy, t);
        if (trace)
            sh_trace_write_step(trace, t, (uint64_t)atomic_load(&sh_rt.step), 1);
    } else {
        if (policy)
            sh_policy_phase(policy, t, phase);
        if (trace)
            sh_trace_write_phase(trace, t, phase, 1);
    }
    pthread_mutex_unlock(&sched_mu);
}

/* Regions back on the device: which keep a host copy (clean regions), so
 * that learned weighs them as cheap victims. Asked of the pool before
 * sched_mu, which is never held over the pool's locks. */
#define KEPT_BATCH 64
static void tell_kept(const uintptr_t *bases, size_t n)
{
    if (!sh_rt.cfg.policy.clean_skip || sh_rt.cfg.policy.eviction != SH_CONFIG_EVICT_LEARNED)
        return;
    for (size_t at = 0; at < n; at += KEPT_BATCH) {
        size_t k = n - at < KEPT_BATCH ? n - at : KEPT_BATCH;
        uint8_t kept[KEPT_BATCH];
        sh_pool_kept_of(sh_rt.pool, bases + at, k, kept);
        pthread_mutex_lock(&sched_mu);
        for (size_t i = 0; i < k; i++)
            sh_policy_kept(policy, bases[at + i], kept[i]);
        pthread_mutex_unlock(&sched_mu);
    }
}

/* Regions that came back (on_device) or went to the host: the trace notes
 * when, or writes what an unchanged eviction taught. The pool is read
 * first: sched_mu is never held over its locks. */
static void trace_moved(const uintptr_t *bases, size_t n, int on_device)
{
    if (!sh_rt.cfg.debug.trace_file[0])
        return;
    for (size_t at = 0; at < n; at += KEPT_BATCH) {
        size_t k = n - at < KEPT_BATCH ? n - at : KEPT_BATCH;
        uint32_t clean[KEPT_BATCH];
        for (size_t i = 0; i < k; i++) {
            struct sh_region_info info;
            clean[i] = sh_pool_lookup(sh_rt.pool, bases[at + i], &info) == 0 ? info.unchanged : 0;
        }
        pthread_mutex_lock(&sched_mu);
        uint64_t next = sh_trace_writer_launches(trace);
        for (size_t i = 0; trace && i < k && next < SH_MAP_NONE; i++) {
            uintptr_t va = bases[at + i];
            uint32_t first = sh_map_get(&since_seq, va), had = sh_map_get(&since_clean, va);
            if (on_device && first == SH_MAP_NONE) {
                sh_map_set(&since_clean, va, clean[i]); /* no room: nothing learnt, no harm */
                sh_map_set(&since_seq, va, (uint32_t)next);
            } else if (!on_device && first != SH_MAP_NONE) {
                if (had != SH_MAP_NONE && clean[i] > had && next > first)
                    sh_trace_write_unchanged(trace, va, first, next - 1);
                sh_map_del(&since_seq, va);
                sh_map_del(&since_clean, va);
            }
        }
        pthread_mutex_unlock(&sched_mu);
    }
}

void sh_sched_residency(const uintptr_t *bases, size_t n, int on_device)
{
    trace_moved(bases, n, on_device);
    if (!policy)
        return;
    pthread_mutex_lock(&sched_mu);
    for (size_t i = 0; i < n; i++)
        sh_policy_residency(policy, bases[i], on_device ? SH_RES_DEVICE : SH_RES_HOST);
    pthread_mutex_unlock(&sched_mu);
    if (on_device)
        tell_kept(bases, n);
}

void sh_sched_pinned(uintptr_t va)
{
    if (!policy)
        return;
    pthread_mutex_lock(&sched_mu);
    sh_policy_pinned(policy, va);
    pthread_mutex_unlock(&sched_mu);
}

size_t sh_sched_victims(size_t need, const uintptr_t *protect, size_t np, uintptr_t *out,
                        size_t max)
{
    if (!policy)
        return 0;
    pthread_mutex_lock(&sched_mu);
    size_t n = sh_policy_victims(policy, need, (const uint64_t *)protect, np, (uint64_t *)out, max);
    pthread_mutex_unlock(&sched_mu);
    return n;
}

int sh_sched_stats(struct sh_sched_stats *out)
{
    if (!policy)
        return -1;
    struct sh_policy_stats st;
    pthread_mutex_lock(&sched_mu);
    sh_policy_stats(policy, &st);
    pthread_mutex_unlock(&sched_mu);
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

int sh_sched_class(uintptr_t va)
{
    if (!policy)
        return SH_CLASS_UNKNOWN;
    pthread_mutex_lock(&sched_mu);
    int cls = sh_policy_class(policy, va);
    pthread_mutex_unlock(&sched_mu);
    return cls < 0 ? SH_CLASS_UNKNOWN : cls;
}

/* ---- prefetch: the policy's plan carried out ---- */

#define MAX_PLAN 64

static int prefetching(void)
{
    return policy && sh_rt.xfer && sh_rt.cfg.policy.prefetch_enabled;
}

/* 1 while nothing has been evicted since the planner last saw the pool all
 * on the device: there is nothing to fetch, commit or make room for. */
int sh_sched_quiet(void)
{
    return atomic_load_explicit(&quiet_at, memory_order_acquire) ==
           atomic_load_explicit(&sh_rt.engine.pressure, memory_order_acquire);
}

/* Records that the pool was all on the device, nothing in flight, as of
 * pressure count p (read before the pool was). */
static void note_quiet(uint64_t p, size_t host_bytes, size_t inflight, size_t evicting)
{
    if (host_bytes == 0 && inflight == 0 && evicting == 0)
        atomic_store_explicit(&quiet_at, p, memory_order_release);
}

void sh_sched_announce(const uintptr_t *bases, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++) {
        struct sh_region_info info;
        if (sh_pool_lookup(sh_rt.pool, bases[i], &info) == 0)
            sh_monitor_event(kind, info.id, info.size);
    }
}

static void tell(const uintptr_t *bases, size_t n, int residency)
{
    if (residency == SH_RES_DEVICE || residency == SH_RES_HOST)
        trace_moved(bases, n, residency == SH_RES_DEVICE);
    pthread_mutex_lock(&sched_mu);
    for (size_t i = 0; i < n; i++)
        sh_policy_residency(policy, bases[i], residency);
    pthread_mutex_unlock(&sched_mu);
    if (residency == SH_RES_DEVICE)
        tell_kept(bases, n);
    if (residency == SH_RES_HOST)
        sh_sched_announce(bases, n, SH_TM_EV_EVICT);
    else if (residency == SH_RES_TO_DEVICE)
        sh_sched_announce(bases, n, SH_TM_EV_PREFETCH);
}

/* Launches held for residency, and how long: with or without the policy. */
static uint64_t stalls, stall_us;

void sh_sched_stalls(uint64_t *n, uint64_t *us)
{
    *n = __atomic_load_n(&stalls, __ATOMIC_RELAXED);
    *us = __atomic_load_n(&stall_us, __ATOMIC_RELAXED);
}

void sh_sched_stall(uintptr_t base, uint64_t wait_us)
{
    __atomic_add_fetch(&stalls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&stall_us, wait_us, __ATOMIC_RELAXED);
    struct sh_region_info info;
    if (sh_pool_lookup(sh_rt.pool, base, &info) == 0)
        sh_monitor_event(SH_TM_EV_STALL, info.id, wait_us);
    if (!policy)
        return;
    pthread_mutex_lock(&sched_mu);
    sh_policy_stall(policy, now_us(), base, wait_us);
    pthread_mutex_unlock(&sched_mu);
}

/* Commits every prefetch in flight. The window's drain waits for all copies
 * queued anyway, so those not finished yet cost no more than the others. */
size_t sh_sched_commit_all(void)
{
    size_t max = sh_rt.cfg.transfer.batch_max > 0 ? (size_t)sh_rt.cfg.transfer.batch_max : 16;
    uintptr_t done[MAX_PLAN];
    size_t total = 0, n = 0;
    size_t inflight = 0;
    sh_pool_prefetch_ready(sh_rt.pool, &inflight);
    while (inflight > 0) {
        size_t want = max < MAX_PLAN ? max : MAX_PLAN;
        if (sh_pool_prefetch_commit(sh_rt.pool, 1, done, want, &n) != 0 && n == 0)
            break;
        tell(done, n, SH_RES_DEVICE);
        total += n;
        inflight = inflight > want ? inflight - want : 0;
    }
    return total;
}

size_t sh_sched_prefetch_wait(const uintptr_t *bases, size_t n)
{
    if (!sh_rt.xfer || sh_sched_quiet() || sh_pool_prefetch_needed(sh_rt.pool, bases, n) == 0)
        return 0;
    return sh_sched_commit_all();
}

/* Commits early evictions: all, or those whose copies have finished.
 * Returns the device bytes released. */
size_t sh_sched_evict_commit(int all)
{
    if (!sh_rt.xfer)
        return 0;
    size_t max = sh_rt.cfg.transfer.batch_max > 0 ? (size_t)sh_rt.cfg.transfer.batch_max : 16;
    uintptr_t done[MAX_PLAN], back[MAX_PLAN];
    size_t total = 0, inflight = 0;
    size_t ready = sh_pool_evict_ready(sh_rt.pool, &inflight);
    size_t left = all ? inflight : ready;
    while (left > 0) {
        size_t want = max < MAX_PLAN ? max : MAX_PLAN, n = 0, nback = 0, released = 0;
        if (sh_pool_evict_commit(sh_rt.pool, all, done, back, want, &n, &nback, &released) != 0 &&
            n + nback == 0)
            break;
        tell(done, n, SH_RES_HOST);
        tell(back, nback, SH_RES_DEVICE);
        total += released;
        left = left > want ? left - want : 0;
    }
    return total;
}

/* Plans between two measures of the memory held outside the pool (each
 * a driver call); allocations measure it too. */
#define RESERVE_EVERY 256

static int planning(void)
{
    return prefetching() && !sh_capturing() && !sh_sched_quiet();
}

/* What a plan reads from the pool, read before sched_mu. */
struct plan_in {
    size_t evicting, inflight, ready, dev;
};

/* Reads the pool for a plan; evicting as sh_pool_evict_ready found it;
 * moving 0: sh_pool_moving() said nothing is in flight. */
static ALWAYS_INLINE void plan_read(struct plan_in *in, uint64_t pressure, int moving)
{
    in->ready = moving ? sh_pool_prefetch_ready(sh_rt.pool, &in->inflight) : 0;
    size_t device_bytes, host_bytes;
    sh_pool_bytes(sh_rt.pool, &device_bytes, &host_bytes);
    /* The policy plans against the budget: memory held outside the pool
     * counts as used, so that prefetches leave it room. */
    static atomic_uint plans;
    int fresh = atomic_fetch_add_explicit(&plans, 1, memory_order_relaxed) % RESERVE_EVERY == 0;
    in->dev = device_bytes + sh_engine_reserve_recent(&sh_rt.engine, device_bytes, fresh);
    note_quiet(pressure, host_bytes, in->inflight, in->evicting);
}

/* The policy's plan (engine/plan.c); sched_mu held. Returns whether a
 * commit is due; negative when there is nothing to start (idle, or the
 * plan failed). */
static ALWAYS_INLINE int plan_locked(const struct plan_in *in, const uintptr_t *bases, size_t nb,
                                     struct sh_policy_plan *plan)
{
    const struct sh_engine_plan_in pin = {
        .dev = in->dev, .fetching = in->inflight, .evicting = in->evicting, .fetched = in->ready};
    struct sh_policy_hints h;
    int changed = 0;
    plan->fetch_max = plan->evict_max = MAX_PLAN;
    int due = sh_engine_plan(&sh_rt.engine, policy, &pin, (const uint64_t *)bases, nb, plan, &h,
                             &changed);
    if (changed)
        sh_sched_hints(NULL, &h);
    return due;
}

/* ---- a decision point's moves, on the pool (the engine's ops) ---- */

size_t sh_sched_evicted_ready(void *ctx)
{
    (void)ctx;
    size_t inflight = 0;
    return sh_pool_evict_ready(sh_rt.pool, &inflight);
}

int sh_sched_commit_evicted(void *ctx)
{
    (void)ctx;
    sh_sched_evict_commit(0);
    return 0;
}

void sh_sched_read(void *ctx, struct sh_engine_plan_in *out)
{
    (void)ctx;
    struct plan_in in = {0};
    uint64_t pressure = atomic_load_explicit(&sh_rt.engine.pressure, memory_order_acquire);
    sh_pool_evict_ready(sh_rt.pool, &in.evicting);
    plan_read(&in, pressure, 1);
    *out = (struct sh_engine_plan_in){
        .dev = in.dev, .fetching = in.inflight, .evicting = in.evicting, .fetched = in.ready};
}

void sh_sched_lock(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&sched_mu);
}

void sh_sched_unlock(void *ctx)
{
    (void)ctx;
    pthread_mutex_unlock(&sched_mu);
}

int sh_sched_start_evictions(void *ctx, const uint64_t *ids, size_t n)
{
    (void)ctx;
    uintptr_t moved[MAX_PLAN];
    size_t nm = 0;
    n = n < MAX_PLAN ? n : MAX_PLAN;
    if (sh_pool_evict_start(sh_rt.pool, (const uintptr_t *)ids, n, moved, &nm) == SH_OK) {
        atomic_fetch_add(&sh_rt.engine.pressure, 1); /* not quiet while they fly */
        tell(moved, nm, SH_RES_TO_HOST);
    }
    return 0; /* what could not start stays where it is: the next plan sees it */
}

size_t sh_sched_device_bytes(void)
{
    size_t dev = 0, host = 0;
    sh_pool_bytes(sh_rt.pool, &dev, &host);
    return dev + sh_fingerprint_device_bytes();
}

/* How many of the fetches ids[0..n), in order, fit the budget now; the
 * room lock held. The plan read the pool before taking it, and another
 * thread may have taken room since (an allocation, a restore on demand):
 * what no longer fits waits for the next plan. */
static size_t fetches_fitting(const uint64_t *ids, size_t n)
{
    size_t dev = sh_sched_device_bytes();
    size_t used = dev + sh_engine_reserve_recent(&sh_rt.engine, dev, 0);
    size_t k = 0;
    for (; k < n; k++) {
        struct sh_region_info info;
        size_t need = sh_pool_lookup(sh_rt.pool, (uintptr_t)ids[k], &info) == 0 ? info.mapped : 0;
        if (used + need > sh_rt.engine.cfg.budget)
            break;
        used += need;
    }
    return k;
}

int sh_sched_start_fetches(void *ctx, const uint64_t *ids, size_t n)
{
    (void)ctx;
    uintptr_t moved[MAX_PLAN];
    size_t nm = 0;
    n = n < MAX_PLAN ? n : MAX_PLAN;
    sh_engine_lock(&sh_rt.engine);
    n = fetches_fitting(ids, n);
    int started =
        n > 0 && sh_pool_prefetch_start(sh_rt.pool, (const uintptr_t *)ids, n, moved, &nm) == SH_OK;
    sh_engine_unlock(&sh_rt.engine);
    if (started)
        tell(moved, nm, SH_RES_TO_DEVICE);
    return 0;
}

int sh_sched_commit_fetched(void *ctx)
{
    (void)ctx;
    sh_sched_commit_all();
    return 0;
}

/* stagehand-top shows the hints in force. */
void sh_sched_hints(void *ctx, const struct sh_policy_hints *h)
{
    (void)ctx;
    sh_tm_hints(h->prefetch_window, h->max_inflight_h2d, h->max_inflight_d2h,
                h->suppress_speculative, h->rules_fired);
}

void sh_sched_plan(const uintptr_t *bases, size_t nb)
{
    if (!planning())
        return;
    uint64_t fetch[MAX_PLAN], evict[MAX_PLAN];
    struct sh_policy_plan plan = {
        .fetch = fetch, .fetch_max = MAX_PLAN, .evict = evict, .evict_max = MAX_PLAN};
    sh_engine_decide(&sh_rt.engine, policy, (const uint64_t *)bases, nb, &plan);
}

/* A launch's recording and plan under one hold of sched_mu: the pool is
 * read first (recording a launch changes nothing there). With early
 * evictions to commit first, the two go one after the other as before. */
void sh_sched_launch_plan(uint64_t kernel, uint64_t stream, const uintptr_t *bases, size_t n)
{
    struct plan_in in = {0};
    uint64_t pressure = atomic_load_explicit(&sh_rt.engine.pressure, memory_order_acquire);
    int moving = 0;
    if (!planning() || ((moving = sh_pool_moving(sh_rt.pool)) &&
                        sh_pool_evict_ready(sh_rt.pool, &in.evicting) > 0)) {
        sh_sched_launch(kernel, stream, bases, n);
        sh_sched_plan(bases, n);
        return;
    }
    plan_read(&in, pressure, moving);
    uint64_t fetch[MAX_PLAN], evict[MAX_PLAN];
    struct sh_policy_plan plan = {.fetch = fetch, .evict = evict};
    int armed = sh_engine_armed(&sh_rt.engine);
    int64_t step = -1;
    int phase = -1;
    pthread_mutex_lock(&sched_mu);
    if (armed) /* far below the limit: nothing to learn yet */
        launch_locked(kernel, stream, bases, n, &step, &phase);
    int due = plan_locked(&in, bases, n, &plan);
    pthread_mutex_unlock(&sched_mu);
    show_where(step, phase);
    if (due >= 0)
        sh_engine_start(&sh_rt.engine, &plan, due);
}
