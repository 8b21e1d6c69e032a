/* control.c — the stagehand.h control API: version, step and phase marks,
 * and the stats snapshot. Callable from Python through ctypes.
 *
 * Shared state: the step and phase atomics in sh_rt.
 */
#include "interpose/interpose.h"

#include "stagehand.h"

#include <string.h>

#define EXPORT  __attribute__((visibility("default")))
#define STR2(x) #x
#define STR(x)  STR2(x)

EXPORT const char *stagehand_version(void)
{
    return STR(STAGEHAND_VERSION_MAJOR) "." STR(STAGEHAND_VERSION_MINOR) "." STR(
        STAGEHAND_VERSION_PATCH);
}

EXPORT int stagehand_active(void)
{
    return sh_managed();
}

EXPORT int64_t stagehand_step(void)
{
    atomic_store(&sh_rt.phase, STAGEHAND_PHASE_STEP_BEGIN);
    int64_t step = atomic_fetch_add(&sh_rt.step, 1) + 1;
    if (sh_managed()) {
        sh_sched_mark(1, 0);
        sh_monitor_step(step);
    }
    return step;
}

EXPORT int stagehand_phase(int phase)
{
    if (phase < STAGEHAND_PHASE_STEP_BEGIN || phase > STAGEHAND_PHASE_STEP_END)
        return -1;
    atomic_store(&sh_rt.phase, phase);
    if (sh_managed()) {
        sh_sched_mark(0, phase);
        sh_monitor_phase(phase);
    }
    return 0;
}

/* The figures of device d's pool, copy engine and scheduler. */
static void device_stats(struct sh_dev *d, stagehand_stats_t *s)
{
    struct sh_pool_stats st;
    sh_pool_stats(d->pool, &st);
    s->active = 1;
    s->budget_bytes = d->engine.cfg.budget;
    s->high_watermark = d->engine.cfg.high;
    s->low_watermark = d->engine.cfg.low;
    s->device_bytes = sh_sched_device_bytes(d);
    s->live_bytes = st.live_bytes;
    s->regions_live = sh_pool_stats_live(&st);
    s->regions_freed = st.regions[SH_RS_FREED];
    s->allocs = st.allocs;
    s->frees = st.frees;
    s->reuses = st.reuses;
    s->small_allocs = st.small_allocs;
    s->small_frees = st.small_frees;
    s->vmm_maps = st.vmm_maps;
    s->vmm_unmaps = st.vmm_unmaps;
    s->evictions = st.evictions;
    s->restores = st.restores;
    s->d2h_bytes = st.evicted_bytes;
    s->h2d_bytes = st.restored_bytes;
    s->host_bytes = st.host_bytes;
    s->checksum_mismatches = st.checksum_mismatches;
    s->lost_writes = st.lost_writes;
    s->unseen_writes = st.unseen_writes;
    s->clean_evictions = st.clean_evictions;
    s->dirty_evictions = st.dirty_evictions;
    s->clean_bytes = st.clean_bytes;
    s->fingerprints = st.fingerprints;
    s->kept_bytes = st.kept_bytes;
    s->opaque_work = st.opaque;
    s->drain_us = st.drain_ns / 1000u;
    s->copy_wait_us = st.copy_wait_ns / 1000u;
    s->remap_us = st.remap_ns / 1000u;
    s->scan_us = st.scan_ns / 1000u;
    s->scan_wait_us = st.scan_wait_ns / 1000u;
    s->fingerprint_us = st.fingerprint_ns / 1000u;
    s->fingerprint_start_us = st.fingerprint_start_ns / 1000u;
    s->prefilter_us = st.prefilter_ns / 1000u;
    s->scanned_bytes = st.scanned_bytes;
    s->prefilters = st.prefilters;
    s->scans_skipped = st.scans_skipped;
    s->prefetches = st.prefetches;
    s->prefetch_commits = st.prefetch_commits;
    s->early_evictions = st.early_evictions;
    s->early_commits = st.early_commits;
    s->regions_pinned = st.pinned;
    struct sh_pool_usage u;
    sh_pool_usage(d->pool, &u);
    s->cached_bytes = u.cached;
    struct sh_sched_stats ss;
    if (sh_sched_stats(d, &ss) == 0) {
        s->launches_recorded = ss.launches;
        s->steps_found = ss.step;
        s->steps_followed = ss.steps_followed;
        s->steps_departed = ss.steps_departed;
    }
    if (d->xfer) {
        struct sh_xfer_stats xs;
        sh_xfer_stats(d->xfer, &xs);
        s->device_drains = xs.drains;
    }
    if (d->host) {
        struct sh_hostpool_stats hs;
        sh_hostpool_stats(d->host, &hs);
        s->pinned_bytes = hs.pinned_bytes;
    }
}

/* The figures of the process as a whole: marks, launches, tracking, the
 * gate, the node's budget. */
static void process_stats(stagehand_stats_t *s)
{
    s->step = atomic_load(&sh_rt.step);
    s->phase = atomic_load(&sh_rt.phase);
    s->passthrough = atomic_load(&sh_rt.passthrough);
    s->oom = atomic_load(&sh_rt.oom);
    if (!sh_active())
        return;
    s->launches = atomic_load(&sh_rt.launches);
    s->tracking_mode = (uint64_t)sh_cupti_mode();
    sh_cupti_counts(&s->cupti_handovers, &s->cupti_returns);
    s->launches_unscanned = sh_launch_unscanned();
    s->host_launches = sh_launch_host_launches();
    sh_sched_stalls(&s->stalls, &s->stall_us);
    for (int i = 0; i < atomic_load(&sh_rt.ndevs); i++) { /* every device's windows */
        s->remap_windows += sh_gate_windows(sh_rt.devs[i]->gate);
        s->window_us += sh_gate_open_us(sh_rt.devs[i]->gate);
    }
    if (sh_rt.node) {
        struct sh_node_stats ns;
        sh_node_stats(sh_rt.node, &ns);
        s->node_budget_bytes = ns.budget;
        s->node_used_bytes = ns.used;
        s->node_ranks = ns.ranks;
    }
}

static int stats_of(struct sh_dev *d, stagehand_stats_t *out, size_t size)
{
    stagehand_stats_t s;
    memset(&s, 0, sizeof s);
    process_stats(&s);
    if (d)
        device_stats(d, &s);
    memcpy(out, &s, size < sizeof s ? size : sizeof s);
    return 0;
}

EXPORT int stagehand_get_stats(stagehand_stats_t *out, size_t size)
{
    if (!out)
        return -1;
    return stats_of(sh_managed() ? sh_dev_main() : NULL, out, size);
}

EXPORT int stagehand_get_device_stats(int device, stagehand_stats_t *out, size_t size)
{
    struct sh_dev *d = out && sh_managed() ? sh_dev_ordinal(device) : NULL;
    return d ? stats_of(d, out, size) : -1;
}

EXPORT int stagehand_residency(const void *ptr)
{
    struct sh_region_info info;
    struct sh_dev *d = ptr && sh_managed() ? sh_dev_of((uintptr_t)ptr) : NULL;
    if (!d || sh_pool_lookup(d->pool, (uintptr_t)ptr, &info) != 0 || info.state == SH_RS_FREED)
        return -1;
    return info.state == SH_RS_RESIDENT;
}
