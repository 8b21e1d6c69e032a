/* repair.c — what a move leaves behind when the driver fails it for good.
 *
 * A remap unmaps a chunk's address before it maps the other handle there;
 * if neither handle can be mapped back, the address is a hole: a kernel
 * touching it would fault and take the context with it. The chunk
 * remembers which handle holds its bytes (chunk.hole) and its region is
 * stuck (never moved again). Before device work is issued, the caller asks
 * sh_pool_heal to map the holes again; while one stays, work that might
 * reach it is refused with an ordinary error (sh_pool_hole_in), and no
 * move starts, so a driver that maps nothing any more makes no new ones.
 *
 * A scratch mapping that cannot be unmapped (a committed or abandoned
 * prefetch) keeps its handle's memory on the device. It is stranded: its
 * scratch address is never reused, and the chunk cache, which releases the
 * handle through strand_release, keeps the handle counted until the
 * mapping is gone (each release retries the unmap).
 *
 * Locking: holes change under move_mu (moves, heal) and are read with
 * atomics under the index lock's read side, which also keeps the region
 * alive while it is healed (teardown removes it under the write side).
 * Mapping under the read side only delays a teardown; this is the failure
 * path. The stranded list has its own lock, taken with nothing else held.
 */
#include "pool/region_int.h"

#include "sh_clock.h"
#include "sh_err.h"
#include "sh_log.h"

#include <stdlib.h>

#define REMAP_TRIES 3

size_t sh_pool_holes_open;

/* pool's holes, and the process's, by one either way */
static void holes_add(struct sh_pool *pool, int one)
{
    __atomic_add_fetch(&pool->holes, (size_t)one, __ATOMIC_RELEASE);
    __atomic_add_fetch(&sh_pool_holes_open, (size_t)one, __ATOMIC_RELEASE);
}

static void hole_open(struct sh_pool *pool, struct region *r, struct chunk *c, uint64_t whole)
{
    r->stuck = 1;
    __atomic_store_n(&c->hole, whole, __ATOMIC_RELEASE);
    holes_add(pool, 1);
    sh_log(SH_LOG_ERROR,
           "cannot map 0x%llx (%zu bytes) again after a failed remap: work that may reach it "
           "is refused until the driver maps it (its bytes are kept)",
           (unsigned long long)(r->va + c->off), c->size);
}

static int remap(struct sh_pool *pool, struct region *r, struct chunk *c, uint64_t from,
                 uint64_t to, uint64_t whole)
{
    uintptr_t va = r->va + c->off;
    int rc = SH_EDRIVER;
    for (int t = 0; t < REMAP_TRIES && rc; t++)
        rc = pool->vmm.unmap(pool->vmm.ctx, va, c->size);
    if (rc)
        return SH_EDRIVER; /* still mapped to `from` */
    __atomic_add_fetch(&pool->st.vmm_unmaps, 1, __ATOMIC_RELAXED);
    /* Forward, then back and forth: two failures in a row are survived. */
    const uint64_t order[2 * REMAP_TRIES] = {to, from, to, from, to, from};
    for (int t = 0; t < 2 * REMAP_TRIES; t++)
        if (pool->vmm.map(pool->vmm.ctx, va, c->size, order[t]) == 0) {
            __atomic_add_fetch(&pool->st.vmm_maps, 1, __ATOMIC_RELAXED);
            return order[t] == to ? 0 : SH_EDRIVER;
        }
    hole_open(pool, r, c, whole);
    return SH_ELOST;
}

