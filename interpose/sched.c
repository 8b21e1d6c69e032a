/* sched.c — the scheduler inside the library: feeds the policy (policy/)
 * the program's events and asks it which regions to evict; records the same
 * events to a trace file when STAGEHAND_TRACE (or [debug] trace_file) names
 * one.
 *
 * Region ids, for the policy and the trace, are region base addresses:
 * unique while a region lives, and stable when a freed region is reused for
 * the same size (which is what a training loop does every step).
 *
 * Locking: sched_mu serialises every call into the policy and the trace
 * writer (neither is thread-safe). No CUDA call is made under it.
 */
#include "interpose/interpose.h"

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define MAX_IDS 256

static pthread_mutex_t sched_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sh_policy *policy;
static struct sh_trace_writer *trace;
static uint64_t t0_ns;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec - t0_ns) / 1000;
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
    const char *path = getenv("STAGEHAND_TRACE");
    if (!path || !*path)
        path = sh_rt.cfg.debug.trace_file;
    if (!*path)
        return;
    if (sh_trace_writer_open(path, "libstagehand", &trace) != 0) {
        sh_log(SH_LOG_WARN, "cannot write the trace to %s; not recording", path);
        return;
    }
    atexit(close_trace);
    sh_log(SH_LOG_INFO, "recording a trace to %s", path);
}

int sh_sched_init(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    struct sh_policy_params p;
    if (sh_policy_params_from_config(&sh_rt.cfg, &p) != 0 || sh_policy_create(&p, &policy) != 0) {
        sh_log(SH_LOG_WARN, "the scheduler could not start; evicting least recently used");
        policy = NULL;
    }
    open_trace();
    return 0;
}

void sh_sched_alloc(uintptr_t va, size_t size, uint64_t stream)
{
    pthread_mutex_lock(&sched_mu);
    uint64_t t = now_us();
    if (policy)
        sh_policy_alloc(policy, t, va, size, stream);
    if (trace)
        sh_trace_write_alloc(trace, t, va, size, stream, SH_CLASS_UNKNOWN);
    pthread_mutex_unlock(&sched_mu);
}

void sh_sched_free(uintptr_t va)
{
    pthread_mutex_lock(&sched_mu);
    uint64_t t = now_us();
    if (policy) {
        int cls = sh_policy_class(policy, va);
        sh_policy_free(policy, t, va);
        sh_policy_forget(policy, va); /* the pool drops or reuses freed regions itself */
        if (trace)
            sh_trace_write_free(trace, t, va, cls);
    } else if (trace) {
        sh_trace_write_free(trace, t, va, SH_CLASS_UNKNOWN);
    }
    pthread_mutex_unlock(&sched_mu);
}

void sh_sched_launch(uint64_t kernel, uint64_t stream, const uintptr_t *bases, size_t n)
{
    pthread_mutex_lock(&sched_mu);
    uint64_t t = now_us();
    if (policy)
        sh_policy_launch(policy, t, kernel, stream, (const uint64_t *)bases, n);
    if (trace)
        sh_trace_write_launch(trace, t, 0, stream, kernel, (const uint64_t *)bases, n, NULL);
    pthread_mutex_unlock(&sched_mu);
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

void sh_sched_residency(const uintptr_t *bases, size_t n, int on_device)
{
    if (!policy)
        return;
    pthread_mutex_lock(&sched_mu);
    for (size_t i = 0; i < n; i++)
        sh_policy_residency(policy, bases[i], on_device ? SH_RES_DEVICE : SH_RES_HOST);
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
    *out = (struct sh_sched_stats){st.step, st.phase, st.trace_ready, st.persistent, st.transient};
    return 0;
}
