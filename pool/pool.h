/* pool.h — regions on CUDA virtual memory: the pool module's public face.
 *
 * A region is a fixed VA range, backed by a few power-of-two chunks (one
 * physical handle and one mapping each), so its backing can later move
 * without its address changing. Freed regions are kept, mapped, for reuse by
 * an allocation of the same mapped size, so steady-state alloc/free makes no
 * VMM call; small sizes are served by a cached sub-allocator. Frees may be
 * stream-ordered: memory freed on stream S with fence F is reused by S at
 * once and by other streams only once F is done.
 *
 * The driver is reached only through struct sh_vmm_ops and the fence ops.
 */
#ifndef SH_POOL_H
#define SH_POOL_H

#include "clean/clean.h"
#include "pool/pool_parts.h"
#include "transfer/transfer.h"

#include <stddef.h>
#include <stdint.h>

/* SH_PATH_VMM: memory the program maps itself at an address of its own
 * (adopt.c); never freed through sh_pool_free. */
enum sh_path {
    SH_PATH_MALLOC = 0,
    SH_PATH_ASYNC = 1,
    SH_PATH_PLUGGABLE = 2,
    SH_PATH_SLAB = 3,
    SH_PATH_VMM = 4
};

struct sh_fence_ops {
    void *ctx;
    int (*done)(void *ctx, uint64_t fence);  /* 1 once the work before it finished */
    void (*wait)(void *ctx, uint64_t fence); /* blocks until done */
    void (*drop)(void *ctx, uint64_t fence); /* the pool no longer needs it */
};

struct sh_pool_params {
    size_t granularity;  /* the driver's allocation granularity */
    size_t max_chunk;    /* largest chunk, power of two >= granularity */
    size_t va_block;     /* VA reserved at a time */
    size_t va_cache;     /* free VA kept reserved */
    size_t device_cache; /* device bytes kept in freed regions and spare chunks */
    size_t suballoc_max; /* sizes up to this on the async paths use the sub-allocator */
};

/* What a lookup reports about the region containing an address. */
struct sh_region_info {
    uintptr_t va;
    size_t size, mapped;
    uint64_t id;
    int state; /* enum sh_rstate */
    int path;  /* enum sh_path */
    unsigned nchunks;
    uint32_t evicted, restored; /* times it moved each way since it was allocated */
    /* evictions since it was allocated that found it as its restore left
     * it (clean_skip: the kept copy's fingerprint matched every chunk) */
    uint32_t unchanged;
};

