/* usage.c — what the stream-ordered paths (cudaMallocAsync, the pluggable
 * allocator) hold, in a memory pool's terms: used, cached for reuse, and
 * their peaks. interpose/mempool.c reports them as the CUDA default pool's
 * figures, which PyTorch's cudaMallocAsync backend reads, and trims the
 * cache when the program trims that pool.
 *
 * Locking: usage_used and the peaks are atomics in struct sh_pool. The
 * cached figure reads pool->mu, the chunk cache's lock and the
 * sub-allocator's, one at a time, so add and sub are called with no pool
 * lock held.
 */
#include "pool/region_int.h"

#include <stdint.h>

/* Raises *peak to v unless it is already at least v; 1 if it rose. */
static int raise_peak(size_t *peak, size_t v)
{
    size_t old = __atomic_load_n(peak, __ATOMIC_RELAXED);
    while (old < v)
        if (__atomic_compare_exchange_n(peak, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return 1;
    return 0;
}

/* Device memory kept for reuse: freed regions, spare chunks, free blocks. */
static size_t cached(struct sh_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    size_t freed = pool->st.freed_bytes;
    pthread_mutex_unlock(&pool->mu);
    struct sh_chunkcache_stats cs;
    sh_chunkcache_stats(pool->cc, &cs);
    size_t free_blocks = 0;
    if (pool->sa) {
        struct sh_suballoc_stats ss;
        sh_suballoc_stats(pool->sa, &ss);
        free_blocks = ss.slab_bytes - ss.used_bytes;
    }
    return freed + cs.cached_bytes + free_blocks;
}

/* The reserved figure now; raises its peak. */
static size_t reserved_now(struct sh_pool *pool, size_t *cache)
{
    *cache = cached(pool);
    size_t r = __atomic_load_n(&pool->usage_used, __ATOMIC_RELAXED) + *cache;
    raise_peak(&pool->usage_reserved_high, r);
    return r;
}

void sh_pool_usage_add(struct sh_pool *pool, size_t bytes)
{
    size_t used = __atomic_add_fetch(&pool->usage_used, bytes, __ATOMIC_RELAXED);
    size_t cache;
    /* Reserved grows as used does, past what the cache held: sampling it at
     * each new peak of used catches its own peaks. */
    if (raise_peak(&pool->usage_used_high, used))
        reserved_now(pool, &cache);
}

void sh_pool_usage_sub(struct sh_pool *pool, size_t bytes)
{
    __atomic_sub_fetch(&pool->usage_used, bytes, __ATOMIC_RELAXED);
}

void sh_pool_usage(struct sh_pool *pool, struct sh_pool_usage *out)
{
    out->reserved = reserved_now(pool, &out->cached);
    out->used = out->reserved - out->cached;
    out->used_high = __atomic_load_n(&pool->usage_used_high, __ATOMIC_RELAXED);
    out->reserved_high = __atomic_load_n(&pool->usage_reserved_high, __ATOMIC_RELAXED);
}

void sh_pool_usage_reset(struct sh_pool *pool, int used)
{
    size_t cache;
    if (used)
        __atomic_store_n(&pool->usage_used_high,
                         __atomic_load_n(&pool->usage_used, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    else
        __atomic_store_n(&pool->usage_reserved_high, 0, __ATOMIC_RELAXED);
    reserved_now(pool, &cache); /* the reserved peak restarts at the figure now */
}

size_t sh_pool_release(struct sh_pool *pool, size_t bytes)
{
    size_t done = sh_pool_trim(pool, bytes);
    if (done < bytes && pool->sa) {
        sh_suballoc_trim(pool->sa); /* empty slabs become freed regions */
        done += sh_pool_trim(pool, bytes - done);
    }
    return done;
}
