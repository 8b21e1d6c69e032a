/* mempool.c — the device's memory pool as the program sees it.
 *
 * cudaMallocAsync draws from the device's current pool (its default pool
 * unless the program chose another), so the library's stream-ordered
 * allocations are that pool's. PyTorch's cudaMallocAsync backend reads the
 * default pool's attributes for memory_allocated/reserved and their peaks,
 * resets the peaks by setting them to zero, and trims the pool for
 * empty_cache. For that pool the attributes add the library's figures
 * (pool/usage.c) to the driver's own, a reset resets both, and a trim
 * releases the library's cache before the driver's; every other pool
 * passes through.
 *
 * Shared state: the real entry points, resolved once (atomics); the
 * default pool's handle, found once. The depth is per thread: the
 * runtime's calls reach the driver's entry points, which must then pass
 * through.
 */
#include "interpose/intercept.h"

#include "sh_log.h"

#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

typedef CUresult (*drv_attr_fn)(CUmemoryPool, CUmemPool_attribute, void *);
typedef CUresult (*drv_trim_fn)(CUmemoryPool, size_t);
typedef CUresult (*drv_pool_fn)(CUmemoryPool *, CUdevice);
typedef cudaError_t (*rt_attr_fn)(cudaMemPool_t, enum cudaMemPoolAttr, void *);
typedef cudaError_t (*rt_trim_fn)(cudaMemPool_t, size_t);

static struct {
    drv_attr_fn cu_get, cu_set;
    drv_trim_fn cu_trim;
    drv_pool_fn cu_current;
    rt_attr_fn rt_get, rt_set;
    rt_trim_fn rt_trim;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static _Thread_local int depth;

static void resolve(void)
{
    real.cu_get = (drv_attr_fn)sh_icept_lookup(0, "cuMemPoolGetAttribute");
    real.cu_set = (drv_attr_fn)sh_icept_lookup(0, "cuMemPoolSetAttribute");
    real.cu_trim = (drv_trim_fn)sh_icept_lookup(0, "cuMemPoolTrimTo");
    real.cu_current = (drv_pool_fn)sh_icept_lookup(0, "cuDeviceGetMemPool");
    real.rt_get = (rt_attr_fn)sh_icept_lookup(1, "cudaMemPoolGetAttribute");
    real.rt_set = (rt_attr_fn)sh_icept_lookup(1, "cudaMemPoolSetAttribute");
    real.rt_trim = (rt_trim_fn)sh_icept_lookup(1, "cudaMemPoolTrimTo");
}

/* The managed device whose pool cudaMallocAsync draws from is pool (the
 * library makes its allocations), or NULL. Never starts the library. */
static struct sh_dev *ours(CUmemoryPool pool)
{
    if (!pool || depth != 1 || !sh_active() || !real.cu_current)
        return NULL;
    for (int i = 0; i < atomic_load(&sh_rt.ndevs); i++) {
        CUmemoryPool cur = NULL;
        if (real.cu_current(&cur, sh_rt.devs[i]->dev) == CUDA_SUCCESS && cur == pool)
            return sh_rt.devs[i];
    }
    return NULL;
}

/* The memory figures, in the attributes' order. */
static int figure(int attr)
{
    return attr >= CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

/* After the real call filled *value: adds the library's share. */
static void add_ours(CUmemoryPool pool, int attr, void *value)
{
    struct sh_dev *d = figure(attr) ? ours(pool) : NULL;
    if (!d)
        return;
    struct sh_pool_usage u;
    sh_pool_usage(d->pool, &u);
    const size_t fig[] = {u.reserved, u.reserved_high, u.used, u.used_high};
    *(cuuint64_t *)value += fig[attr - CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT];
}

/* After the real call accepted a reset (the value was zero): the
 * library's peak restarts at its figure now too. */
static void reset_ours(CUmemoryPool pool, int attr)
{
    struct sh_dev *d = NULL;
    if ((attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) &&
        (d = ours(pool)))
        sh_pool_usage_reset(d->pool, attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH);
}

/* Releases the library's cache as far as a trim to keep bytes asks (what
 * allocations use cannot go); returns what the driver's share may keep. */
static size_t trim_ours(CUmemoryPool pool, size_t keep)
{
    struct sh_dev *d = ours(pool);
    if (!d)
        return keep;
    struct sh_pool_usage u;
    sh_pool_usage(d->pool, &u);
    if (u.reserved > keep && u.cached > 0) {
        size_t want = u.reserved - keep < u.cached ? u.reserved - keep : u.cached;
        size_t got = sh_pool_release(d->pool, want);
        sh_log(SH_LOG_INFO, "memory pool trimmed: %zu MB of device memory kept for reuse released",
               got >> 20);
        sh_pool_usage(d->pool, &u);
    }
    return keep > u.reserved ? keep - u.reserved : 0;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    pthread_once(&real_once, resolve);
    if (!real.cu_get)
        return CUDA_ERROR_NOT_INITIALIZED;
    depth++;
    CUresult r = real.cu_get(pool, attr, value);
    if (r == CUDA_SUCCESS)
        add_ours(pool, attr, value);
    depth--;
    return r;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    pthread_once(&real_once, resolve);
    if (!real.cu_set)
        return CUDA_ERROR_NOT_INITIALIZED;
    depth++;
    CUresult r = real.cu_set(pool, attr, value);
    if (r == CUDA_SUCCESS)
        reset_ours(pool, attr);
    depth--;
    return r;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    pthread_once(&real_once, resolve);
    if (!real.cu_trim)
        return CUDA_ERROR_NOT_INITIALIZED;
    depth++;
    CUresult r = real.cu_trim(pool, trim_ours(pool, minBytesToKeep));
    depth--;
    return r;
}

/* cudaMemPoolAttr shares CUmemPool_attribute's values. */
EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                           void *value)
{
    pthread_once(&real_once, resolve);
    if (!real.rt_get)
        return cudaErrorSymbolNotFound;
    depth++;
    cudaError_t e = real.rt_get(pool, attr, value);
    if (e == cudaSuccess)
        add_ours((CUmemoryPool)pool, (int)attr, value);
    depth--;
    return e;
}

EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                           void *value)
{
    pthread_once(&real_once, resolve);
    if (!real.rt_set)
        return cudaErrorSymbolNotFound;
    depth++;
    cudaError_t e = real.rt_set(pool, attr, value);
    if (e == cudaSuccess)
        reset_ours((CUmemoryPool)pool, (int)attr);
    depth--;
    return e;
}

EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep)
{
    pthread_once(&real_once, resolve);
    if (!real.rt_trim)
        return cudaErrorSymbolNotFound;
    depth++;
    size_t keep = trim_ours((CUmemoryPool)pool, minBytesToKeep);
    cudaError_t e = real.rt_trim(pool, keep);
    depth--;
    return e;
}
