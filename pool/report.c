/* report.c — the largest regions, for the live monitor.
 *
 * Locking: takes index_lock's read side for the walk; the fields it copies
 * are read without pool->mu, so a row may mix two moments of one region
 * (harmless for a display refreshed every quarter second).
 */
#include "pool/region_int.h"

struct largest {
    struct sh_pool_region_report *out;
    size_t n, max;
};

/* Keeps the max largest seen so far: replaces the smallest when full. */
static int keep_largest(void *arg, uintptr_t start, size_t len, void *payload)
{
    (void)start;
    (void)len;
    struct largest *l = arg;
    const struct region *r = payload;
    int state = __atomic_load_n(&r->state, __ATOMIC_RELAXED);
    if (r->path == SH_PATH_SLAB || state == SH_RS_FREED || state == SH_RS_DEAD || l->max == 0)
        return 0;
    size_t slot = l->n;
    if (l->n == l->max) {
        slot = 0;
        for (size_t i = 1; i < l->n; i++)
            if (l->out[i].size < l->out[slot].size)
                slot = i;
        if (l->out[slot].size >= r->size)
            return 0;
    } else {
        l->n++;
    }
    l->out[slot] = (struct sh_pool_region_report){
        .va = r->va,
        .size = r->size,
        .mapped = r->mapped,
        .id = r->id,
        .last_use_us = __atomic_load_n(&r->last_use_us, __ATOMIC_RELAXED),
        .last_use = __atomic_load_n(&r->last_use, __ATOMIC_RELAXED),
        .evictions = __atomic_load_n(&r->evictions, __ATOMIC_RELAXED),
        .restores = __atomic_load_n(&r->restores, __ATOMIC_RELAXED),
        .state = state,
    };
    return 0;
}

size_t sh_pool_regions(struct sh_pool *pool, struct sh_pool_region_report *out, size_t max)
{
    struct largest l = {out, 0, max};
    sh_rw_rdlock(&pool->index_lock);
    sh_rindex_foreach(pool->index, keep_largest, &l);
    sh_rw_unlock(&pool->index_lock);
    return l.n;
}
