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

static struct {
    __typeof__(cuMemAllocHost_v2) *alloc;
    __typeof__(cuMemHostAlloc) *host_alloc;
    __typeof__(cuMemFreeHost) *free;
    __typeof__(cuMemHostRegister_v2) *reg;
    __typeof__(cuMemHostUnregister) *unreg;
    __typeof__(cuMemAllocManaged) *managed;
    __typeof__(cuMemFree_v2) *dev_free;
    __typeof__(cudaMallocManaged) *rt_managed;
    __typeof__(cudaMallocHost) *rt_alloc;
    __typeof__(cudaHostAlloc) *rt_host_alloc;
    __typeof__(cudaFreeHost) *rt_free;
    __typeof__(cudaHostRegister) *rt_reg;
    __typeof__(cudaHostUnregister) *rt_unreg;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define REAL(field, rt, name) real.field = (__typeof__(real.field))sh_icept_lookup(rt, name)
    REAL(alloc, 0, "cuMemAllocHost_v2");
    REAL(host_alloc, 0, "cuMemHostAlloc");
    REAL(free, 0, "cuMemFreeHost");
    REAL(reg, 0, "cuMemHostRegister_v2");
    REAL(unreg, 0, "cuMemHostUnregister");
    REAL(managed, 0, "cuMemAllocManaged");
    REAL(dev_free, 0, "cuMemFree_v2");
    REAL(rt_managed, 1, "cudaMallocManaged");
    REAL(rt_alloc, 1, "cudaMallocHost");
    REAL(rt_host_alloc, 1, "cudaHostAlloc");
    REAL(rt_free, 1, "cudaFreeHost");
    REAL(rt_reg, 1, "cudaHostRegister");
    REAL(rt_unreg, 1, "cudaHostUnregister");
#undef REAL
}

#define RESOLVE(fn, missing)                                                                       \
    do {                                                                                           \
        pthread_once(&real_once, resolve);                                                         \
        if (!real.fn)                                                                              \
            return missing;                                                                        \
    } while (0)

/* What a successful allocation call made, recorded. */
#define KEEP(ok, pp, n)                                                                            \
    do {                                                                                           \
        if ((ok) && (pp))                                                                          \
            sh_hostmem_add(*(pp), n);                                                              \
    } while (0)

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    RESOLVE(alloc, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.alloc(pp, bytesize);
    KEEP(r == CUDA_SUCCESS, pp, bytesize);
    return r;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    RESOLVE(host_alloc, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.host_alloc(pp, bytesize, flags);
    KEEP(r == CUDA_SUCCESS, pp, bytesize);
    return r;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    RESOLVE(free, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.free(p);
    if (r == CUDA_SUCCESS)
        sh_hostmem_del(p);
    return r;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    RESOLVE(reg, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.reg(p, bytesize, flags);
    if (r == CUDA_SUCCESS)
        sh_hostmem_add(p, bytesize);
    return r;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    RESOLVE(unreg, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.unreg(p);
    if (r == CUDA_SUCCESS)
        sh_hostmem_del(p);
    return r;
}

EXPORT cudaError_t cudaMallocHost(void **p, size_t size)
{
    RESOLVE(rt_alloc, cudaErrorSymbolNotFound);
    cudaError_t e = real.rt_alloc(p, size);
    KEEP(e == cudaSuccess, p, size);
    return e;
}

EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    RESOLVE(rt_host_alloc, cudaErrorSymbolNotFound);
    cudaError_t e = real.rt_host_alloc(p, size, flags);
    KEEP(e == cudaSuccess, p, size);
    return e;
}

EXPORT cudaError_t cudaFreeHost(void *p)
{
    RESOLVE(rt_free, cudaErrorSymbolNotFound);
    cudaError_t e = real.rt_free(p);
    if (e == cudaSuccess)
        sh_hostmem_del(p);
    return e;
}

EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    RESOLVE(rt_reg, cudaErrorSymbolNotFound);
    cudaError_t e = real.rt_reg(p, size, flags);
    if (e == cudaSuccess)
        sh_hostmem_add(p, size);
    return e;
}

EXPORT cudaError_t cudaHostUnregister(void *p)
{
    RESOLVE(rt_unreg, cudaErrorSymbolNotFound);
    cudaError_t e = real.rt_unreg(p);
    if (e == cudaSuccess)
        sh_hostmem_del(p);
    return e;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    RESOLVE(managed, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.managed(dptr, bytesize, flags);
    if (r == CUDA_SUCCESS && dptr)
        sh_hostmem_add((const void *)(uintptr_t)*dptr, bytesize);
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    RESOLVE(dev_free, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = real.dev_free(dptr);
    if (r == CUDA_SUCCESS)
        sh_hostmem_del((const void *)(uintptr_t)dptr);
    return r;
}

EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags)
{
    RESOLVE(rt_managed, cudaErrorSymbolNotFound);
    cudaError_t e = real.rt_managed(p, size, flags);
    KEEP(e == cudaSuccess, p, size);
    return e;
}
