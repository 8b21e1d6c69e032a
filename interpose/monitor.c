/* monitor.c — the library's figures, published for stagehand-top and the
 * per-step JSONL (telemetry/).
 *
 * The pool, host pool and copy engine keep cumulative statistics already;
 * rather than touch their hot paths twice, `sync` turns what changed since
 * the last look into telemetry counter increments. It runs on the
 * publisher's thread every period, and on the program's thread at each step
 * boundary so a step's JSONL line holds exactly that step's figures.
 *
 * Locking: sync_mu guards the last-seen figures (sync can run from both
 * threads at once).
 */
#include "interpose/interpose.h"

#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t sync_mu = PTHREAD_MUTEX_INITIALIZER;

struct seen {
    uint64_t evictions, restores, evicted_bytes, restored_bytes, allocs, frees, oom, launches;
    uint64_t pool_hits, pool_misses, prefetches, prefetch_hits, prefetch_misses, stalls, stall_us;
    uint64_t deferred, clean_evictions, clean_bytes, fingerprints, unseen_writes;
};
static struct seen last;

/* Adds now - *was to counter c and remembers now. */
static void delta(enum sh_tm_counter c, uint64_t now, uint64_t *was)
{
    if (now > *was)
        sh_tm_add(c, now - *was);
    *was = now;
}

static void set_region_gauges(struct sh_dev *d, const struct sh_pool_stats *st)
{
    sh_tm_set(SH_TM_G_regions_resident, (int64_t)(st->regions[SH_RS_RESIDENT] - st->slabs));
    sh_tm_set(SH_TM_G_regions_evicting, (int64_t)st->regions[SH_RS_EVICTING]);
    sh_tm_set(SH_TM_G_regions_host, (int64_t)st->regions[SH_RS_HOST]);
    sh_tm_set(SH_TM_G_regions_restoring, (int64_t)st->regions[SH_RS_RESTORING]);
    sh_tm_set(SH_TM_G_regions_freed, (int64_t)st->regions[SH_RS_FREED]);
    sh_tm_set(SH_TM_G_regions_pinned, (int64_t)st->pinned);
    sh_tm_set(SH_TM_G_kept_bytes, (int64_t)st->kept_bytes);
    struct sh_sched_stats ss;
    if (sh_sched_stats(d, &ss) == 0) {
        sh_tm_set(SH_TM_G_regions_persistent, (int64_t)ss.persistent);
        sh_tm_set(SH_TM_G_regions_transient, (int64_t)ss.transient);
    }
}

/* The node's shared host budget, when this process takes part in one. */
static void set_node_gauges(void)
{
    struct sh_node_stats ns;
    if (!sh_rt.node)
        return;
    sh_node_stats(sh_rt.node, &ns);
    sh_tm_set(SH_TM_G_host_node_budget, (int64_t)ns.budget);
    sh_tm_set(SH_TM_G_host_node_used, (int64_t)ns.used);
    sh_tm_set(SH_TM_G_host_node_share, (int64_t)ns.share);
    sh_tm_set(SH_TM_G_host_node_ranks, (int64_t)ns.ranks);
}

static void set_host_gauges(const struct sh_dev *d)
{
    set_node_gauges();
    if (!d->host)
        return;
    struct sh_hostpool_stats hs;
    sh_hostpool_stats(d->host, &hs);
    for (unsigned i = 0; i < hs.nclasses; i++)
        sh_tm_host_class((int)i, hs.class_bytes[i], hs.class_total[i] - hs.class_free[i],
                         hs.class_total[i]);
    sh_tm_host_classes((int)hs.nclasses);
    pthread_mutex_lock(&sync_mu);
    delta(SH_TM_C_pool_hits, hs.hits + hs.fallbacks, &last.pool_hits);
    delta(SH_TM_C_pool_misses, hs.misses, &last.pool_misses);
    pthread_mutex_unlock(&sync_mu);
}

void sh_monitor_sync(void)
{
    if (!sh_monitor_on)
        return;
    struct sh_dev *d = sh_dev_main(); /* the figures shown are the main device's */
    struct sh_pool_stats st;
    sh_pool_stats(d->pool, &st);
    pthread_mutex_lock(&sync_mu);
    delta(SH_TM_C_evictions, st.evictions, &last.evictions);
    delta(SH_TM_C_restores, st.restores, &last.restores);
    delta(SH_TM_C_d2h_bytes, st.evicted_bytes, &last.evicted_bytes);
    delta(SH_TM_C_h2d_bytes, st.restored_bytes, &last.restored_bytes);
    delta(SH_TM_C_allocs, st.allocs + st.small_allocs, &last.allocs);
    delta(SH_TM_C_frees, st.frees + st.small_frees, &last.frees);
    delta(SH_TM_C_oom, atomic_load(&sh_rt.oom), &last.oom);
    delta(SH_TM_C_launches, atomic_load(&sh_rt.launches), &last.launches);
    delta(SH_TM_C_deferred, atomic_load(&d->engine.deferred), &last.deferred);
    delta(SH_TM_C_prefetch_issued, st.prefetches, &last.prefetches);
    delta(SH_TM_C_clean_evictions, st.clean_evictions, &last.clean_evictions);
    delta(SH_TM_C_clean_bytes, st.clean_bytes, &last.clean_bytes);
    delta(SH_TM_C_fingerprints, st.fingerprints, &last.fingerprints);
    delta(SH_TM_C_unseen_writes, st.unseen_writes, &last.unseen_writes);
    /* A prefetch that committed as copied was in time; one redone in the
     * window or cancelled was not. */
    delta(SH_TM_C_prefetch_hits, st.prefetch_commits - st.prefetch_redos, &last.prefetch_hits);
    delta(SH_TM_C_prefetch_misses, st.prefetch_redos + st.prefetch_cancels, &last.prefetch_misses);
    uint64_t stalls, stall_us; /* with or without the learned policy */
    sh_sched_stalls(&stalls, &stall_us);
    delta(SH_TM_C_stall_count, stalls, &last.stalls);
    delta(SH_TM_C_stall_time_us, stall_us, &last.stall_us);
    pthread_mutex_unlock(&sync_mu);
    sh_tm_vram(sh_sched_device_bytes(d));
    set_region_gauges(d, &st);
    set_host_gauges(d);
    if (d->xfer) {
        sh_tm_set(SH_TM_G_h2d_inflight, (int64_t)sh_xfer_inflight(d->xfer, SH_H2D));
        sh_tm_set(SH_TM_G_d2h_inflight, (int64_t)sh_xfer_inflight(d->xfer, SH_D2H));
    }
}