struct sh_pool_stats {
    size_t regions[SH_RS_COUNT]; /* by state, the sub-allocator's slabs included */
    size_t slabs;                /* live regions that are sub-allocator slabs */
    size_t live_bytes;           /* requested bytes of live (not freed) regions */
    size_t device_bytes;         /* device memory held: mapped, cached and spare */
    size_t freed_bytes;          /* mapped bytes kept in freed regions */
    uint64_t allocs, frees, reuses, vmm_maps, vmm_unmaps;
    uint64_t small_allocs, small_frees;
    uint64_t evictions, restores;           /* regions moved */
    uint64_t evicted_bytes, restored_bytes; /* bytes copied each way (prefetches included) */
    uint64_t checksum_mismatches;
    uint64_t lost_writes; /* moves whose two sides differed in the window (verify_moves) */
    /* regions found changed with no work naming them (a pointer the
     * library never saw): under an early eviction, or since their restore */
    uint64_t unseen_writes;
    uint64_t opaque;   /* pieces of opaque work issued */
    size_t host_bytes; /* bytes of regions living in host slabs */
    size_t pinned;     /* live regions pinned (sh_pool_pin) */
    /* prefetch (evict.c) */
    uint64_t prefetches;       /* regions whose prefetch copy was started */
    uint64_t prefetch_commits; /* ... and committed */
    uint64_t prefetch_redos;   /* committed with the copy redone in the window */
    uint64_t prefetch_cancels; /* ... or back to HOST (freed, failure, teardown) */
    uint64_t prefetched_bytes; /* bytes copied by prefetches (redone, cancelled included) */
    /* early eviction (evict.c) */
    uint64_t early_evictions; /* regions whose eviction copy was started ahead of need */
    uint64_t early_commits;   /* ... and committed: they are HOST */
    uint64_t early_abandons;  /* ... or left RESIDENT: used meanwhile, failure, freed */
    /* clean regions (keep.c) */
    uint64_t clean_evictions;     /* evictions that found the kept copy unchanged: no copy */
    uint64_t dirty_evictions;     /* ... that found it changed (in some chunk): copied */
    uint64_t clean_bytes;         /* bytes not copied: their chunk was unchanged */
    uint64_t fingerprints;        /* ranges fingerprinted (kernel launches) */
    uint64_t fingerprinted_bytes; /* bytes they covered */
    uint64_t kept_dropped;        /* regions whose copies were given up for host memory */
    size_t kept_bytes;            /* host bytes held by kept copies now */
    /* pointer tables (ptrscan.c) */
    uint64_t scans_queued;  /* evicted regions whose bytes were left to the scanner thread */
    uint64_t scans_settled; /* ... scanned by a caller instead, which needed the answer first */
    uint64_t scans_skipped; /* evicted regions the device found no pointer candidate in */
    uint64_t prefilters;    /* ranges the device looked at (kernel launches) */
    /* where moves spend their time, in nanoseconds */
    uint64_t drain_ns;             /* waiting for the work that may use the regions moved */
    uint64_t copy_wait_ns;         /* a window's copies (and slots), waited for in the window */
    uint64_t remap_ns;             /* remapping chunks (unmap, map, access) */
    uint64_t scan_ns;              /* reading evicted bytes for pointers (ptrscan.c), any thread */
    uint64_t scan_wait_ns;         /* ... waited for by whoever needed the answer */
    uint64_t fingerprint_ns;       /* the device's fingerprints, waited for (windows, starts) */
    uint64_t fingerprint_start_ns; /* ... of them, taken at once at a start: in no window */
    uint64_t prefilter_ns;         /* the device's pointer prefilter, waited for (windows) */
    uint64_t scanned_bytes;
};

struct sh_pool;

int sh_pool_create(const struct sh_pool_params *p, const struct sh_vmm_ops *vmm,
                   const struct sh_fence_ops *fences, struct sh_pool **out);
/* Tears everything down; waits for outstanding fences first. */
void sh_pool_destroy(struct sh_pool *pool);

/* A region (or, for path ASYNC/PLUGGABLE and size <= suballoc_max, a
 * sub-allocated block) of at least size bytes. SH_ENOMEM when the device is
 * full even after dropping the caches. */
int sh_pool_alloc(struct sh_pool *pool, size_t size, int path, uint64_t stream, uintptr_t *va);
/* Frees what sh_pool_alloc returned. fence 0: the caller has synchronised.
 * SH_ENOTFOUND if va is not the start of one of ours (pass it through). */
int sh_pool_free(struct sh_pool *pool, uintptr_t va, uint64_t stream, uint64_t fence);
/* The region containing addr (interior pointers too); SH_ENOTFOUND if none. */
int sh_pool_lookup(struct sh_pool *pool, uintptr_t addr, struct sh_region_info *out);
/* For each of bases[0..n): 1 when the region there keeps a host copy of its
 * bytes (clean regions, keep.c), so that its next eviction may copy
 * nothing; 0 otherwise, and for an address in no region. What the policy
 * weighs a victim by (sh_policy_kept). */
void sh_pool_kept_of(struct sh_pool *pool, const uintptr_t *bases, size_t n, uint8_t *out);
/* The allocation the program holds at addr, as the driver would name it:
 * a live region's [va, va + size) or a sub-allocated block; SH_ENOTFOUND
 * for anything else (freed, a sub-allocator slab's unused space). */
