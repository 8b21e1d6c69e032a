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
 * The device looks first: in the eviction window, a kernel reads the
 * bytes about to leave (sh_pool_scan_prefilter, at device memory speed) for
 * any word that could be a pointer's high half; a region where it finds
 * none is not scanned on the CPU at all, and the common case (activations,
 * weights: no such word) costs the CPU nothing. Without that kernel, every
 * evicted byte is scanned here.
 *
 * An evicted region's bytes are scanned by a thread of the pool's, not by
 * the thread that evicted it: host memory reads at about the speed a PCIe
 * link fills it, so scanning inline would double what an eviction on
 * demand holds the program for. The answer is needed only where the
 * region is used again, or leaves the host: there sh_pool_scan_settle
 * takes over a scan not begun, or waits for the one under way.
 *
 * With several devices, a pointer into another device's pool counts too
 * (the mover's targets): the range looked at widens to hold every pool's.
 *
 * Locking: pool->lo/hi and region->holds_ptrs are atomics; index lookups
 * take index_lock for reading (another pool's, through targets_has, with
 * no lock of that pool held). pool->scan.mu guards the queue and each
 * region's scan state and the counters of prefilters and skipped scans,
 * and is never held while scanning or while taking another pool lock.
 * region->no_ptrs is set, taken and cleared under move_mu (the windows and
 * what follows them). A fork child has no scanner: it scans inline.
 */
#include "pool/region_int.h"

#include "sh_clock.h"
#include "sh_err.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Where a value must lie to point into this pool's regions or its
 * targets'. */
static void scan_bounds(struct sh_pool *pool, uintptr_t *lo, uintptr_t *hi)
{
    sh_pool_bounds(pool, lo, hi);
    if (pool->mover.targets_bounds)
        pool->mover.targets_bounds(pool->mover.targets_ctx, lo, hi);
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
    if (!found && pool->mover.targets_has)
        found = pool->mover.targets_has(pool->mover.targets_ctx, v);
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
    uintptr_t lo, hi;
    scan_bounds(pool, &lo, &hi);
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

/* r holds pointers: so may a tensor work on its neighbours reaches. */
static void found(struct sh_pool *pool, struct region *r)
{
    __atomic_fetch_or(&r->holds_ptrs, PTRS_FOUND, __ATOMIC_RELAXED);
    if (spans(r))
        __atomic_fetch_or(&pool->spanned_ptrs, PTRS_FOUND, __ATOMIC_RELAXED);
}

static void mark(struct sh_pool *pool, uintptr_t into)
{
    sh_rw_rdlock(&pool->index_lock);
    struct region *dst = sh_rindex_lookup(pool->index, into);
    if (dst)
        found(pool, dst);
    sh_rw_unlock(&pool->index_lock);
}

void sh_pool_mark_pointers(struct sh_pool *pool, uintptr_t into)
{
    mark(pool, into);
}

size_t sh_pool_find_pointers(struct sh_pool *pool, const void *bytes, size_t n, uintptr_t into)
{
    if (!holds_pointer(pool, bytes, n))
        return 0;
    mark(pool, into);
    return 1;
}

/* Marks r if the bytes in its slabs hold a pointer. */
static void scan_slabs(struct sh_pool *pool, struct region *r)
{
    uint64_t t0 = sh_clock_ns(), bytes = 0;
    for (unsigned i = 0;
         i < r->nchunks && !(__atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED) & PTRS_FOUND); i++) {
        const struct chunk *c = &r->chunks[i];
        bytes += c->slab ? c->size : 0;
        if (c->slab && holds_pointer(pool, (const unsigned char *)c->slab->staging, c->size))
            found(pool, r);
    }
    __atomic_add_fetch(&pool->st.scan_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pool->st.scanned_bytes, bytes, __ATOMIC_RELAXED);
}

/* r's scan is over; scan.mu held. SCAN_NONE is the last write to r: a
 * thread that reads it without the lock may free r at once. */
static void scan_done(struct sh_pool *pool, struct region *r)
{
    __atomic_fetch_and(&r->holds_ptrs, ~PTRS_UNSCANNED, __ATOMIC_RELAXED);
    __atomic_store_n(&r->scan, SCAN_NONE, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool->scan.cv);
}

static void *scanner_main(void *arg)
{
    struct sh_pool *pool = arg;
    pthread_mutex_lock(&pool->scan.mu);
    for (;;) {
        while (!pool->scan.stop && (!pool->scan.head || pool->scan.paused))
            pthread_cond_wait(&pool->scan.cv, &pool->scan.mu);
        if (pool->scan.stop)
            break;
        struct region *r = pool->scan.head;
        pool->scan.head = r->scan_next;
        if (!pool->scan.head)
            pool->scan.tail = NULL;
        __atomic_store_n(&r->scan, SCAN_RUNNING, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&pool->scan.mu);
        scan_slabs(pool, r);
        pthread_mutex_lock(&pool->scan.mu);
        scan_done(pool, r);
    }
    pthread_mutex_unlock(&pool->scan.mu);
    return NULL;
}

/* 1 when the scanner runs in this process (started now if need be); scan.mu held. */
static int scanner_up(struct sh_pool *pool)
{
    if (pool->scan.stop)
        return 0;
    if (pool->scan.started)
        return pool->scan.pid == (long)getpid();
    pool->scan.pid = (long)getpid();
    pool->scan.started = pthread_create(&pool->scan.thread, NULL, scanner_main, pool) == 0;
    return pool->scan.started;
}

/* Whether r's landing would be scanned at all. */
static int unknown(const struct region *r)
{
    return !(__atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED) & PTRS_FOUND);
}