static void sample(void *ctx)
{
    (void)ctx;
    sh_monitor_sync();
}

/* A device's region, as its pool reported it. */
struct dev_region {
    struct sh_pool_region_report r;
    struct sh_dev *d;
};

static int larger_first(const void *a, const void *b)
{
    size_t x = ((const struct dev_region *)a)->r.size, y = ((const struct dev_region *)b)->r.size;
    return (x < y) - (x > y);
}

/* The largest regions of every managed device: each pool's largest max,
 * then the largest max of those all. */
static int regions(void *ctx, struct sh_tm_region *out, int32_t *device, int max)
{
    (void)ctx;
    int ndevs = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    if (max <= 0 || ndevs <= 0)
        return 0;
    struct sh_pool_region_report *r = calloc((size_t)max, sizeof *r);
    struct dev_region *all = calloc((size_t)ndevs * (size_t)max, sizeof *all);
    size_t n = 0;
    if (!r || !all) {
        free(all);
        free(r);
        return 0;
    }
    for (int i = 0; i < ndevs; i++) {
        struct sh_dev *d = sh_rt.devs[i];
        size_t k = sh_pool_regions(d->pool, r, (size_t)max);
        for (size_t j = 0; j < k; j++)
            all[n++] = (struct dev_region){r[j], d};
    }
    qsort(all, n, sizeof *all, larger_first);
    n = n < (size_t)max ? n : (size_t)max;
    for (size_t i = 0; i < n; i++) {
        const struct sh_pool_region_report *g = &all[i].r;
        out[i] = (struct sh_tm_region){g->va,
                                       g->size,
                                       g->id,
                                       g->last_use_us,
                                       g->evictions,
                                       g->restores,
                                       sh_sched_class(all[i].d, g->va),
                                       g->state};
        device[i] = all[i].d->ordinal;
    }
    free(all);
    free(r);
    return (int)n;
}

/* Each managed device's figures, once there is more than one. */
static int devices(void *ctx, struct sh_tm_device *out, int max)
{
    (void)ctx;
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    if (n < 2)
        return 0;
    for (int i = 0; i < n && i < max; i++) {
        struct sh_dev *d = sh_rt.devs[i];
        struct sh_pool_stats st;
        sh_pool_stats(d->pool, &st);
        out[i] = (struct sh_tm_device){.device = d->ordinal,
                                       .regions = (int32_t)sh_pool_stats_live(&st),
                                       .budget = d->engine.cfg.budget,
                                       .used = sh_sched_device_bytes(d),
                                       .host_bytes = st.host_bytes,
                                       .evictions = st.evictions,
                                       .restores = st.restores,
                                       .d2h_bytes = st.evicted_bytes,
                                       .h2d_bytes = st.restored_bytes,
                                       .prefetches = st.prefetches,
                                       .early_evictions = st.early_evictions};
    }
    return n < max ? n : max;
}

/* The scheduler's own finds, as the explicit marks are shown. */
static void where(int64_t step, int phase)
{
    if (step >= 0)
        sh_monitor_step(step);
    if (phase >= 0)
        sh_monitor_phase(phase);
}

void sh_monitor_start(void)
{
    const struct sh_config *c = &sh_rt.cfg;
    sh_sched_on_where(where);
    if (!c->telemetry.telemetry_enabled)
        return;
    char summary[512];
    sh_config_summary(c, summary, sizeof summary);
    const struct sh_dev *d = sh_dev_main();
    char name[128] = "";
    sh_rt.drv.cuDeviceGetName(name, sizeof name, d->dev);
    struct sh_tm_params p = {
        .shm_enabled = c->telemetry.shm_enabled,
        .jsonl_path = c->telemetry.telemetry_file,
        .interval_steps = c->telemetry.telemetry_interval,
        .device = d->ordinal,
        .device_name = name,
        .budget = c->budget.vram_budget.bytes,
        .high = c->budget.vram_high_watermark.bytes,
        .low = c->budget.vram_low_watermark.bytes,
        .config_summary = summary,
        .tracking = sh_cupti_mode(),
        .regions = regions,
        .sample = sample,
        .devices = devices,
    };
    atomic_store(&sh_monitor_on, 1); /* before the thread that samples exists */
    if (sh_tm_start(&p) != 0)
        atomic_store(&sh_monitor_on, 0);
}

void sh_monitor_step(int64_t step)
{
    if (!sh_monitor_on)
        return;
    sh_monitor_sync();
    sh_tm_step(step);
}
