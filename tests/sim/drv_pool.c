/* drv_pool.c — stream-ordered memory pools: the device's default pool,
 * pools the program creates, the device's current pool, and their
 * attributes, as cuda.h documents them.
 *
 * What the simulator does not model: a pool keeps no freed memory back (a
 * free returns it at once, as if the release threshold were always
 * exceeded at the next synchronisation), so reserved bytes are the used
 * bytes and cuMemPoolTrimTo has nothing to release; only device-located,
 * non-exportable pools exist (others are refused, loudly).
 *
 * Locking: pool_mu guards the registry, the current pool and every pool's
 * fields; it is taken after drv_mem.c's mem_mu, never before.
 */
#include "sim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct sim_pool {
    struct sim_pool *next;
    bool alive, is_default;
    uint64_t used, used_high, reserved_high, release_threshold;
    int reuse[3]; /* the three CU_MEMPOOL_ATTR_REUSE_* flags, from 1 */
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_pool default_pool = {.alive = true, .is_default = true, .reuse = {1, 1, 1}};
static struct sim_pool *pools = &default_pool; /* every pool made; dead ones stay listed */
static struct sim_pool *current = &default_pool;

/* pool_mu held */
static struct sim_pool *find(CUmemoryPool h)
{
    for (struct sim_pool *p = pools; p; p = p->next)
        if ((CUmemoryPool)p == h && p->alive)
            return p;
    return NULL;
}

struct sim_pool *sim_pool_get(CUmemoryPool h)
{
    pthread_mutex_lock(&pool_mu);
    struct sim_pool *p = find(h);
    pthread_mutex_unlock(&pool_mu);
    return p;
}

struct sim_pool *sim_pool_current(void)
{
    pthread_mutex_lock(&pool_mu);
    struct sim_pool *p = current;
    pthread_mutex_unlock(&pool_mu);
    return p;
}

/* A destroyed pool still takes back what was allocated from it. */
void sim_pool_charge(struct sim_pool *p, size_t bytes, bool add)
{
    pthread_mutex_lock(&pool_mu);
    p->used = add ? p->used + bytes : p->used - bytes;
    if (p->used > p->used_high)
        p->used_high = p->used;
    if (p->used > p->reserved_high) /* reserved is used: nothing is kept back */
        p->reserved_high = p->used;
    pthread_mutex_unlock(&pool_mu);
}

static CUresult check_device(CUdevice dev)
{
    return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CUresult r = sim_enter(__func__, false);
    if (r || (r = check_device(dev)))
        return r;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    *pool_out = (CUmemoryPool)&default_pool;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult r = sim_enter(__func__, false);
    if (r || (r = check_device(dev)))
        return r;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)sim_pool_current();
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult r = sim_enter(__func__, false);
    if (r || (r = check_device(dev)))
        return r;
    pthread_mutex_lock(&pool_mu);
    struct sim_pool *p = find(pool);
    if (p)
        current = p;
    pthread_mutex_unlock(&pool_mu);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Pool properties the simulator offers: pinned device memory on device 0,
 * no exportable handles; the reserved bytes zero as cuda.h requires. */
static CUresult check_props(const CUmemPoolProps *p)
{
    static const unsigned char zero[sizeof p->reserved];
    if (!p || p->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || p->win32SecurityAttributes ||
        memcmp(p->reserved, zero, sizeof zero) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return (CUresult)sim_refuse_driver("cuMemPoolCreate (a pool not on the device)",
                                           CUDA_ERROR_NOT_SUPPORTED);
    if (p->location.id != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (p->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return (CUresult)sim_refuse_driver("cuMemPoolCreate (exportable handles)",
                                           CUDA_ERROR_NOT_SUPPORTED);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_props(poolProps)))
        return r;
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct sim_pool){.alive = true, .reuse = {1, 1, 1}};
    pthread_mutex_lock(&pool_mu);
    p->next = pools;
    pools = p;
    pthread_mutex_unlock(&pool_mu);
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* "A device's default memory pool cannot be destroyed"; a device whose
 * current pool goes back to its default one. Allocations still out are
 * released when freed. */
SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    pthread_mutex_lock(&pool_mu);
    struct sim_pool *p = find(pool);
    bool ok = p && !p->is_default;
    if (ok) {
        p->alive = false;
        if (current == p)
            current = &default_pool;
    }
    pthread_mutex_unlock(&pool_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* One attribute of p (pool_mu held); value as cuda.h types it. */
static CUresult get_attr(const struct sim_pool *p, CUmemPool_attribute attr, void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = p->release_threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = p->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = p->reserved_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = p->used_high;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* The high watermarks can only be reset, to zero, which "resets [them] to
 * the current value"; the current figures cannot be set at all. */
static CUresult set_attr(struct sim_pool *p, CUmemPool_attribute attr, const void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(const int *)value != 0;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        p->release_threshold = *(const cuuint64_t *)value;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(const cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            p->reserved_high = p->used;
        else
            p->used_high = p->used;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    const struct sim_pool *p = find(pool);
    r = p ? get_attr(p, attr, value) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pool_mu);
    return r;
}

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    struct sim_pool *p = find(pool);
    r = p ? set_attr(p, attr, value) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pool_mu);
    return r;
}

/* Nothing is kept back beyond what allocations use, and that cannot be
 * released: a valid pool is already trimmed. */
SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    (void)minBytesToKeep;
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    return sim_pool_get(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
