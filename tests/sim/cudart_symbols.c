/* cudart_symbols.c — device variables (__device__ globals of a module): a
 * test declares one with simcuda_register_var, as nvcc's registration code
 * does with __cudaRegisterVar, and the runtime's symbol calls reach it:
 * cudaGetSymbolAddress, cudaGetSymbolSize, cudaMemcpyToSymbol(Async) and
 * cudaMemcpyFromSymbol(Async), with the runtime's errors.
 *
 * A variable gets its device memory from the driver (cuMemAlloc, not the
 * program's cudaMalloc) at its first use, on the device current then, and
 * reads zero until written. One copy serves every device (a real module
 * has one per device). Copies go through the driver as cudaMemcpy's do.
 *
 * Shared state: the table (var_mu). A variable is never unregistered.
 */
#include "rt.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MAX_VARS 64

struct var {
    const void *symbol;
    size_t size;
    CUdeviceptr addr; /* 0 until first used */
    char name[64];
};

static pthread_mutex_t var_mu = PTHREAD_MUTEX_INITIALIZER;
static struct var vars[MAX_VARS];
static int nvars;

/* The entry for symbol, or NULL; var_mu held. */
static struct var *var_find(const void *symbol)
{
    for (int i = 0; i < nvars; i++)
        if (vars[i].symbol == symbol)
            return &vars[i];
    return NULL;
}

SIM_EXPORT int simcuda_register_var(const void *symbol, const char *name, size_t size)
{
    if (!symbol || size == 0)
        return -1;
    pthread_mutex_lock(&var_mu);
    struct var *v = var_find(symbol);
    int r = 0;
    if (v)
        r = v->size == size ? 0 : -1; /* its memory may be placed already */
    else if (nvars == MAX_VARS)
        r = -1;
    else {
        v = &vars[nvars++];
        *v = (struct var){.symbol = symbol, .size = size};
        snprintf(v->name, sizeof v->name, "%s", name ? name : "var");
    }
    pthread_mutex_unlock(&var_mu);
    return r;
}

SIM_EXPORT void *simcuda_var_address(const void *symbol)
{
    pthread_mutex_lock(&var_mu);
    struct var *v = var_find(symbol);
    CUdeviceptr a = v ? v->addr : 0;
    pthread_mutex_unlock(&var_mu);
    return (void *)(uintptr_t)a;
}

/* symbol's device address and size, its memory placed on first use
 * (inside ENTER: a context is current). */
static cudaError_t var_get(const void *symbol, CUdeviceptr *addr, size_t *size)
{
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&var_mu);
    struct var *v = symbol ? var_find(symbol) : NULL;
    if (!v)
        e = cudaErrorInvalidSymbol;
    else if (!v->addr) {
        e = rt_from_cu(cuMemAlloc(&v->addr, v->size));
        if (e == cudaSuccess) /* fresh device memory is process memory here */
            memset((void *)(uintptr_t)v->addr, 0, v->size);
    }
    if (e == cudaSuccess) {
        *addr = v->addr;
        *size = v->size;
    }
    pthread_mutex_unlock(&var_mu);
    return e;
}

SIM_EXPORT cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    ENTER();
    CUdeviceptr a = 0;
    size_t n = 0;
    cudaError_t e = var_get(symbol, &a, &n);
    if (e == cudaSuccess && !devPtr)
        e = cudaErrorInvalidValue;
    if (e == cudaSuccess)
        *devPtr = (void *)(uintptr_t)a;
    return rt_ret(e);
}

SIM_EXPORT cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol)
{
    ENTER();
    CUdeviceptr a = 0;
    size_t n = 0;
    cudaError_t e = var_get(symbol, &a, &n);
    if (e == cudaSuccess && !size)
        e = cudaErrorInvalidValue;
    if (e == cudaSuccess)
        *size = n;
    return rt_ret(e);
}

/* Where count bytes at offset in symbol lie, for a copy of kind; to: the
 * copy writes the symbol (else it reads it). */
static cudaError_t span(const void *symbol, size_t count, size_t offset, enum cudaMemcpyKind kind,
                        bool to, CUdeviceptr *at)
{
    enum cudaMemcpyKind side = to ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (kind != side && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    size_t size = 0;
    cudaError_t e = var_get(symbol, at, &size);
    if (e == cudaSuccess && (offset > size || count > size - offset))
        e = cudaErrorInvalidValue;
    *at += offset;
    return e;
}

SIM_EXPORT cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
                                          size_t offset, enum cudaMemcpyKind kind)
{
    ENTER();
    CUdeviceptr at = 0;
    cudaError_t e = span(symbol, count, offset, kind, true, &at);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret_cu(cuMemcpy(at, (CUdeviceptr)(uintptr_t)src, count));
}

SIM_EXPORT cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
                                               size_t offset, enum cudaMemcpyKind kind,
                                               cudaStream_t s)
{
    ENTER();
    CUdeviceptr at = 0;
    cudaError_t e = span(symbol, count, offset, kind, true, &at);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret_cu(cuMemcpyAsync(at, (CUdeviceptr)(uintptr_t)src, count, (CUstream)s));
}

SIM_EXPORT cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count,
                                            size_t offset, enum cudaMemcpyKind kind)
{
    ENTER();
    CUdeviceptr at = 0;
    cudaError_t e = span(symbol, count, offset, kind, false, &at);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret_cu(cuMemcpy((CUdeviceptr)(uintptr_t)dst, at, count));
}

SIM_EXPORT cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count,
                                                 size_t offset, enum cudaMemcpyKind kind,
                                                 cudaStream_t s)
{
    ENTER();
    CUdeviceptr at = 0;
    cudaError_t e = span(symbol, count, offset, kind, false, &at);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret_cu(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, at, count, (CUstream)s));
}
