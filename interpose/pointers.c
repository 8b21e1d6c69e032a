/* pointers.c — pointer queries answered for regions, and the calls that
 * hand a region's physical pages to someone else.
 *
 * A region is one allocation to the program, but to the driver it is
 * several VMM mappings, each on a device chunk or, while evicted, on a
 * host-located slab. Asked about it, the driver would name one chunk as
 * "the allocation" and call an evicted one host memory; NCCL, MPI and
 * PyTorch would then register a fraction of a buffer, or treat a device
 * buffer as a CPU one. For a region's address these hooks answer as for a
 * cudaMalloc allocation: device memory, on the managed device, the whole
 * range, resident or not. Everything else is the driver's answer.
 * cuPointerGetAttribute's MAPPING_* attributes still describe the chunk:
 * they are about the mapping.
 *
 * A handle retained through a region's address (cuMemRetainAllocationHandle,
 * then exported to a peer: NCCL's buffer registration) or a dma-buf taken
 * for its range binds someone else to its pages. The region is restored
 * first (the pages must be the device's), then pinned: never moved again,
 * and its chunks never reused after it is freed (pool/region.c). Legacy
 * IPC cannot export VMM memory at all: cudaIpcGetMemHandle on a region is
 * refused with a message that says what to do.
 *
 * Shared state: the real functions, resolved once.
 */
#include "interpose/intercept.h"

#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

/* The region (or sub-allocated block) at p, if the library manages one,
 * and its device's number (ordinal may be NULL). */
static int region_range(CUdeviceptr p, uintptr_t *base, size_t *size, int *ordinal)
{
    const struct sh_dev *d = sh_active() ? sh_dev_of((uintptr_t)p) : NULL;
    if (!d || sh_pool_range(d->pool, (uintptr_t)p, base, size) != 0)
        return 0;
    if (ordinal)
        *ordinal = d->ordinal;
    return 1;
}

/* Writes a's value for the region at p into data: 1 if a is one the
 * region answers, 0 if the driver's answer stands, -1 if a has no value
 * for device memory (HOST_POINTER). */
static int answer(void *data, CUpointer_attribute a, CUdeviceptr p, uintptr_t base, size_t size,
                  int ordinal)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(CUmemorytype *)data = CU_MEMORYTYPE_DEVICE;
        return 1;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p;
        return 1;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return -1;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = ordinal;
        return 1;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = base;
        return 1;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = size;
        return 1;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: /* one per allocation, not per chunk */
        *(unsigned long long *)data = base;
        return 1;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1; /* it is mapped again before any work reaches it */
        return 1;
    default:
        return 0;
    }
}

