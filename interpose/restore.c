/* restore.c — bringing a launch's evicted regions back before it runs
 * (launch.c's slow path): room made under the engine's lock, then one
 * remap window; when they do not all fit, as many as do. The policy and
 * the monitor are told where each region ended up.
 *
 * Shared state: none of its own; the room lock is the engine's.
 */
#include "interpose/interpose.h"

#include "sh_err.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"

#define MAX_ADDRS SH_LAUNCH_MAX_REGIONS

static atomic_ullong host_launches; /* launches left with regions on the host */

uint64_t sh_launch_host_launches(void)
{
    return atomic_load_explicit(&host_launches, memory_order_relaxed);
}

/* The bases among bases[0..nb) of regions in state `state` (to out). */
static size_t in_state(struct sh_dev *d, const uintptr_t *bases, size_t nb, int state,
                       uintptr_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < nb; i++) {
        struct sh_region_info info;
        if (sh_pool_lookup(d->pool, bases[i], &info) == 0 && info.state == state)
            out[n++] = bases[i];
    }
    return n;
}

/* Tells the policy where the launch's regions are now (a restore that
 * failed leaves a region on the host, found again next time), and the
 * monitor which of those that were on the host (was[0..nwas)) came back. */
static void report_residency(struct sh_dev *d, const uintptr_t *bases, size_t nb,
                             const uintptr_t *was, size_t nwas)
{
    uintptr_t on[MAX_ADDRS], off[MAX_ADDRS];
    sh_sched_residency(d, on, in_state(d, bases, nb, SH_RS_RESIDENT, on), 1);
    sh_sched_residency(d, off, in_state(d, bases, nb, SH_RS_HOST, off), 0);
    sh_sched_announce(d, on, in_state(d, was, nwas, SH_RS_RESIDENT, on), SH_TM_EV_RESTORE);
}

void sh_launch_restore(struct sh_dev *d, const uintptr_t *addrs, size_t n,
                       const struct sh_pool_use *u, size_t host)
{
    uintptr_t was[MAX_ADDRS], fit[MAX_ADDRS];
    size_t nfit = 0;
    sh_engine_lock(&d->engine); /* looked at under it, as other requests evict under it */
    size_t nwas = in_state(d, u->bases, u->nbases, SH_RS_HOST, was);
    int room = sh_engine_resident(&d->engine, was, nwas, addrs, n, fit, &nfit);
    int rc = nfit ? sh_pool_restore(d->pool, fit, nfit) : 0;
    /* told under the lock too: a region restored here and evicted by the
     * next caller must reach the policy in that order */
    report_residency(d, u->bases, u->nbases, was, nwas);
    sh_engine_unlock(&d->engine);
    rc = rc ? rc : room;
    uintptr_t left[MAX_ADDRS];
    size_t nleft = rc ? in_state(d, was, nwas, SH_RS_HOST, left) : 0;
    if (nleft) {
        atomic_fetch_add_explicit(&host_launches, 1, memory_order_relaxed);
        sh_tm_inc(SH_TM_C_host_launches);
    }
    if (rc) /* which step and how much, for a trace of a slow step */
        sh_log(SH_LOG_DEBUG,
               "a launch runs on host-mapped memory: %s (%d); %zu of its %zu regions (%zu MB) were "
               "on the host, %zu still are",
               room ? "no room for all" : "the restore failed", rc, nwas, u->nbases, host >> 20,
               nleft);
}
