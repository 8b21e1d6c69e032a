/* resident.c — a launch's regions brought back before it runs, decided the
 * same way in the library (interpose/restore.c, over the pool) and in
 * stagehand-sim (over its model): room for every one on the host at once;
 * when the budget cannot take them all, as many as fit, in the launch's
 * order, and the launch reaches the rest over the bus.
 *
 * Locking: the caller holds sh_engine_lock(), as for sh_engine_make_room.
 */
#include "engine/engine.h"

#include "sh_err.h"

/* Those of regions[0..n) still on the host (a landed prefetch may have
 * brought some back meanwhile), to fit; their count. */
static size_t still_on_host(struct sh_engine *e, const uintptr_t *regions, size_t n, uintptr_t *fit)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (e->ops.host_bytes(e->ctx, regions[i]))
            fit[k++] = regions[i];
    return k;
}

/* Each region in turn kept when room for it can be made beside those kept
 * before it: a region too large for what is left does not stop a smaller
 * one after it. */
static size_t those_that_fit(struct sh_engine *e, const uintptr_t *regions, size_t n,
                             const uintptr_t *protect, size_t np, uintptr_t *fit, size_t *nhost)
{
    size_t k = 0, kept = 0;
    *nhost = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = e->ops.host_bytes(e->ctx, regions[i]);
        if (b == 0)
            continue; /* back already */
        (*nhost)++;
        if (sh_engine_make_room(e, kept + b, protect, np) == SH_OK) {
            kept += b;
            fit[k++] = regions[i];
        }
    }
    return k;
}

int sh_engine_resident(struct sh_engine *e, const uintptr_t *regions, size_t n,
                       const uintptr_t *protect, size_t np, uintptr_t *fit, size_t *nfit)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += e->ops.host_bytes(e->ctx, regions[i]);
    *nfit = 0;
    if (need == 0)
        return SH_OK;
    if (sh_engine_make_room(e, need, protect, np) == SH_OK) {
        *nfit = still_on_host(e, regions, n, fit);
        return SH_OK;
    }
    size_t nhost;
    *nfit = those_that_fit(e, regions, n, protect, np, fit, &nhost);
    return *nfit < nhost ? SH_ENOMEM : SH_OK;
}
