/* region_int.h — the region registry's insides, shared by the files of
 * pool/ that work on regions: region.c builds, reuses and tears them down,
 * evict.c moves their backing. Nothing outside pool/ includes this.
 *
 * Locking: see region.c. A chunk's handle and slab change only inside a
 * remap window, while the region is EVICTING or RESTORING, states that only
 * the thread that set them leaves. A prefetched region is RESTORING between
 * two calls: it is then on the pool's prefetch list (pool->mu), and whoever
 * takes it off that list under mu owns it until it leaves RESTORING; an
 * early eviction likewise stays EVICTING on the pool's early-eviction list.
 */
#ifndef SH_POOL_REGION_INT_H
#define SH_POOL_REGION_INT_H

#include "pool/pool.h"
#include "pool/rwlock.h"

#include <pthread.h>

#define NBUCKETS  64
#define NO_STREAM UINT64_MAX

struct chunk {
    size_t off, size;
    uint64_t handle;      /* device handle while resident, else 0 */
    struct sh_slab *slab; /* host slab while evicted, else NULL */
    uint32_t crc;         /* of the slab at eviction, with debug_checksums */
    /* Nonzero: nothing is mapped at the chunk's address (a remap failed
     * both ways) and this handle holds its bytes (repair.c; atomic). */
    uint64_t hole;
    /* Clean regions (keep.c): a RESIDENT region's host copy of the chunk as
     * it was restored, and the fingerprint of those bytes (which an
     * eviction that takes the copy as its slab keeps). clean: in that
     * eviction's window, the device bytes matched: nothing to copy. */
    struct sh_slab *kept;
    struct sh_clean_fp fp;
    int clean;
    /* An early eviction's (move.c): the device bytes' fingerprint before
     * its copy ahead, which its window compares again; and in that window,
     * the one taken there already (region->now_window). */
    struct sh_clean_fp ev_fp, now_fp;
};

/* Moves in flight whose copies go one way (prefetches: H2D; early
 * evictions: D2H), oldest first; pool->mu (count is also read without it,
 * atomically). A region is on one at most. */
struct move_list {
    struct region *head;
    size_t count;
    int dir;
    /* Back where it was (the list's direction: prefetch.c, early.c), its
     * copies finished; the move's owner calls it through sh_pool_move_cancel. */
    void (*cancel)(struct sh_pool *pool, struct region *r);
};

struct region {
    uintptr_t va;
    size_t size, mapped;
    uint64_t id;
    int state, path;
    uint64_t stream, fence;       /* where and when it was freed */
    uint64_t last_use;            /* the pool's clock when a launch last used it (reports) */
    uint64_t issued;              /* the pool's clock when work using it was last issued */
    uint64_t evict_clock;         /* the pool's clock in its last eviction window */
    uint64_t last_use_us;         /* monotonic time of that last use, for the monitor */
    uint32_t evictions, restores; /* times its backing moved each way */
    uint32_t evictions_at_alloc, restores_at_alloc; /* the counts when last allocated */
    uint32_t unchanged, unchanged_at_alloc;         /* evictions that found it as restored */
    uint64_t use_streams; /* streams that used it since it last moved (tracked drain) */
    /* PTRS_FOUND: bytes seen in it look like pointers into regions;
     * PTRS_UNSCANNED: its landed bytes await the scanner (ptrscan.c), set
     * and cleared with scan under pool->scan.mu. Atomic: launches read
     * both bits in one load. */
    int holds_ptrs;
    /* SCAN_NONE, or queued on pool->scan (scan_next), or being scanned;
     * pool->scan.mu (read without it, atomically, where NONE is the
     * common answer). */
    int scan;
    struct region *scan_next;
    /* The device found no pointer candidate in the bytes its window is
     * moving to the host (sh_pool_scan_prefilter): their landing is not
     * scanned. Set in the window, just before the remap, under move_mu;
     * taken by sh_pool_scan_landed, or cleared if the remap fails. */
    int no_ptrs;
    /* While a prefetch or an early eviction is in flight (evict.c): its
     * copies, numbered mv_first..mv_last in their direction, and its place
     * on the pool's list of them. A prefetch's device chunks are mapped at
     * scratch; an early eviction began when its issue stamp was ev_issued. */
    uintptr_t scratch;
    uint64_t mv_first, mv_last, ev_issued;
    uint64_t ev_ticket; /* an early eviction's start fingerprints, queued (0: none) */
    struct region *mv_next;
    struct move_list *mv_on;            /* the list it is on; NULL when none */
    struct region *lru_prev, *lru_next; /* all freed regions, oldest first */
    struct region *bucket_next;         /* freed regions of similar size */
    /* Set when a failed move could not be rolled back whole: its chunks keep
     * both their device handles and their slabs, whichever is mapped, and
     * it is never moved again (HOST, so freeing it tears it down). */
    int stuck;
    /* Another party holds its physical pages (a handle retained or
     * exported through its address): it is never moved again, and when
     * freed its chunks go back to the driver, never to another region.
     * Set under pool->mu, where evictions pick their victims. */
    int pinned;
    /* Path SH_PATH_VMM (adopt.c): mapped at the program's address now,
     * and the references the program holds to its handle. pool->mu. */
    int vmm_mapped;
    unsigned vmm_refs;
    /* Clean regions (keep.c). has_kept: its chunks hold kept copies and it
     * is on pool->kept (pool->mu). The rest is its mover's: from_kept, the
     * eviction under way took those copies as its slabs; spoiled, a copy
     * into them was made since; ahead, an early eviction that also copies
     * into fresh slabs from its start (the region was dirty last time),
     * its kept copy still in chunk->kept; keep_next, the restore under way
     * keeps its slabs; learn, what its evictions taught. */
    struct region *kept_prev, *kept_next;
    int has_kept, from_kept, spoiled, ahead, keep_next;
    uint64_t now_window;  /* the early-eviction window that fingerprinted it (now_fp) */
    uint64_t kept_issued; /* its issue stamp when the kept copy was taken */
    struct sh_clean_learn learn;
    unsigned nchunks;
    struct chunk chunks[];
};