static struct {
    __typeof__(cuPointerGetAttribute) *get_attr;
    __typeof__(cuPointerGetAttributes) *get_attrs;
    __typeof__(cuMemGetAddressRange_v2) *get_range;
    __typeof__(cudaPointerGetAttributes) *rt_attrs;
    __typeof__(cuMemRetainAllocationHandle) *retain;
    __typeof__(cuMemGetHandleForAddressRange) *range_handle;
    __typeof__(cuIpcGetMemHandle) *ipc;
    __typeof__(cudaIpcGetMemHandle) *rt_ipc;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
    real.get_attr = (__typeof__(real.get_attr))sh_icept_lookup(0, "cuPointerGetAttribute");
    real.get_attrs = (__typeof__(real.get_attrs))sh_icept_lookup(0, "cuPointerGetAttributes");
    real.get_range = (__typeof__(real.get_range))sh_icept_lookup(0, "cuMemGetAddressRange_v2");
    real.rt_attrs = (__typeof__(real.rt_attrs))sh_icept_lookup(1, "cudaPointerGetAttributes");
    real.retain = (__typeof__(real.retain))sh_icept_lookup(0, "cuMemRetainAllocationHandle");
    real.range_handle =
        (__typeof__(real.range_handle))sh_icept_lookup(0, "cuMemGetHandleForAddressRange");
    real.ipc = (__typeof__(real.ipc))sh_icept_lookup(0, "cuIpcGetMemHandle");
    real.rt_ipc = (__typeof__(real.rt_ipc))sh_icept_lookup(1, "cudaIpcGetMemHandle");
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    pthread_once(&real_once, resolve);
    uintptr_t base;
    size_t size;
    int ordinal;
    if (data && region_range(p, &base, &size, &ordinal)) {
        int r = answer(data, a, p, base, size, ordinal);
        if (r)
            return r > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    return real.get_attr ? real.get_attr(data, a, p) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data,
                                       CUdeviceptr p)
{
    pthread_once(&real_once, resolve);
    if (!real.get_attrs)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real.get_attrs(n, attrs, data, p);
    uintptr_t base;
    size_t size;
    int ordinal;
    if (r != CUDA_SUCCESS || !attrs || !data || !region_range(p, &base, &size, &ordinal))
        return r;
    for (unsigned k = 0; k < n; k++)
        if (data[k] && answer(data[k], attrs[k], p, base, size, ordinal) < 0)
            *(void **)data[k] = NULL; /* no host pointer, as for device memory */
    return r;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p)
{
    pthread_once(&real_once, resolve);
    uintptr_t base;
    size_t size;
    if (!region_range(p, &base, &size, NULL))
        return real.get_range ? real.get_range(pbase, psize, p) : CUDA_ERROR_NOT_INITIALIZED;
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    return CUDA_SUCCESS;
}

EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    pthread_once(&real_once, resolve);
    if (!real.rt_attrs)
        return cudaErrorInitializationError;
    cudaError_t e = real.rt_attrs(attr, ptr);
    uintptr_t base;
    size_t size;
    int ordinal;
    if (e == cudaSuccess && attr &&
        region_range((CUdeviceptr)(uintptr_t)ptr, &base, &size, &ordinal)) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = ordinal;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = NULL;
    }
    return e;
}

/* ---- pages handed to someone else ---- */

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    pthread_once(&real_once, resolve);
    if (!real.retain)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* A handle of the program's own, mapped as a region: that handle. */
    int mine = handle ? sh_vmm_retain((uintptr_t)addr, handle) : 0;
    if (mine)
        return mine > 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base;
    size_t size;
    if (region_range((CUdeviceptr)(uintptr_t)addr, &base, &size, NULL) &&
        sh_pin_region((uintptr_t)addr) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return real.retain(handle, addr);
}

EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t size,
                                              CUmemRangeHandleType type, unsigned long long flags)
{
    pthread_once(&real_once, resolve);
    if (!real.range_handle)
        return CUDA_ERROR_NOT_INITIALIZED;
    uintptr_t base, end = size ? p + size - 1 : p;
    size_t len;
    for (uintptr_t a = p; sh_active() && a <= end; a = base + len) {
        if (!region_range(a, &base, &len, NULL)) {
            base = a, len = sh_dev_main()->gran; /* not a region: look one granule on */
            continue;
        }
        if (sh_pin_region(a) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return real.range_handle(handle, p, size, type, flags);
}

static void ipc_refused(const void *p)
{
    sh_log(SH_LOG_ERROR,
           "cudaIpcGetMemHandle(%p): stagehand backs this buffer with CUDA virtual memory, which "
           "legacy CUDA IPC cannot export. Share it with cuMemExportToShareableHandle, or run "
           "this process with STAGEHAND_DISABLE=1 ([general] enabled = false)",
           p);
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p)
{
    pthread_once(&real_once, resolve);
    uintptr_t base;
    size_t size;
    if (region_range(p, &base, &size, NULL)) {
        ipc_refused((const void *)(uintptr_t)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return real.ipc ? real.ipc(handle, p) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p)
{
    pthread_once(&real_once, resolve);
    uintptr_t base;
    size_t size;
    if (region_range((CUdeviceptr)(uintptr_t)p, &base, &size, NULL)) {
        ipc_refused(p);
        return cudaErrorInvalidValue;
    }
    return real.rt_ipc ? real.rt_ipc(handle, p) : cudaErrorInitializationError;
}