int sh_pool_range(struct sh_pool *pool, uintptr_t addr, uintptr_t *base, size_t *size);
/* The region at addr is pinned: another party holds its physical pages, so
 * it never moves again and its chunks are never reused. 0 (also if it was
 * already), SH_EBUSY while it is not resident (restore it first, then pin),
 * SH_ENOTFOUND if addr is in no region (sub-allocated blocks: their slab
 * is never moved anyway). */
int sh_pool_pin(struct sh_pool *pool, uintptr_t addr);
/* Releases cached device memory (freed regions, spare chunks) until at least
 * bytes are returned or nothing is left; returns the bytes released. */
size_t sh_pool_trim(struct sh_pool *pool, size_t bytes);
void sh_pool_stats(struct sh_pool *pool, struct sh_pool_stats *st);
/* The regions the program holds (not freed), the sub-allocator's slabs
 * left out. */
static inline size_t sh_pool_stats_live(const struct sh_pool_stats *st)
{
    return st->regions[SH_RS_RESIDENT] + st->regions[SH_RS_EVICTING] + st->regions[SH_RS_HOST] +
           st->regions[SH_RS_RESTORING] - st->slabs;
}
/* The two figures of sh_pool_stats a launch's planning needs, without the
 * rest's copy: device_bytes and host_bytes. */
void sh_pool_bytes(struct sh_pool *pool, size_t *device, size_t *host);

/* ---- what the stream-ordered paths hold (usage.c) --------------------------
 * The figures a memory pool reports, for the allocations of paths ASYNC and
 * PLUGGABLE: used is what the program holds (a region's requested size, a
 * small block's class size), wherever it lives; cached is the device memory
 * the pool keeps for reuse (freed regions, spare chunks, the free blocks
 * of small-allocation slabs, whichever path they served); reserved is
 * used + cached. The peaks are the highest used since start or the last
 * reset, and the highest reserved seen when used reached a new peak or
 * the figures were read. */
struct sh_pool_usage {
    size_t used, used_high, cached, reserved, reserved_high;
};
void sh_pool_usage(struct sh_pool *pool, struct sh_pool_usage *out);
/* Resets the peak of used (used = 1) or of reserved (used = 0) to the
 * current figure. */
void sh_pool_usage_reset(struct sh_pool *pool, int used);
/* Like sh_pool_trim, and empty small-allocation slabs go too; returns the
 * bytes of device memory released. */
size_t sh_pool_release(struct sh_pool *pool, size_t bytes);

/* ---- memory the program maps itself (adopt.c) -------------------------------
 *
 * A backing is device memory the program created for itself (cuMemCreate,
 * as PyTorch's expandable segments do), held as the pool's own chunks. It
 * is mapped nowhere, or at one address of the program's own reservation,
 * where it is a region like any other (path SH_PATH_VMM): it is evicted and
 * restored without its address changing. The VA stays the program's: the
 * pool never reserves nor frees it. Unmapped, a backing keeps its bytes
 * (on device chunks, or on host slabs if it was evicted), as a handle does.
 */
struct sh_backing;

/* A backing of size bytes (a multiple of the granularity) on device chunks.
 * SH_ENOMEM when the device has no room for it (the caller makes room
 * first); SH_EINVAL for a bad size. */
int sh_pool_backing_create(struct sh_pool *pool, size_t size, struct sh_backing **out);
/* Maps b at va, whole: a region from then on. SH_EBUSY if b is mapped
 * already; the map op's error when the driver refuses the address. */
int sh_pool_backing_map(struct sh_pool *pool, struct sh_backing *b, uintptr_t va);
/* Unmaps the backing's region starting at va (a move in flight is called
 * off first); the backing keeps its bytes, or is freed if no reference to
 * it is left. SH_ENOTFOUND if no backing is mapped at exactly va. */
int sh_pool_backing_unmap(struct sh_pool *pool, uintptr_t va);
/* The program drops a reference to b (its handle, or one retained): 1 when
 * it was the last (b is freed now, or by its unmap if mapped), 0 when
 * others are left, SH_EINVAL when none was left to drop. */
