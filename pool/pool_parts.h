/* pool_parts.h — building blocks of the region registry (internal to pool/).
 *
 *   rindex      address -> region lookup (balanced interval tree)
 *   state       residency state machine with loud invalid transitions
 *   vaarena     cached VA reservations carved into region-sized ranges
 *   chunkcache  released device chunk handles kept for reuse, by size
 *   suballoc    small blocks carved from slabs, stream-ordered frees
 *
 * The CUDA driver is reached only through struct sh_vmm_ops, so everything
 * here runs (and is tested) without a GPU. Each part says below whether it
 * locks for itself; those that do never hold their lock across an ops call
 * that may take long (reserve, create, slab_get).
 */
#ifndef SH_POOL_PARTS_H
#define SH_POOL_PARTS_H

#include <stddef.h>
#include <stdint.h>

/* ---- VMM backend ----------------------------------------------------------
 * Implemented over the CUDA driver elsewhere; tests supply fakes. Every call
 * returns 0 or a negative SH_E* code. Handles are opaque 64-bit values.
 */
enum sh_loc { SH_LOC_DEVICE = 0, SH_LOC_HOST = 1 };

struct sh_vmm_ops {
    void *ctx;
    int (*reserve)(void *ctx, size_t size, size_t align, uintptr_t *va); /* cuMemAddressReserve */
    int (*unreserve)(void *ctx, uintptr_t va, size_t size);              /* cuMemAddressFree */
    int (*create)(void *ctx, size_t size, int loc, uint64_t *handle);    /* cuMemCreate */
    int (*release)(void *ctx, uint64_t handle);                          /* cuMemRelease */
    int (*map)(void *ctx, uintptr_t va, size_t size, uint64_t handle);   /* cuMemMap + access */
    int (*unmap)(void *ctx, uintptr_t va, size_t size);                  /* cuMemUnmap */
    /* map, and the CPU may read and write there too (a host-located handle
     * at a slab's staging address); NULL where map already allows it. */
    int (*map_host)(void *ctx, uintptr_t va, size_t size, uint64_t handle);
};

/* ---- rindex: non-overlapping intervals [start, start+len) -> payload ------
 * An AVL tree whose nodes live in one array recycled through a free list, so
 * steady-state insert/remove does not allocate. NOT thread-safe: the registry
 * holds a rwlock around it (read side for lookup/find/foreach/count, write
 * side for insert/remove/reserve). Lookups never modify the tree.
 */
struct sh_rindex;

/* Called in address order; a nonzero return stops the walk and is returned.
 * It must not insert into or remove from the index it walks. */
typedef int (*sh_rindex_visit_fn)(void *arg, uintptr_t start, size_t len, void *payload);

int sh_rindex_create(struct sh_rindex **out);
void sh_rindex_destroy(struct sh_rindex *ri);
/* SH_EINVAL if len is 0, the interval wraps, or it overlaps one present. */
int sh_rindex_insert(struct sh_rindex *ri, uintptr_t start, size_t len, void *payload);
/* Removes the interval starting exactly at start; SH_ENOTFOUND otherwise.
 * payload may be NULL. */
int sh_rindex_remove(struct sh_rindex *ri, uintptr_t start, void **payload);
/* Payload of the interval containing addr (any interior address), or NULL. */
void *sh_rindex_lookup(const struct sh_rindex *ri, uintptr_t addr);
/* Like lookup, also giving the interval; SH_ENOTFOUND if none contains addr.
 * Any out-parameter may be NULL. */
int sh_rindex_find(const struct sh_rindex *ri, uintptr_t addr, uintptr_t *start, size_t *len,
                   void **payload);
size_t sh_rindex_count(const struct sh_rindex *ri);
/* Changes with every insert and remove, and is never the same for two
 * indices (nor 0): a lookup remembered with it holds while it is unchanged. */
uint64_t sh_rindex_gen(const struct sh_rindex *ri);
int sh_rindex_foreach(const struct sh_rindex *ri, sh_rindex_visit_fn fn, void *arg);
/* Ensures the next n inserts cannot fail with SH_ENOMEM. */
int sh_rindex_reserve(struct sh_rindex *ri, size_t n);
/* Checks ordering, overlap, AVL balance and counts; 0 or SH_EINVAL (tests). */
int sh_rindex_validate(const struct sh_rindex *ri);

/* ---- state: residency of one region ----------------------------------------
 * RESIDENT  -> EVICTING   eviction starts (device -> host copy in flight)
 * EVICTING  -> HOST       copy done, chunks remapped to host slabs
 * EVICTING  -> RESIDENT   eviction aborted
 * HOST      -> RESTORING  restore starts (host -> scratch device chunks)
 * RESTORING -> RESIDENT   committed: device chunks mapped at the region VA
 * RESTORING -> HOST       restore aborted
 * RESIDENT, HOST -> FREED freed by the program, backing kept for reuse
 * FREED     -> RESIDENT   reused;  FREED -> DEAD  torn down
 * Any other move is a bug: it is refused, logged loudly and SH_ESTATE.
 */