int sh_pool_remap(struct sh_pool *pool, struct region *r, struct chunk *c, uint64_t from,
                  uint64_t to, uint64_t whole)
{
    uint64_t t0 = sh_clock_ns();
    int rc = remap(pool, r, c, from, to, whole);
    __atomic_add_fetch(&pool->st.remap_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    return rc;
}

/* ---- holes ---- */

static int heal_visit(void *arg, uintptr_t start, size_t len, void *payload)
{
    (void)start, (void)len;
    struct sh_pool *pool = arg;
    struct region *r = payload;
    if (!r->stuck)
        return 0;
    for (unsigned i = 0; i < r->nchunks; i++) {
        struct chunk *c = &r->chunks[i];
        uint64_t h = __atomic_load_n(&c->hole, __ATOMIC_ACQUIRE);
        if (!h || pool->vmm.map(pool->vmm.ctx, r->va + c->off, c->size, h) != 0)
            continue;
        __atomic_add_fetch(&pool->st.vmm_maps, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&c->hole, 0, __ATOMIC_RELEASE);
        holes_add(pool, -1);
        sh_log(SH_LOG_WARN, "0x%llx (%zu bytes) is mapped again",
               (unsigned long long)(r->va + c->off), c->size);
    }
    return 0;
}

int sh_pool_heal(struct sh_pool *pool)
{
    if (__atomic_load_n(&pool->holes, __ATOMIC_ACQUIRE) == 0)
        return 0;
    pthread_mutex_lock(&pool->move_mu);
    sh_rw_rdlock(&pool->index_lock);
    sh_rindex_foreach(pool->index, heal_visit, pool);
    sh_rw_unlock(&pool->index_lock);
    pthread_mutex_unlock(&pool->move_mu);
    return __atomic_load_n(&pool->holes, __ATOMIC_ACQUIRE) ? SH_ELOST : 0;
}

struct overlap {
    uintptr_t lo, hi; /* inclusive */
    int found;
};

static int overlap_visit(void *arg, uintptr_t start, size_t len, void *payload)
{
    (void)len;
    struct overlap *o = arg;
    const struct region *r = payload;
    for (unsigned i = 0; i < r->nchunks && !o->found; i++) {
        const struct chunk *c = &r->chunks[i];
        uintptr_t a = start + c->off, b = a + c->size - 1;
        o->found = __atomic_load_n(&c->hole, __ATOMIC_ACQUIRE) && a <= o->hi && o->lo <= b;
    }
    return o->found;
}

int sh_pool_hole_in(struct sh_pool *pool, uintptr_t lo, uintptr_t hi)
{
    if (__atomic_load_n(&pool->holes, __ATOMIC_ACQUIRE) == 0)
        return 0;
    struct overlap o = {lo < hi ? lo : hi, lo < hi ? hi : lo, 0};
    sh_rw_rdlock(&pool->index_lock);
    sh_rindex_foreach(pool->index, overlap_visit, &o);
    sh_rw_unlock(&pool->index_lock);
    return o.found;
}

void sh_pool_hole_close(struct sh_pool *pool, struct chunk *c)
{
    if (__atomic_exchange_n(&c->hole, 0, __ATOMIC_ACQ_REL))
        holes_add(pool, -1);
}

/* ---- stranded scratch mappings ---- */

struct strand {
    uintptr_t va;
    size_t size;
    uint64_t handle;
};

int sh_pool_unmap(struct sh_pool *pool, uintptr_t va, size_t size)
{
    for (int t = 0; t < REMAP_TRIES; t++)
        if (pool->vmm.unmap(pool->vmm.ctx, va, size) == 0) {
            __atomic_add_fetch(&pool->st.vmm_unmaps, 1, __ATOMIC_RELAXED);
            return 0;
        }
    return SH_EDRIVER;
}

int sh_pool_unmap_or_strand(struct sh_pool *pool, uintptr_t va, size_t size, uint64_t handle)
{
    if (sh_pool_unmap(pool, va, size) == 0)
        return 0;
    pthread_mutex_lock(&pool->strand_mu);
    struct strand *s = NULL;
    if (pool->nstranded % 16 == 0) {
        s = realloc(pool->stranded, (pool->nstranded + 16) * sizeof *s);
        if (s)
            pool->stranded = s;
    }
    if (s || pool->nstranded % 16) {
        pool->stranded[pool->nstranded++] = (struct strand){va, size, handle};
    }
    pthread_mutex_unlock(&pool->strand_mu);
    sh_log(SH_LOG_ERROR,
           "cannot unmap the copy address 0x%llx (%zu bytes): its memory stays on the device "
           "until it can be",
           (unsigned long long)va, size);
    return SH_EDRIVER;
}

/* The chunk cache's release: a handle still mapped at a stranded address
 * is kept (and counted) until that mapping is gone. */
static int strand_release(void *ctx, uint64_t handle)
{
    struct sh_pool *pool = ctx;
    pthread_mutex_lock(&pool->strand_mu);
    for (size_t i = 0; i < pool->nstranded; i++) {
        struct strand *s = &pool->stranded[i];
        if (s->handle != handle)
            continue;
        if (sh_pool_unmap(pool, s->va, s->size) != 0) {
            pthread_mutex_unlock(&pool->strand_mu);
            return SH_EBUSY;
        }
        *s = pool->stranded[--pool->nstranded];
        i--;
    }
    pthread_mutex_unlock(&pool->strand_mu);
    return pool->vmm.release(pool->vmm.ctx, handle);
}

static int strand_create(void *ctx, size_t size, int loc, uint64_t *handle)
{
    struct sh_pool *pool = ctx;
    return pool->vmm.create(pool->vmm.ctx, size, loc, handle);
}

void sh_pool_chunk_ops(struct sh_pool *pool, struct sh_vmm_ops *ops)
{
    *ops = (struct sh_vmm_ops){.ctx = pool, .create = strand_create, .release = strand_release};
}