int sh_pool_backing_release(struct sh_pool *pool, struct sh_backing *b);
/* Another reference to the backing mapped at addr (any address inside),
 * or NULL when none is. */
struct sh_backing *sh_pool_backing_retain(struct sh_pool *pool, uintptr_t addr);
/* The backings mapped in [lo, hi): their starts and sizes go to va[] and
 * size[] (the first max of them, in address order); returns how many meet
 * the range. *other (may be NULL) is set to 1 when a region that is not a
 * backing meets it too. */
size_t sh_pool_backings_in(struct sh_pool *pool, uintptr_t lo, uintptr_t hi, uintptr_t *va,
                           size_t *size, size_t max, int *other);
size_t sh_pool_backing_size(const struct sh_backing *b);

/* ---- host slab pool ------------------------------------------------------ */

#define SH_HOSTPOOL_MAX_CLASSES 16

struct sh_slab {
    uint64_t handle;   /* host-located physical handle */
    uintptr_t staging; /* where it is mapped for copies and checksums */
    size_t size;
    int cls;
    struct sh_slab *next, *all_next;
};

/* A budget the pool shares with other pools (other devices' in the
 * process, other processes' through node/): asked before a slab is pinned,
 * told after one is unpinned. reserve returns 0, or non-zero when the
 * shared budget cannot spare the bytes now. When it refuses a slab a
 * caller waits for, reclaim (may be NULL) asks the other pools to give
 * back idle slabs (sh_hostpool_shed): non-zero when some came back, and
 * reserve is asked again. Slabs only kept ready are never reclaimed for,
 * so pools do not take idle slabs from each other back and forth. */
struct sh_hostpool_share {
    int (*reserve)(void *ctx, size_t bytes);
    void (*release)(void *ctx, size_t bytes);
    int (*reclaim)(void *ctx, size_t bytes);
    void *ctx;
};

struct sh_hostpool_params {
    size_t granularity;
    /* The driver maps a handle whole or not at all (a part is
     * CUDA_ERROR_NOT_SUPPORTED), so a chunk needs a slab of its own size.
     * Non-zero: the classes are the chunk sizes, chunk_max halved down to
     * the granularity, and each configured class gives its slabs to the
     * chunk size it rounds up to (one above chunk_max is dropped). Zero:
     * the configured classes as they are. */
    size_t chunk_max;
    size_t class_bytes[SH_HOSTPOOL_MAX_CLASSES]; /* increasing */
    unsigned slabs[SH_HOSTPOOL_MAX_CLASSES];     /* free slabs kept ready per class */
    unsigned nclasses;
    size_t ram_budget; /* pinned bytes never exceed this */
    size_t prepin;     /* pinned at create */
    int grow_in_background;
    /* Set: no growth towards the targets until sh_hostpool_wake (a slab a
     * caller waits for is pinned all the same). */
    int dormant;
    struct sh_hostpool_share share; /* reserve NULL: this process's budget only */
};

struct sh_hostpool_stats {
    size_t pinned_bytes, budget_bytes;
    unsigned nclasses;
    size_t class_bytes[SH_HOSTPOOL_MAX_CLASSES];
    unsigned class_total[SH_HOSTPOOL_MAX_CLASSES], class_free[SH_HOSTPOOL_MAX_CLASSES];
    uint64_t hits, fallbacks, misses, waits, grown; /* fallbacks: always 0 (whole maps only) */
    uint64_t refused;  /* slabs the shared budget would not let it pin */
    uint64_t shed;     /* bytes unpinned for other pools (sh_hostpool_shed) */
    uint64_t timeouts; /* waits that ended with no slab: pinning took longer */
};

struct sh_hostpool;

int sh_hostpool_create(const struct sh_hostpool_params *p, const struct sh_vmm_ops *vmm,
                       struct sh_hostpool **out);
void sh_hostpool_destroy(struct sh_hostpool *hp);
/* A slab of exactly bytes (never a larger one: it could not be mapped at a
 * chunk's address); when none is free, waits up to wait_ms for the
 * background grower. SH_ENOMEM when the RAM budget (or the shared one) is
 * spent; SH_EINVAL when no class has that size. */
