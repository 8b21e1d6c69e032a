/* hostcalls.c — the calls that make and free memory both the CPU and
 * kernels reach: cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost,
 * cuMemHostRegister, cuMemHostUnregister, cuMemAllocManaged and their
 * runtime forms, and cuMemFree (which frees managed memory), however the
 * program found them (intercept.c and dlsym.c hand out these exports).
 * Each passes through; what it made or freed goes to hostmem.c's ranges.
 * cudaFree is cudart.c's, which tells hostmem.c too.
 *
 * Shared state: the real functions, resolved once.
 */
#include "interpose/intercept.h"

#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

/* What a call made (its pointer through pp, n bytes) or freed. */
static void made(void *const *pp, size_t n)
{
    if (pp)
        sh_hostmem_add(*pp, n);
}

static void made_at(const CUdeviceptr *dptr, size_t n)
{
    if (dptr)
        sh_hostmem_add((const void *)(uintptr_t)*dptr, n);
}

/* X(api, name, parameters, arguments, what a success does); api is DRV or RT. */
#define HOST_CALLS(X)                                                                              \
    X(DRV, cuMemAllocHost_v2, (void **pp, size_t n), (pp, n), made(pp, n))                         \
    X(DRV, cuMemHostAlloc, (void **pp, size_t n, unsigned int f), (pp, n, f), made(pp, n))         \
    X(DRV, cuMemFreeHost, (void *p), (p), sh_hostmem_del(p))                                       \
    X(DRV, cuMemHostRegister_v2, (void *p, size_t n, unsigned int f), (p, n, f),                   \
      sh_hostmem_add(p, n))                                                                        \
    X(DRV, cuMemHostUnregister, (void *p), (p), sh_hostmem_del(p))                                 \
    X(DRV, cuMemAllocManaged, (CUdeviceptr * d, size_t n, unsigned int f), (d, n, f),              \
      made_at(d, n))                                                                               \
    X(DRV, cuMemFree_v2, (CUdeviceptr d), (d), sh_hostmem_del((const void *)(uintptr_t)d))         \
    X(RT, cudaMallocHost, (void **pp, size_t n), (pp, n), made(pp, n))                             \
    X(RT, cudaHostAlloc, (void **pp, size_t n, unsigned int f), (pp, n, f), made(pp, n))           \
    X(RT, cudaFreeHost, (void *p), (p), sh_hostmem_del(p))                                         \
    X(RT, cudaHostRegister, (void *p, size_t n, unsigned int f), (p, n, f), sh_hostmem_add(p, n))  \
    X(RT, cudaHostUnregister, (void *p), (p), sh_hostmem_del(p))                                   \
    X(RT, cudaMallocManaged, (void **pp, size_t n, unsigned int f), (pp, n, f), made(pp, n))

#define DRV_RT      0
#define RT_RT       1
#define DRV_OK      CUDA_SUCCESS
#define RT_OK       cudaSuccess
#define DRV_MISSING CUDA_ERROR_NOT_INITIALIZED
#define RT_MISSING  cudaErrorSymbolNotFound
#define DRV_TYPE    CUresult
#define RT_TYPE     cudaError_t

/* Found at each hook's first call that finds it (sh_icept_lazy). */
static struct {
#define FIELD(api, name, params, args, then) void *_Atomic name;
    HOST_CALLS(FIELD)
#undef FIELD
} real;

#define HOOK(api, name, params, args, then)                                                        \
    EXPORT api##_TYPE name params                                                                  \
    {                                                                                              \
        __typeof__(name) *fn_ = (__typeof__(fn_))sh_icept_lazy(&real.name, api##_RT, #name);       \
        if (!fn_)                                                                                  \
            return api##_MISSING;                                                                  \
        api##_TYPE r = fn_ args;                                                                   \
        if (r == api##_OK)                                                                         \
            then;                                                                                  \
        return r;                                                                                  \
    }
HOST_CALLS(HOOK)
#undef HOOK