/* The device's answer for the chunks of the regions of v that look[] says,
 * in order, into found[]; 0, or an error. */
static int candidates(struct sh_pool *pool, struct region **v, size_t n, const unsigned char *look,
                      size_t m, unsigned char *found, uint64_t bus[2])
{
    uintptr_t *addr = malloc(m * sizeof *addr);
    size_t *len = malloc(m * sizeof *len);
    int rc = addr && len ? 0 : SH_ENOMEM;
    for (size_t k = 0, j = 0; rc == 0 && k < n; k++)
        for (unsigned i = 0; look[k] && i < v[k]->nchunks; i++, j++) {
            addr[j] = v[k]->va + v[k]->chunks[i].off;
            len[j] = v[k]->chunks[i].size;
        }
    uintptr_t lo, hi;
    scan_bounds(pool, &lo, &hi);
    if (rc == 0)
        rc = pool->mover.ptr_candidates(pool->mover.fp_ctx, addr, len, m, lo, hi, found, bus);
    free(addr);
    free(len);
    return rc;
}

void sh_pool_scan_prefilter(struct sh_pool *pool, struct region **v, size_t n)
{
    unsigned char *look = n ? calloc(n, 1) : NULL;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        v[k]->no_ptrs = 0;
        if (look && unknown(v[k])) {
            look[k] = 1;
            m += v[k]->nchunks;
        }
    }
    unsigned char *found = m && pool->mover.ptr_candidates ? malloc(m) : NULL;
    uint64_t bus[2] = {0, 0};
    uint64_t t0 = sh_clock_ns();
    int rc = found ? candidates(pool, v, n, look, m, found, bus) : SH_ENOMEM;
    __atomic_add_fetch(&pool->st.prefilter_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
    if (found) {
        pthread_mutex_lock(&pool->scan.mu);
        pool->scan.prefilters += rc == 0 ? m : 0;
        pthread_mutex_unlock(&pool->scan.mu);
        pthread_mutex_lock(&pool->mu);
        pool->st.evicted_bytes += bus[SH_D2H]; /* every byte that crosses the bus */
        pool->st.restored_bytes += bus[SH_H2D];
        pthread_mutex_unlock(&pool->mu);
    }
    if (rc == 0)
        for (size_t k = 0, j = 0; k < n; k++) {
            int any = 0;
            for (unsigned i = 0; look[k] && i < v[k]->nchunks; i++)
                any |= found[j++];
            v[k]->no_ptrs = look[k] && !any;
        }
    free(found);
    free(look);
}

void sh_pool_scan_landed(struct sh_pool *pool, struct region *r)
{
    if (r->no_ptrs) { /* the device found nothing to look at */
        r->no_ptrs = 0;
        pthread_mutex_lock(&pool->scan.mu);
        pool->scan.skipped++;
        pthread_mutex_unlock(&pool->scan.mu);
        return;
    }
    if (__atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED) & PTRS_FOUND)
        return; /* known already: nothing to learn */
    pthread_mutex_lock(&pool->scan.mu);
    int queued = scanner_up(pool);
    if (queued) {
        r->scan_next = NULL;
        if (pool->scan.tail)
            pool->scan.tail->scan_next = r;
        else
            pool->scan.head = r;
        pool->scan.tail = r;
        __atomic_store_n(&r->scan, SCAN_QUEUED, __ATOMIC_RELAXED);
        __atomic_fetch_or(&r->holds_ptrs, PTRS_UNSCANNED, __ATOMIC_RELAXED);
        pool->scan.queued++;
        pthread_cond_broadcast(&pool->scan.cv);
    }
    pthread_mutex_unlock(&pool->scan.mu);
    if (!queued)
        scan_slabs(pool, r);
}