int sh_hostpool_get(struct sh_hostpool *hp, size_t bytes, unsigned wait_ms, struct sh_slab **out);
void sh_hostpool_put(struct sh_hostpool *hp, struct sh_slab *s);
void sh_hostpool_stats(struct sh_hostpool *hp, struct sh_hostpool_stats *st);
/* The grower starts growing towards the targets (a dormant pool's). */
void sh_hostpool_wake(struct sh_hostpool *hp);
/* Unpins free slabs, smallest first, until at least bytes are given back
 * to the budget or none is free; returns the bytes given back. The pool
 * keeps its targets but grows towards them again only when a caller takes
 * a slab. */
size_t sh_hostpool_shed(struct sh_hostpool *hp, size_t bytes);

/* ---- moving regions between device and host (evict.c) --------------------- */

/* What eviction and restore need besides the pool. */
struct sh_pool_mover {
    struct sh_hostpool *host;
    struct sh_xfer *xfer;
    struct sh_gate *gate;
    int checksums; /* CRC32 each chunk at eviction, verify at restore */
    /* Compare both sides of every committed prefetch and early eviction
     * in its window, and report the bytes a commit would lose. */
    int verify_moves;
    /* Tests only: commit in-flight moves without the redo/drop rule, so
     * that the verifier has a lost write to catch. */
    int plant_lost_write;
    /* drain_mode = tracked: a window waits only for the streams that used
     * the regions it moves (bit i of the mask: stream slot i), instead of
     * the whole device. NULL: always drain the device. */
    int (*drain_streams)(void *ctx, uint64_t mask);
    /* With drain_streams: 1 when the work issued so far on the streams in
     * mask has finished (polls, never waits); what lets an early eviction
     * start without a full drain. NULL: never. */
    int (*streams_idle)(void *ctx, uint64_t mask);
    void *drain_ctx;
    /* 1 while a stream captures: a window's drain would break the capture,
     * so no window opens then. Asked with the gate closed (a capture's start
     * and end take every gate: none can begin meanwhile). NULL: never. */
    int (*capturing)(void);
    unsigned slab_wait_ms; /* how long to wait for the host pool to grow */
    /* Fills out[i] with the fingerprint (clean.h) of the device bytes at
     * addr[i], len[i]; 0, or an error. bus[dir] += the bytes it moved each
     * way (its results; once, its key), which count as copied. An early
     * eviction fingerprints its region before its copy and again in its
     * window, and commits only if they match: NULL (or failing), no early
     * eviction starts. Clean regions use it too. */
    int (*fingerprint)(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                       struct sh_clean_fp *out, uint64_t bus[2]);
    /* The same, queued on dir's copy stream ahead of the copies queued
     * after it, so that the caller does not wait for the kernel and the
     * copies read the bytes after it did: *ticket names the results, which
     * fingerprint_take waits for and hands over (out NULL: given up). 0, or
     * nothing was queued (the caller fingerprints now). Both NULL: never
     * queued; an early eviction then waits for its start's fingerprints. */
    int (*fingerprint_queue)(void *ctx, const uintptr_t *addr, const size_t *len, size_t n, int dir,
                             uint64_t *ticket, uint64_t bus[2]);
    int (*fingerprint_take)(void *ctx, uint64_t ticket, size_t n, struct sh_clean_fp *out);
    /* Sets found[i] to 1 when the device bytes at addr[i], len[i] hold a
     * 4-byte word that could be the high half of a pointer into [lo, hi)
     * (clean.h, stagehand_ptrs_v1), else 0; 0, or an error. bus as above.
     * Called in eviction windows: a region it finds nothing in is not
     * scanned on the CPU once its bytes land (ptrscan.c). NULL: every
     * evicted byte is scanned there. */
    int (*ptr_candidates)(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                          uintptr_t lo, uintptr_t hi, unsigned char *found, uint64_t bus[2]);
    void *fp_ctx;
    /* Other pools whose regions this pool's bytes may point into (one per
     * device, in one process): targets_bounds widens *lo, *hi to hold
     * theirs too, and targets_has says whether v lies in a region of one.
     * A pointer into them makes a region hold pointers as one into its own
     * pool does. NULL: this pool's regions only. */
    void (*targets_bounds)(void *ctx, uintptr_t *lo, uintptr_t *hi);
    int (*targets_has)(void *ctx, uintptr_t v);
    void *targets_ctx;
    /* [policy] clean_skip (keep.c): a restore keeps the host copy and its
     * fingerprint; an eviction that finds the bytes unchanged copies
     * nothing. Needs fingerprint. */
    int clean_skip;
};

