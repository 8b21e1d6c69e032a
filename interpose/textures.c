/* textures.c — texture objects over linear memory (cudaCreateTextureObject,
 * cuTexObjectCreate, and their Destroy calls).
 *
 * A kernel reads through an object's handle, which is no pointer: the
 * launch scan would miss the memory under it, and with a tracked drain a
 * move of that memory would not wait for the kernel. Each object over
 * linear or pitched memory is kept here by handle; a launch parameter
 * equal to a live handle counts as its range's two ends (launch.c). An
 * object over a CUDA array touches no region. Once one could not be kept
 * (no memory), every value may be a handle: launches are opaque.
 *
 * Shared state: the objects under an rwlock; their count is an atomic, so
 * a program that makes none pays one load per launch scan.
 */
#include "interpose/intercept.h"

#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

struct tex {
    uint64_t handle;
    uintptr_t lo, hi; /* [lo, hi) */
};

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct tex *texs;
static size_t ntex, cap;
static size_t count; /* ntex, read without the lock */
/* Atomics: every handle ever kept lies in [min_h, max_h], so the scan's
 * other words (every one of every launch) are turned away unlocked. */
static uint64_t min_h = UINT64_MAX, max_h;
static int lost; /* atomic: an object could not be kept */

/* The slot of handle h, or ntex; lock held. */
static size_t slot_of(uint64_t h)
{
    size_t i = 0;
    while (i < ntex && texs[i].handle != h)
        i++;
    return i;
}

static void add(uint64_t h, uintptr_t lo, size_t n)
{
    if (!h || !lo || !n)
        return;
    pthread_rwlock_wrlock(&lock);
    size_t i = slot_of(h); /* the runtime's call and the driver's under it */
    if (i == ntex && ntex == cap) {
        size_t c = cap ? 2 * cap : 16;
        struct tex *t = realloc(texs, c * sizeof *t);
        if (t) {
            texs = t;
            cap = c;
        }
    }
    if (i < cap) {
        if (h < __atomic_load_n(&min_h, __ATOMIC_RELAXED))
            __atomic_store_n(&min_h, h, __ATOMIC_RELAXED);
        if (h > __atomic_load_n(&max_h, __ATOMIC_RELAXED))
            __atomic_store_n(&max_h, h, __ATOMIC_RELAXED);
        texs[i] = (struct tex){h, lo, lo + n};
        ntex += i == ntex;
        __atomic_store_n(&count, ntex, __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&lock);
    if (i >= cap && !__atomic_exchange_n(&lost, 1, __ATOMIC_RELEASE))
        sh_log(SH_LOG_WARN, "out of memory keeping a texture object: from now on every launch "
                            "counts as touching every region (slower, safe)");
}

static void del(uint64_t h)
{
    pthread_rwlock_wrlock(&lock);
    size_t i = slot_of(h);
    if (i < ntex) {
        texs[i] = texs[--ntex];
        __atomic_store_n(&count, ntex, __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&lock);
}

int sh_textures_any(void)
{
    return __atomic_load_n(&count, __ATOMIC_ACQUIRE) != 0 ||
           __atomic_load_n(&lost, __ATOMIC_ACQUIRE);
}

int sh_textures_range(uint64_t v, uintptr_t *lo, uintptr_t *hi)
{
    if (__atomic_load_n(&lost, __ATOMIC_ACQUIRE))
        return -1;
    if (v < __atomic_load_n(&min_h, __ATOMIC_RELAXED) ||
        v > __atomic_load_n(&max_h, __ATOMIC_RELAXED))
        return 0;
    pthread_rwlock_rdlock(&lock);
    size_t i = slot_of(v);
    int hit = i < ntex;
    if (hit) {
        *lo = texs[i].lo;
        *hi = texs[i].hi;
    }
    pthread_rwlock_unlock(&lock);
    return hit;
}

/* ---- the hooks ---- */

typedef CUresult (*cu_create_fn)(CUtexObject *, const CUDA_RESOURCE_DESC *,
                                 const CUDA_TEXTURE_DESC *, const CUDA_RESOURCE_VIEW_DESC *);
typedef CUresult (*cu_destroy_fn)(CUtexObject);
typedef cudaError_t (*rt_create_fn)(cudaTextureObject_t *, const struct cudaResourceDesc *,
                                    const struct cudaTextureDesc *,
                                    const struct cudaResourceViewDesc *);
typedef cudaError_t (*rt_destroy_fn)(cudaTextureObject_t);

/* Found at their first call: the runtime may ask before the driver loads. */
static void *_Atomic real[4];
#define REAL(i, rt, type, name) ((type)sh_icept_lazy(&real[i], rt, name))

EXPORT CUresult cuTexObjectCreate(CUtexObject *tex, const CUDA_RESOURCE_DESC *res,
                                  const CUDA_TEXTURE_DESC *desc,
                                  const CUDA_RESOURCE_VIEW_DESC *view)
{
    cu_create_fn f = REAL(0, 0, cu_create_fn, "cuTexObjectCreate");
    CUresult r = f ? f(tex, res, desc, view) : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS || !tex || !res)
        return r;
    if (res->resType == CU_RESOURCE_TYPE_LINEAR)
        add(*tex, res->res.linear.devPtr, res->res.linear.sizeInBytes);
    else if (res->resType == CU_RESOURCE_TYPE_PITCH2D)
        add(*tex, res->res.pitch2D.devPtr, res->res.pitch2D.pitchInBytes * res->res.pitch2D.height);
    return r;
}

EXPORT CUresult cuTexObjectDestroy(CUtexObject tex)
{
    cu_destroy_fn f = REAL(1, 0, cu_destroy_fn, "cuTexObjectDestroy");
    del(tex);
    return f ? f(tex) : CUDA_ERROR_NOT_FOUND;
}

EXPORT cudaError_t cudaCreateTextureObject(cudaTextureObject_t *tex,
                                           const struct cudaResourceDesc *res,
                                           const struct cudaTextureDesc *desc,
                                           const struct cudaResourceViewDesc *view)
{
    rt_create_fn f = REAL(2, 1, rt_create_fn, "cudaCreateTextureObject");
    cudaError_t e = f ? f(tex, res, desc, view) : cudaErrorSymbolNotFound;
    if (e != cudaSuccess || !tex || !res)
        return e;
    if (res->resType == cudaResourceTypeLinear)
        add(*tex, (uintptr_t)res->res.linear.devPtr, res->res.linear.sizeInBytes);
    else if (res->resType == cudaResourceTypePitch2D)
        add(*tex, (uintptr_t)res->res.pitch2D.devPtr,
            res->res.pitch2D.pitchInBytes * res->res.pitch2D.height);
    return e;
}

EXPORT cudaError_t cudaDestroyTextureObject(cudaTextureObject_t tex)
{
    rt_destroy_fn f = REAL(3, 1, rt_destroy_fn, "cudaDestroyTextureObject");
    del(tex);
    return f ? f(tex) : cudaErrorSymbolNotFound;
}