enum sh_rstate {
    SH_RS_RESIDENT = 0,
    SH_RS_EVICTING = 1,
    SH_RS_HOST = 2,
    SH_RS_RESTORING = 3,
    SH_RS_FREED = 4,
    SH_RS_DEAD = 5,
    SH_RS_COUNT = 6
};

/* "RESIDENT", ... ; "INVALID" for values outside the enum. */
const char *sh_state_name(int state);
/* 1 if from -> to is one of the transitions above, else 0. */
int sh_state_valid(int from, int to);
/* Atomic read of a state word that other threads may move. */
int sh_state_get(const int *state);
/* Atomically moves *state to `to` from whatever it holds now. If that move is
 * invalid, *state is left unchanged, one "bug: region ID: invalid transition
 * A -> B" line is logged and SH_ESTATE returned. */
int sh_state_move(int *state, int to, uint64_t region_id);
/* Compare-and-swap: moves from `from` to `to` only if *state still holds
 * `from`; SH_EBUSY (quietly) if another thread moved it first. An invalid
 * (from, to) pair is reported like sh_state_move. */
int sh_state_move_from(int *state, int from, int to, uint64_t region_id);

/* ---- vaarena: VA ranges carved from large cached reservations ---------------
 * Thread-safe (one internal mutex). Sizes are multiples of the granularity;
 * alignments powers of two (0 means the granularity). Blocks of block_bytes
 * (or the request, if larger) are reserved on demand; a block that becomes
 * wholly free is unreserved only while the cached free VA exceeds cache_limit.
 */
struct sh_vaarena;

struct sh_vaarena_stats {
    size_t reserved_bytes; /* all live reservations */
    size_t in_use_bytes;   /* handed out and not yet freed */
    size_t blocks;         /* live reservations */
    size_t free_ranges;    /* cached holes, after coalescing */
    uint64_t reserve_calls;
    uint64_t unreserve_calls;
};

/* block_bytes 0 means 1 GiB; it is rounded up to the granularity. */
int sh_vaarena_create(const struct sh_vmm_ops *ops, size_t granularity, size_t block_bytes,
                      size_t cache_limit, struct sh_vaarena **out);
/* Unreserves every block, including ranges still handed out. */
void sh_vaarena_destroy(struct sh_vaarena *a);
int sh_vaarena_alloc(struct sh_vaarena *a, size_t size, size_t align, uintptr_t *va);
/* (va, size) must be exactly a live allocation; SH_EINVAL otherwise. */
int sh_vaarena_free(struct sh_vaarena *a, uintptr_t va, size_t size);
/* Unreserves every wholly free block regardless of cache_limit; bytes freed. */
size_t sh_vaarena_trim(struct sh_vaarena *a);
void sh_vaarena_stats(struct sh_vaarena *a, struct sh_vaarena_stats *st);

/* ---- chunkcache: released device handles kept by chunk size -----------------
 * Thread-safe (one internal mutex). Chunk sizes are powers of two >= the
 * granularity. device_bytes counts every handle created through the cache and
 * not yet released: cached plus handed out.
 */
/* A figure written under its lock and read without one (each launch's
 * planning reads it): written with relaxed atomic stores. */
static inline void sh_bytes_add(size_t *x, size_t d)
{
    __atomic_store_n(x, *x + d, __ATOMIC_RELAXED);
}
static inline void sh_bytes_sub(size_t *x, size_t d)
{
    __atomic_store_n(x, *x - d, __ATOMIC_RELAXED);
}

struct sh_chunkcache;

struct sh_chunkcache_stats {
    size_t cached_bytes;
    size_t cached_handles;
    size_t device_bytes;
    uint64_t hits;
    uint64_t misses;
    uint64_t creates;
    uint64_t releases;
};

int sh_chunkcache_create(const struct sh_vmm_ops *ops, size_t granularity, size_t cache_limit,
                         struct sh_chunkcache **out);
/* Releases every cached handle; handles still out are the caller's. */
void sh_chunkcache_destroy(struct sh_chunkcache *cc);
/* A cached handle of exactly chunk_size, or a new one from ops->create. */
int sh_chunkcache_get(struct sh_chunkcache *cc, size_t chunk_size, uint64_t *handle);
/* Caches the handle while cached bytes stay <= cache_limit, else releases it. */
int sh_chunkcache_put(struct sh_chunkcache *cc, uint64_t handle, size_t chunk_size);
/* Releases the handle now, never caching it (someone else still holds it). */
int sh_chunkcache_drop(struct sh_chunkcache *cc, uint64_t handle, size_t chunk_size);
/* Releases cached handles until at least `bytes` are freed (or none is left),
 * overshooting as little as it can; returns the bytes freed. */