/* Enables eviction. Until called, nothing moves. The pool never chooses
 * what to evict: its caller names the regions (the policy's victims). */
void sh_pool_set_mover(struct sh_pool *pool, const struct sh_pool_mover *m);
/* Evicts exactly the resident regions starting at vas[0..n) (the
 * scheduler's choice), in one remap window. The bases of those evicted go
 * to evicted[0..*nevicted) (room for n). SH_EBUSY when none of them can
 * move now (moving already, pinned, not resident, a slab, a stream
 * captures: mover.capturing); SH_ENOMEM when
 * those that could released nothing (the host side is exhausted). */
int sh_pool_evict_these(struct sh_pool *pool, const uintptr_t *vas, size_t n, size_t *released,
                        uintptr_t *evicted, size_t *nevicted);
/* What the pointers of one piece of work found (sh_pool_use). */
struct sh_pool_use {
    uintptr_t *bases; /* the caller's array, room for n: distinct regions, no slabs */
    void **regions;   /* NULL, or the caller's array, room for n: the regions of bases */
    size_t nbases;
    size_t host_bytes; /* device memory it takes to bring back those evicted */
    int ptrs;          /* one of them (slabs included) holds pointers */
    uint64_t gen;      /* the index's generation they were found in */
};
/* The launch path's one pass: keeps in vals[0..return) those of vals[0..n)
 * that point into a region (in order), records a use of those regions now
 * (now_us: CLOCK_MONOTONIC microseconds, for the monitor) and fills *u.
 * With u NULL it only keeps them (no use recorded). */
size_t sh_pool_use(struct sh_pool *pool, uintptr_t *vals, size_t n, uint64_t now_us,
                   struct sh_pool_use *u);
/* The distinct bases of the regions containing addrs[0..n), sub-allocator
 * slabs left out; returns the count (at most n). */
size_t sh_pool_bases(struct sh_pool *pool, const uintptr_t *addrs, size_t n, uintptr_t *bases);
/* The same; *ptrs (may be NULL) is set to 1 when one of the regions,
 * sub-allocator slabs included, holds pointers (sh_pool_find_pointers). */
size_t sh_pool_bases_ptrs(struct sh_pool *pool, const uintptr_t *addrs, size_t n, uintptr_t *bases,
                          int *ptrs);
/* Work using the regions starting at bases[0..n) is being issued; the
 * caller is inside the remap gate. Prefetches of those regions in flight
 * will redo their copies, and with drain_mode = tracked the regions
 * remember the streams in mask (0: none). */
void sh_pool_issued(struct sh_pool *pool, const uintptr_t *bases, size_t n, uint64_t streams);
/* The same for what sh_pool_use found (u->bases, u->regions, u->gen),
 * without looking the regions up again while the index is unchanged. */
void sh_pool_issued_found(struct sh_pool *pool, const uintptr_t *bases, void *const *regions,
                          size_t n, uint64_t gen, uint64_t streams);
/* Opaque work (accesses the library cannot bound) is being issued, inside
 * the gate, on the streams in mask: it counts as using every region, so
 * every prefetch in flight redoes its copy, every early eviction in flight
 * stays resident, and a tracked drain waits for those streams. Work using
 * a region that holds pointers is opaque (sh_pool_bases_ptrs tells). */