struct sh_pool {
    struct sh_pool_params p;
    struct sh_vmm_ops vmm;
    struct sh_fence_ops fences;
    struct sh_pool_mover mover; /* eviction's collaborators; zero until set */
    pthread_mutex_t mu;
    pthread_mutex_t move_mu;     /* one eviction or restore batch at a time */
    struct sh_rwlock index_lock; /* rwlock.h: the read side is cheap */
    struct sh_rindex *index;
    struct sh_vaarena *va;
    struct sh_chunkcache *cc;
    struct sh_suballoc *sa;
    struct region *lru_head, *lru_tail;
    struct region *buckets[NBUCKETS];
    uint64_t next_id, clock;
    struct move_list pf, ev;              /* prefetches, early evictions in flight */
    struct region *kept_head, *kept_tail; /* regions holding kept copies, oldest first (mu) */
    /* Work issued at or before this clock has finished: the last window
     * that drained the whole device read it. */
    uint64_t drained;
    uint64_t ev_windows; /* early-eviction windows so far (move_mu) */
    /* Opaque work (accesses unbounded) counts as using every region: the
     * clock when it was last issued, and (tracked drain) its streams. */
    uint64_t opaque, opaque_streams;
    /* Memory the program maps itself lies handle after handle in one
     * reservation, and a tensor may span several regions: work that uses
     * one such region counts as using all of them (see spans()). The
     * clock when it was last issued, its streams, and PTRS_FOUND once a
     * table was seen in any of them (atomics). */
    uint64_t spanned, spanned_streams;
    int spanned_ptrs;
    /* Every region ever indexed lies in [lo, hi) (atomic): a value outside
     * is no pointer into one, without a lookup. */
    uintptr_t lo, hi;
    size_t holes; /* chunks with a hole (repair.c; atomic) */
    /* The scanner of evicted regions' bytes (ptrscan.c): its queue, oldest
     * first, and its thread, started at the first eviction in process pid. */
    struct {
        pthread_mutex_t mu;
        pthread_cond_t cv; /* queued, done or stop */
        pthread_t thread;
        struct region *head, *tail;
        int started, stop, paused;
        long pid;
        uint64_t queued, settled, skipped, prefilters; /* sh_pool_stats' scans_*, prefilters */
    } scan;
    /* Atomics, set once (move.c): no early eviction starts (no
     * fingerprint), no prefetch starts (a write the scan missed was seen). */
    int no_early, no_prefetch;
    pthread_mutex_t strand_mu;
    struct strand *stranded; /* scratch mappings that cannot be unmapped */
    size_t nstranded;
    struct sh_pool_stats st;
    /* What the stream-ordered paths hold, and the peaks (usage.c; atomics). */
    size_t usage_used, usage_used_high, usage_reserved_high;
};

