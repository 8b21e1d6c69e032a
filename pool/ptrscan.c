/* ptrscan.c — telling regions that hold pointers into regions from those
 * that do not, by the bytes the library sees: a host-to-device copy's
 * source, and an evicted region's bytes as they land on the host.
 *
 * Work using such a region is opaque (a kernel may follow its pointers to
 * regions its parameters never name). The scan reads every 4-byte-aligned
 * 8-byte value, as a packed record may hold one anywhere. It must keep up
 * with eviction copies, so it first looks only at each value's high word,
 * which for a pointer into the pool lies in a range of a few values; a
 * whole block is checked in one branch-free pass, and only a block with a
 * candidate is looked at value by value.
 *
 * Locking: pool->lo/hi and region->holds_ptrs are atomics; index lookups
 * take index_lock for reading.
 */
#include "pool/region_int.h"

#include <string.h>

#define BLOCK 1024 /* words per branch-free pass */

void sh_pool_note_bounds(struct sh_pool *pool, const struct region *r)
{
    uintptr_t lo = __atomic_load_n(&pool->lo, __ATOMIC_RELAXED);
    while (
        (lo == 0 || r->va < lo) &&
        !__atomic_compare_exchange_n(&pool->lo, &lo, r->va, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    uintptr_t hi = __atomic_load_n(&pool->hi, __ATOMIC_RELAXED);
    while (r->va + r->mapped > hi &&
           !__atomic_compare_exchange_n(&pool->hi, &hi, r->va + r->mapped, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

void sh_pool_bounds(struct sh_pool *pool, uintptr_t *lo, uintptr_t *hi)
{
    *lo = __atomic_load_n(&pool->lo, __ATOMIC_RELAXED);
    *hi = __atomic_load_n(&pool->hi, __ATOMIC_RELAXED);
}

static uint32_t word_at(const unsigned char *p, size_t i)
{
    uint32_t w;
    memcpy(&w, p + 4 * i, sizeof w);
    return w;
}

/* 1 if the 8 bytes at p + off are an address inside a region. */
static int is_pointer(struct sh_pool *pool, const unsigned char *p, size_t off, uintptr_t lo,
                      uintptr_t hi)
{
    uintptr_t v;
    memcpy(&v, p + off, sizeof v);
    if (v - lo >= hi - lo)
        return 0;
    sh_rw_rdlock(&pool->index_lock);
    int found = sh_rindex_lookup(pool->index, v) != NULL;
    sh_rw_unlock(&pool->index_lock);
    return found;
}

typedef uint32_t u32x4 __attribute__((vector_size(16)));

/* 1 if a word of p[b..end) could be a pointer's high half (unsigned
 * w - top <= span), four words at a time: the scan keeps pace with the
 * copies only if it costs about an instruction a word. */
static int any_candidate(const unsigned char *p, size_t b, size_t end, uint32_t top, uint32_t span)
{
    const u32x4 vt = {top, top, top, top}, vs = {span, span, span, span};
    u32x4 acc = {0, 0, 0, 0};
    size_t i = b;
    for (; i + 4 <= end; i += 4) {
        u32x4 w;
        memcpy(&w, p + 4 * i, sizeof w);
        acc |= (u32x4)(w - vt <= vs);
    }
    uint32_t any = acc[0] | acc[1] | acc[2] | acc[3];
    for (; i < end; i++)
        any |= word_at(p, i) - top <= span;
    return any != 0;
}

/* 1 if any 4-byte-aligned 8 bytes of p[0..n) point into a region. */
static int holds_pointer(struct sh_pool *pool, const unsigned char *p, size_t n)
{
    uintptr_t lo = __atomic_load_n(&pool->lo, __ATOMIC_RELAXED);
    uintptr_t hi = __atomic_load_n(&pool->hi, __ATOMIC_RELAXED);
    if (!p || n < 8 || hi <= lo)
        return 0;
    uint32_t top = (uint32_t)((uint64_t)lo >> 32);
    uint32_t span = (uint32_t)((uint64_t)(hi - 1) >> 32) - top;
    size_t words = n / 4; /* word i + 1 is the high half of the value at 4i */
    for (size_t b = 1; b < words; b += BLOCK) {
        size_t end = b + BLOCK < words ? b + BLOCK : words;
        if (!any_candidate(p, b, end, top, span))
            continue;
        for (size_t i = b; i < end; i++)
            if (word_at(p, i) - top <= span && is_pointer(pool, p, 4 * (i - 1), lo, hi))
                return 1;
    }
    return 0;
}

static void mark(struct sh_pool *pool, uintptr_t into)
{
    sh_rw_rdlock(&pool->index_lock);
    struct region *dst = sh_rindex_lookup(pool->index, into);
    if (dst)
        __atomic_store_n(&dst->holds_ptrs, 1, __ATOMIC_RELAXED);
    sh_rw_unlock(&pool->index_lock);
}

size_t sh_pool_find_pointers(struct sh_pool *pool, const void *bytes, size_t n, uintptr_t into)
{
    if (!holds_pointer(pool, bytes, n))
        return 0;
    mark(pool, into);
    return 1;
}

void sh_pool_scan_landed(struct sh_pool *pool, struct region *r)
{
    for (unsigned i = 0; i < r->nchunks && !__atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED);
         i++) {
        const struct chunk *c = &r->chunks[i];
        if (c->slab && holds_pointer(pool, (const unsigned char *)c->slab->staging, c->size))
            __atomic_store_n(&r->holds_ptrs, 1, __ATOMIC_RELAXED);
    }
}