void sh_pool_issued_opaque(struct sh_pool *pool, uint64_t streams);
/* Work is being issued, inside the gate, on the streams in mask, whose
 * regions the caller does not name because nothing is moving: one stamp
 * for every region instead of a lookup for each (safe at any time, as
 * stamps only make moves cautious; cheap when no move is in flight). Not
 * counted as opaque. */
void sh_pool_issued_any(struct sh_pool *pool, uint64_t streams);
/* Holds the thread that scans evicted regions' bytes (paused 1), or lets
 * it go on: for tests of a region needed before its scan. */
void sh_pool_scan_pause(struct sh_pool *pool, int paused);
/* The n bytes at bytes are about to land at into (a host-to-device copy's
 * source): 1 if any 4-byte-aligned 8 bytes of them is an address inside a
 * region, and then the region containing into, if any, is marked as
 * holding pointers; else 0. */
size_t sh_pool_find_pointers(struct sh_pool *pool, const void *bytes, size_t n, uintptr_t into);
/* The region at into holds pointers that another pool's scan found (its
 * regions' addresses). */
void sh_pool_mark_pointers(struct sh_pool *pool, uintptr_t into);
/* Every region ever indexed lies in [*lo, *hi) (empty when *hi <= *lo): a
 * value outside points into none, without a lookup. */
void sh_pool_bounds(struct sh_pool *pool, uintptr_t *lo, uintptr_t *hi);
/* Records a use of the regions containing addrs[0..n) (a launch) and
 * returns, through *host_bytes, the device memory it takes to bring back
 * those of them that are evicted. */
void sh_pool_touch(struct sh_pool *pool, const uintptr_t *addrs, size_t n, size_t *host_bytes);
/* Brings the evicted regions containing addrs[0..n) back to the device. The
 * caller makes room first. SH_ENOMEM if device memory ran out; SH_EBUSY
 * when the caller holds the gate or a stream captures (they stay). */
int sh_pool_restore(struct sh_pool *pool, const uintptr_t *addrs, size_t n);
/* A move the driver failed both ways can leave a chunk's address unmapped
 * (its bytes kept on the handle that held them). sh_pool_heal maps such
 * holes again: 0 when none is left (at once when there never was one),
 * else SH_ELOST. sh_pool_hole_in: 1 if [lo, hi] (inclusive) meets one;
 * work that would must not be issued. */
int sh_pool_heal(struct sh_pool *pool);
/* Holes open in any pool of the process (atomic): while there is none, work
 * needs no look at the pools at all (the launch path's one load). */
extern size_t sh_pool_holes_open;
static inline int sh_pool_any_hole(void)
{
    return __atomic_load_n(&sh_pool_holes_open, __ATOMIC_ACQUIRE) != 0;
}
int sh_pool_hole_in(struct sh_pool *pool, uintptr_t lo, uintptr_t hi);

/* ---- prefetch: restores whose copy overlaps compute (evict.c) -------------
 *
 * sh_pool_prefetch_start: for each HOST region starting at vas[0..n) (the
 * caller made room), takes device chunks, maps them at a scratch address
 * and queues H2D copies slab -> scratch without waiting; the region stays
 * host-mapped at its own address and becomes RESTORING. The bases started
 * go to started[0..*nstarted) (room for n). Regions whose chunks, scratch
 * or copies cannot be had stay HOST. SH_EBUSY when the caller holds the
 * gate's read side.
 *
 * sh_pool_prefetch_commit: in one remap window, moves prefetched regions to
 * their device chunks: all of them (all != 0; the window waits for their
 * copies), or only those whose copies had finished when called. A region a
 * launch referenced since it went to the host (the launch may have written
 * the slab under the copy) is copied again from its slab inside the window.
 * Committed bases go to out[0..*nout) (at most max are committed); a region
 * that fails goes back to HOST with its bytes.
 *
 * sh_pool_prefetch_needed: how many regions containing addrs[0..n) have a
 * prefetch in flight (a launch needing them must commit first).
 * sh_pool_prefetch_ready: prefetches whose copies have finished; *inflight
 * (may be NULL) gets all prefetches not yet committed. */