/* region.c, for adopt.c: a region of `mapped` bytes with its chunks laid
 * out (mapped, nchunks, chunks[].off and .size set; no handles, no address,
 * all else zero), or NULL when out of memory. */
struct region *sh_pool_region_new(struct sh_pool *pool, size_t mapped);

/* evict.c, for region.c: a prefetch or an early eviction the caller took
 * off its list (mu held; 1 if r was on one) with sh_pool_move_take is
 * cancelled with sh_pool_move_cancel (mu not held): its copies are waited
 * for, and it is back where it was, HOST on its slabs or RESIDENT. */
int sh_pool_move_take(struct sh_pool *pool, struct region *r);
void sh_pool_move_cancel(struct sh_pool *pool, struct region *r);
/* ptrscan.c: widens [pool->lo, pool->hi) to cover r (region.c, as it
 * indexes r).
 *
 * sh_pool_scan_landed: r's bytes just landed in its slabs (evict.c, before
 * r goes HOST): the scanner thread marks r if they hold a pointer, off the
 * evicting thread (the scan reads host memory no faster than a link fills
 * it). Until then r->scan says so, and whoever needs the answer, or is
 * about to take r off the host, calls sh_pool_scan_settle first (no pool
 * lock held): it scans r itself if the scanner has not begun (want), or
 * waits for it. Without want (r is freed) a queued scan is dropped. */
void sh_pool_note_bounds(struct sh_pool *pool, const struct region *r);
void sh_pool_scan_landed(struct sh_pool *pool, struct region *r);
/* In an eviction window (drained, before the remap): the device's pass
 * over the bytes of v[0..n) (pool->mover.ptr_candidates) marks each region
 * whose bytes hold no pointer candidate (r->no_ptrs). Without the pass, or
 * if it fails, nothing is marked: the CPU scans as before. */
void sh_pool_scan_prefilter(struct sh_pool *pool, struct region **v, size_t n);
void sh_pool_scan_settle(struct sh_pool *pool, struct region *r, int want);
/* The scanner stops (sh_pool_destroy); later scans run on the caller. */
void sh_pool_scan_stop(struct sh_pool *pool);
enum { SCAN_NONE = 0, SCAN_QUEUED = 1, SCAN_RUNNING = 2 };
enum { PTRS_FOUND = 1, PTRS_UNSCANNED = 2 };
/* Settles the scans of the regions at bases[0..n) still waiting for one
 * (use.c, after reading PTRS_UNSCANNED in a launch's regions; no pool lock
 * held): PTRS_FOUND if one of them holds pointers, else 0. */
int sh_pool_scan_settle_bases(struct sh_pool *pool, const uintptr_t *bases, size_t n);

/* repair.c: swaps the mapping at chunk c of r from handle `from` to `to`,
 * retrying transient failures: 0 when `to` is mapped, SH_EDRIVER when
 * `from` is (as before, or again), SH_ELOST when neither could be mapped
 * back: c is then a hole that `whole` (the handle holding its bytes) fills
 * when the driver maps again, and r is stuck. */
int sh_pool_remap(struct sh_pool *pool, struct region *r, struct chunk *c, uint64_t from,
                  uint64_t to, uint64_t whole);
/* Unmaps [va, va+size), retrying transient failures; 0 or SH_EDRIVER. */
int sh_pool_unmap(struct sh_pool *pool, uintptr_t va, size_t size);
/* A chunk torn down with a hole: it no longer counts. */
void sh_pool_hole_close(struct sh_pool *pool, struct chunk *c);
/* Unmaps a scratch mapping of handle; if it cannot be, the mapping is
 * stranded (its handle is not released until it is gone) and SH_EDRIVER
 * says the address must not be reused. */
int sh_pool_unmap_or_strand(struct sh_pool *pool, uintptr_t va, size_t size, uint64_t handle);
/* The chunk cache's create and release, which know stranded mappings. */
void sh_pool_chunk_ops(struct sh_pool *pool, struct sh_vmm_ops *ops);

/* usage.c: bytes the program took from, or gave back to, the
 * stream-ordered paths; called with no pool lock held. */