size_t sh_chunkcache_trim(struct sh_chunkcache *cc, size_t bytes);
void sh_chunkcache_stats(struct sh_chunkcache *cc, struct sh_chunkcache_stats *st);
/* The device bytes held, alone: what every launch's planning reads. */
size_t sh_chunkcache_device_bytes(struct sh_chunkcache *cc);

/* ---- suballoc: small blocks with stream-ordered frees ------------------------
 * Sizes 1..max_block go to power-of-two classes from 512 B; blocks are carved
 * from slabs obtained through slab_get. A block freed on stream S with fence F
 * is reused at once by an allocation on S, by other streams only once
 * fence_done(F) is true; fence 0 means already complete.
 *
 * Thread-safe (one internal mutex). fence_done and fence_drop are called with
 * that mutex held: they must be quick, non-blocking (cuEventQuery,
 * cuEventDestroy) and must not call back into the sub-allocator. slab_get and
 * slab_put are called without it.
 */
struct sh_suballoc;

struct sh_suballoc_ops {
    void *ctx;
    int (*slab_get)(void *ctx, size_t slab_bytes, uintptr_t *base);
    void (*slab_put)(void *ctx, uintptr_t base, size_t slab_bytes);
    /* 1 once the work ordered before the fence is done, else 0. */
    int (*fence_done)(void *ctx, uint64_t fence);
    /* Optional: called exactly once for each nonzero fence given to free,
     * when the sub-allocator no longer needs it (the caller may then recycle
     * the event behind it). */
    void (*fence_drop)(void *ctx, uint64_t fence);
};

struct sh_suballoc_config {
    size_t max_block;    /* largest size served, power of two >= 512; 0: 1 MiB */
    size_t slab_bytes;   /* slab size; a class gets at least 2 blocks; 0: 2 MiB */
    unsigned keep_empty; /* empty slabs kept per class before slab_put, as given */
};

struct sh_suballoc_stats {
    size_t slabs;
    size_t slab_bytes;    /* sum of live slab sizes */
    size_t used_bytes;    /* blocks handed out */
    size_t pending_bytes; /* freed, waiting on a fence */
    uint64_t allocs;
    uint64_t frees;
    uint64_t same_stream_reuse;
    uint64_t slab_gets;
    uint64_t slab_puts;
};

/* cfg NULL means max_block 1 MiB, slab_bytes 2 MiB, keep_empty 1. */
int sh_suballoc_create(const struct sh_suballoc_ops *ops, const struct sh_suballoc_config *cfg,
                       struct sh_suballoc **out);
/* Drops every pending fence and returns every slab, blocks in use or not. */
void sh_suballoc_destroy(struct sh_suballoc *sa);
/* SH_EINVAL for size 0 or > max_block; SH_ENOMEM (or slab_get's error) if no
 * slab could be had. */
int sh_suballoc_alloc(struct sh_suballoc *sa, size_t size, uint64_t stream, uintptr_t *ptr);
/* SH_ENOTFOUND if ptr is in no slab; SH_EINVAL if it is not the start of a
 * block in use (interior pointer, double free). */
int sh_suballoc_free(struct sh_suballoc *sa, uintptr_t ptr, uint64_t stream, uint64_t fence);
/* The same, telling the freed block's class size (may be NULL). */
int sh_suballoc_free_sized(struct sh_suballoc *sa, uintptr_t ptr, uint64_t stream, uint64_t fence,
                           size_t *bytes);
/* The class size an allocation of size bytes gets; 0 if none would serve it. */
size_t sh_suballoc_class_bytes(const struct sh_suballoc *sa, size_t size);
/* 1 if ptr lies inside one of the slabs, else 0. */
int sh_suballoc_owns(struct sh_suballoc *sa, uintptr_t ptr);
/* Class size of the block in use starting at ptr; errors as for free. */
int sh_suballoc_block_size(struct sh_suballoc *sa, uintptr_t ptr, size_t *size);
/* The block in use that contains ptr (interior pointers too); SH_ENOTFOUND
 * if none. */
int sh_suballoc_block_of(struct sh_suballoc *sa, uintptr_t ptr, uintptr_t *base, size_t *size);
/* Polls every pending fence and returns every empty slab; bytes returned. */
size_t sh_suballoc_trim(struct sh_suballoc *sa);
void sh_suballoc_stats(struct sh_suballoc *sa, struct sh_suballoc_stats *st);

#endif