/* Takes r off the queue; scan.mu held, r queued. */
static void unqueue(struct sh_pool *pool, struct region *r)
{
    struct region **p = &pool->scan.head, *prev = NULL;
    while (*p != r) {
        prev = *p;
        p = &(*p)->scan_next;
    }
    *p = r->scan_next;
    if (pool->scan.tail == r)
        pool->scan.tail = prev;
}

/* sh_pool_scan_settle, for a region whose scan is not known to be over. */
static void settle(struct sh_pool *pool, struct region *r, int want)
{
    pthread_mutex_lock(&pool->scan.mu);
    int orphan = pool->scan.pid != (long)getpid(); /* a fork child: no scanner runs */
    while (r->scan == SCAN_RUNNING && !orphan)
        pthread_cond_wait(&pool->scan.cv, &pool->scan.mu);
    int mine = r->scan != SCAN_NONE;
    if (mine) {
        if (r->scan == SCAN_QUEUED)
            unqueue(pool, r);
        __atomic_store_n(&r->scan, SCAN_RUNNING, __ATOMIC_RELAXED);
        pool->scan.settled += (uint64_t)want;
    }
    pthread_mutex_unlock(&pool->scan.mu);
    if (!mine)
        return;
    if (want)
        scan_slabs(pool, r);
    pthread_mutex_lock(&pool->scan.mu);
    scan_done(pool, r);
    pthread_mutex_unlock(&pool->scan.mu);
}

void sh_pool_scan_settle(struct sh_pool *pool, struct region *r, int want)
{
    if (__atomic_load_n(&r->scan, __ATOMIC_ACQUIRE) == SCAN_NONE)
        return;
    uint64_t t0 = sh_clock_ns();
    settle(pool, r, want);
    __atomic_add_fetch(&pool->st.scan_wait_ns, sh_clock_ns() - t0, __ATOMIC_RELAXED);
}

/* At most this many of one launch's regions are settled one by one; past
 * that the answer is yes (the work is opaque: slower, never wrong). */
#define SETTLE_MAX 8

int sh_pool_scan_settle_bases(struct sh_pool *pool, const uintptr_t *bases, size_t n)
{
    struct region *v[SETTLE_MAX];
    size_t m = 0;
    int ptrs = 0;
    sh_rw_rdlock(&pool->index_lock);
    for (size_t i = 0; i < n; i++) {
        struct region *r = sh_rindex_lookup(pool->index, bases[i]);
        int h = r ? __atomic_load_n(&r->holds_ptrs, __ATOMIC_RELAXED) : 0;
        ptrs |= h & PTRS_FOUND;
        if (h & PTRS_UNSCANNED) {
            if (m < SETTLE_MAX)
                v[m++] = r;
            else
                ptrs = PTRS_FOUND;
        }
    }
    sh_rw_unlock(&pool->index_lock);
    for (size_t k = 0; k < m; k++) {
        sh_pool_scan_settle(pool, v[k], 1);
        ptrs |= __atomic_load_n(&v[k]->holds_ptrs, __ATOMIC_RELAXED) & PTRS_FOUND;
    }
    return ptrs;
}

void sh_pool_scan_pause(struct sh_pool *pool, int paused)
{
    pthread_mutex_lock(&pool->scan.mu);
    pool->scan.paused = paused;
    pthread_cond_broadcast(&pool->scan.cv);
    pthread_mutex_unlock(&pool->scan.mu);
}

void sh_pool_scan_stop(struct sh_pool *pool)
{
    pthread_mutex_lock(&pool->scan.mu);
    pool->scan.stop = 1;
    pthread_cond_broadcast(&pool->scan.cv);
    int join = pool->scan.started && pool->scan.pid == (long)getpid();
    pthread_mutex_unlock(&pool->scan.mu);
    if (join)
        pthread_join(pool->scan.thread, NULL);
}