void sh_pool_usage_add(struct sh_pool *pool, size_t bytes);
void sh_pool_usage_sub(struct sh_pool *pool, size_t bytes);

/* move.c, for prefetch.c and early.c: the lists of moves in flight (l
 * one of pool->pf, pool->ev). push: r onto l (its copies are
 * mv_first..mv_last), counted in *started under mu; none: l is empty (no
 * lock); ready: how many on l have finished their copies (*inflight, may
 * be NULL: all on l); start: the regions at vas[0..n) that pick() takes
 * (mu and the index lock held) are started with start_one(); commit: one
 * window over a batch taken off l (all, or those finished), window()
 * setting ok[k] for each it moved,
 * committed() finishing those, the others cancelled, their bases in out and
 * back (back may be NULL), SH_EBUSY when the caller holds the gate;
 * cancel_all: every move on l (teardown). The cancels of each direction
 * (sh_pool_pf_cancel, sh_pool_ev_cancel) are the lists' hooks. */
void sh_pool_move_push(struct sh_pool *pool, struct move_list *l, struct region *r,
                       uint64_t *started);
int sh_pool_move_none(const struct move_list *l);
size_t sh_pool_move_ready(struct sh_pool *pool, struct move_list *l, size_t *inflight);
int sh_pool_move_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                       size_t *nstarted, int (*pick)(struct sh_pool *, struct region *),
                       int (*start_one)(struct sh_pool *, struct region *));
int sh_pool_move_commit(struct sh_pool *pool, struct move_list *l, int all, size_t max,
                        void (*window)(struct sh_pool *, struct region **, size_t, char *),
                        void (*committed)(struct sh_pool *, struct region *, void *), void *arg,
                        uintptr_t *out, size_t *nout, uintptr_t *back, size_t *nback);
void sh_pool_move_cancel_all(struct sh_pool *pool, struct move_list *l);
void sh_pool_pf_cancel(struct sh_pool *pool, struct region *r);
void sh_pool_ev_cancel(struct sh_pool *pool, struct region *r);

/* evict.c, for move.c: the pieces the blocking moves and the moves in
 * flight share (see evict.c for each). */
void sh_pool_give_back_slabs(struct sh_pool *pool, struct region *r);
int sh_pool_get_slabs(struct sh_pool *pool, struct region *r, unsigned wait_ms);
void sh_pool_finish_state(struct sh_pool *pool, struct region *r, int to);
uint32_t sh_pool_crc_of(const struct chunk *c);
void sh_pool_make_stuck(struct sh_pool *pool, struct region *r, const char *what);
int sh_pool_drain(struct sh_pool *pool, struct region **v, size_t n);
/* A window's copies: issued, and waited for, counted as its copy wait. */
int sh_pool_window_copy(struct sh_pool *pool, int dir, uintptr_t dst, uintptr_t src, size_t n);
int sh_pool_flush(struct sh_pool *pool, int dir);
uint64_t sh_pool_issued_at(const struct sh_pool *pool, const struct region *r);
/* Drains the whole device (the gate closed: no work between its issue and
 * its stamp) and notes the stamp all work up to has finished. */
int sh_pool_drain_device(struct sh_pool *pool);
/* Closes the gate for a remap window: 0, or SH_EBUSY when the caller holds
 * it or a stream captures (mover.capturing, asked once it is closed: a
 * window's drain would break the capture), and then it stays open. */
int sh_pool_window_lock(struct sh_pool *pool);

/* r may be reached by work whose pointer lands in another region: the
 * program's own mappings, which it places side by side (PyTorch's
 * expandable segments map a handle per region under one tensor). */
static inline int spans(const struct region *r)
{
    return r->path == SH_PATH_VMM;
}
void sh_pool_evicted_one(struct sh_pool *pool, struct region *r, size_t *released);
int sh_pool_can_move(struct sh_pool *pool);
void sh_pool_put_chunks(struct sh_pool *pool, struct region *r, unsigned n);
int sh_pool_get_chunks(struct sh_pool *pool, struct region *r);
void sh_pool_verify(struct sh_pool *pool, struct region *r, const struct chunk *c);
void sh_pool_check_move(struct sh_pool *pool, struct region *r, uintptr_t dev, const char *kind);
void sh_pool_unrestore(struct sh_pool *pool, struct region *r, unsigned n);