int sh_pool_prefetch_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                           size_t *nstarted);
int sh_pool_prefetch_commit(struct sh_pool *pool, int all, uintptr_t *out, size_t max,
                            size_t *nout);
size_t sh_pool_prefetch_needed(struct sh_pool *pool, const uintptr_t *addrs, size_t n);
size_t sh_pool_prefetch_ready(struct sh_pool *pool, size_t *inflight);
/* Cancels every prefetch in flight (teardown); the regions stay HOST. */
void sh_pool_prefetch_cancel_all(struct sh_pool *pool);

/* ---- early eviction: evictions whose copy overlaps compute (evict.c) -------
 *
 * sh_pool_evict_start: for each RESIDENT region starting at vas[0..n) that
 * no unfinished work was issued against (none since the last window that
 * drained the device), takes host slabs and queues D2H copies into them
 * without waiting; the region stays on its device chunks, EVICTING, and
 * launches keep using it. The bases started go to started[0..*nstarted).
 *
 * sh_pool_evict_drain: when one of them is RESIDENT but cannot start for
 * work issued since the last drain, drains the whole device as a window
 * would (gate closed; the copies on the link are waited for too), so that
 * sh_pool_evict_start can start it now; 1 when it drained. Nothing
 * happens under the tracked drain (whose early evictions ask the streams),
 * inside a gate, or while a stream captures (the mover's capturing).
 *
 * sh_pool_evict_commit: in one remap window, maps the slabs of early
 * evictions at their addresses and releases their device chunks: all of
 * them (all != 0; the window waits for their copies) or those whose copies
 * had finished. A region that work was issued against since its copy began
 * is left RESIDENT instead (the copy may be stale; nothing is redone).
 * Committed bases go to out[0..*nout), abandoned ones to back[0..*nback)
 * (each at most max); *released gets the device bytes freed.
 *
 * sh_pool_evict_ready: early evictions whose copies have finished;
 * *inflight (may be NULL) gets all of them not yet committed.
 *
 * They rely on the issue stamps (sh_pool_issued, sh_pool_issued_opaque): a
 * kernel that writes a region through a pointer the library saw neither in
 * its parameters nor in the bytes it copied to the device, while its copy
 * runs, is not noticed (verify_moves reports it). */
int sh_pool_evict_start(struct sh_pool *pool, const uintptr_t *vas, size_t n, uintptr_t *started,
                        size_t *nstarted);
int sh_pool_evict_drain(struct sh_pool *pool, const uintptr_t *vas, size_t n);
int sh_pool_evict_commit(struct sh_pool *pool, int all, uintptr_t *out, uintptr_t *back, size_t max,
                         size_t *nout, size_t *nback, size_t *released);
size_t sh_pool_evict_ready(struct sh_pool *pool, size_t *inflight);
/* 1 while a prefetch or an early eviction is in flight (a hint: read
 * without a lock); 0 says both of the above would find none. */
int sh_pool_moving(const struct sh_pool *pool);
/* Cancels every early eviction in flight (teardown); the regions stay RESIDENT. */
void sh_pool_evict_cancel_all(struct sh_pool *pool);

/* ---- reporting (report.c) ---------------------------------------------------- */

struct sh_pool_region_report {
    uintptr_t va;
    size_t size, mapped;
    uint64_t id, last_use_us;
    uint64_t last_use; /* the pool's clock at its last use: an order, unlike the time */
    uint32_t evictions, restores;
    int state;
};

/* The largest live (not freed) regions, sub-allocator slabs left out, in no
 * particular order; returns how many were written (at most max). */
size_t sh_pool_regions(struct sh_pool *pool, struct sh_pool_region_report *out, size_t max);

/* The chunk sizes a region of `mapped` bytes is split into: greedy powers of
 * two, largest first, none above max_chunk. Returns the count (<= max). */
unsigned sh_pool_split(size_t mapped, size_t granularity, size_t max_chunk, size_t *chunks,
                       unsigned max);

#endif