/* keep.c: host copies kept after a restore (clean regions).
 *   kept_take      r just went RESIDENT -> EVICTING (mu held): its kept
 *                  copies, if any, become its slabs (from_kept); for an
 *                  early eviction (early) they stay kept until its start
 *                  asks kept_changed: 1 when the device bytes, as
 *                  fingerprinted into chunk->ev_fp, differ from the copy
 *                  (a guess: nothing is stopped), and then it copies ahead
 *                  into fresh slabs (ahead), else kept_ahead_off
 *   kept_ahead     an early eviction that copied ahead, in its window,
 *                  compared: each chunk keeps the slab that holds its bytes
 *   kept_detach    r leaves RESIDENT another way (freed, pinned, unmapped;
 *                  mu held): its kept slabs, linked by next, for kept_put
 *                  once mu is released
 *   kept_reclaim   gives up the oldest region's copies (no lock held):
 *                  the bytes freed, 0 when none was kept
 *   kept_compare   in an eviction window: fingerprints the regions of v
 *                  that took kept copies and marks their clean chunks
 *   kept_mark      in a restore window, the bytes landed at base[k]:
 *                  whether each region keeps its slabs, and their
 *                  fingerprints
 *   kept_restored  a restore committed: RESIDENT, its slabs kept or given back
 *   kept_unevict   an eviction did not happen: RESIDENT, copies kept again
 *                  if nothing was copied into them
 *   kept_evicted   an eviction committed: what it taught; returns the
 *                  bytes copied in the window (those not found clean) */
void sh_pool_kept_take(struct sh_pool *pool, struct region *r, int early);
void sh_pool_kept_ahead(struct sh_pool *pool, struct region *r);
int sh_pool_kept_changed(const struct region *r);
/* r's bytes changed `when` with no work naming it: counted, said once, and
 * no prefetch starts from then on (a prefetch's source is host memory,
 * which only a second pass over the bus could compare). move.c. */
void sh_pool_unseen_write(struct sh_pool *pool, const struct region *r, const char *when);
/* The fingerprints of the chunks of v[0..n) (pool->mover's, counted in the
 * stats), in one call to the device (a round trip each would hold a window
 * that much longer), v[k]'s as mapped at base[k] (at its own address when
 * base is NULL): *out gets them in order, to be freed; 0, or an error and
 * *out NULL. The time waited is added to *waited_ns too, when not NULL
 * (the stats' start fingerprints: waited outside any window). */
int sh_pool_fingerprint_all(struct sh_pool *pool, struct region *const *v, const uintptr_t *base,
                            size_t n, struct sh_clean_fp **out, uint64_t *waited_ns);
/* The same for r at its address, queued on dir's copy stream ahead of
 * what is queued there next (mover's fingerprint_queue); the results are
 * taken with sh_pool_fingerprint_take (out NULL: given up), once each. */
int sh_pool_fingerprint_queue(struct sh_pool *pool, struct region *r, int dir, uint64_t *ticket);
int sh_pool_fingerprint_take(struct sh_pool *pool, const struct region *r, uint64_t ticket,
                             struct sh_clean_fp *out);
/* An early eviction that does not copy ahead: its kept copies become its
 * slabs; its window compares and copies what changed. */
void sh_pool_kept_ahead_off(struct region *r);
struct sh_slab *sh_pool_kept_detach(struct sh_pool *pool, struct region *r);
void sh_pool_kept_put(struct sh_pool *pool, struct sh_slab *list);
size_t sh_pool_kept_reclaim(struct sh_pool *pool);
/* In a window (drained, gated): sets each chunk's clean from a fingerprint
 * of the device bytes, for the regions of v with kept copies; with window
 * nonzero, also keeps it (chunk->now_fp, region->now_window = window) for
 * the window's other comparisons: nothing changes the bytes meanwhile. */
void sh_pool_kept_compare(struct sh_pool *pool, struct region **v, size_t n, uint64_t window);
void sh_pool_kept_mark(struct sh_pool *pool, struct region **v, const uintptr_t *base, size_t n);
void sh_pool_kept_restored(struct sh_pool *pool, struct region *r);
void sh_pool_kept_unevict(struct sh_pool *pool, struct region *r);
size_t sh_pool_kept_evicted(struct sh_pool *pool, struct region *r);

#endif
