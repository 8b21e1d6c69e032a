/* cudart_mem.c — the simulated runtime's memory calls: allocations, pointer
 * queries, pinned host memory, copies and memsets, over the driver.
 *
 * Shared state: none.
 */
#include "rt.h"

#include <string.h>

/* ---- memory ---- */

SIM_EXPORT cudaError_t cudaMalloc(void **p, size_t size)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
    if (size == 0) {
        *p = NULL; /* the runtime accepts 0 and returns NULL */
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc(&d, size);
    *p = (void *)(uintptr_t)d;
    return rt_ret_cu(r);
}

SIM_EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocManaged(&d, size, flags);
    *p = (void *)(uintptr_t)d;
    return rt_ret_cu(r);
}

SIM_EXPORT cudaError_t cudaFree(void *p)
{
    ENTER();
    return rt_ret_cu(cuMemFree((CUdeviceptr)(uintptr_t)p));
}

SIM_EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocAsync(&d, size, (CUstream)s);
    *p = (void *)(uintptr_t)d;
    return rt_ret_cu(r);
}

SIM_EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    ENTER();
    if (!p)
        return cudaSuccess;
    return rt_ret_cu(cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, (CUstream)s));
}

/* ---- memory pools: the driver's, by device ordinal ---- */

static cudaError_t device_of(int device, CUdevice *d)
{
    return rt_ret_cu(cuDeviceGet(d, device));
}

SIM_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    ENTER();
    CUdevice d;
    cudaError_t e = device_of(device, &d);
    return e ? e : rt_ret_cu(cuDeviceGetDefaultMemPool((CUmemoryPool *)pool, d));
}

SIM_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int device)
{
    ENTER();
    CUdevice d;
    cudaError_t e = device_of(device, &d);
    return e ? e : rt_ret_cu(cuDeviceGetMemPool((CUmemoryPool *)pool, d));
}

SIM_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool)
{
    ENTER();
    CUdevice d;
    cudaError_t e = device_of(device, &d);
    return e ? e : rt_ret_cu(cuDeviceSetMemPool(d, (CUmemoryPool)pool));
}

SIM_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props)
{
    ENTER();
    if (!props)
        return rt_ret(cudaErrorInvalidValue);
    CUmemPoolProps p = {.allocType = (CUmemAllocationType)props->allocType,
                        .handleTypes = (CUmemAllocationHandleType)props->handleTypes,
                        .location = {(CUmemLocationType)props->location.type, props->location.id},
                        .win32SecurityAttributes = props->win32SecurityAttributes,
                        .maxSize = props->maxSize,
                        .usage = props->usage};
    memcpy(p.reserved, props->reserved, sizeof p.reserved);
    return rt_ret_cu(cuMemPoolCreate((CUmemoryPool *)pool, &p));
}

SIM_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
    ENTER();
    return rt_ret_cu(cuMemPoolDestroy((CUmemoryPool)pool));
}

/* cudaMemPoolAttr and CUmemPool_attribute share their values. */
SIM_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                               void *value)
{
    ENTER();
    return rt_ret_cu(cuMemPoolGetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value));
}

SIM_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                               void *value)
{
    ENTER();
    return rt_ret_cu(cuMemPoolSetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value));
}

SIM_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep)
{
    ENTER();
    return rt_ret_cu(cuMemPoolTrimTo((CUmemoryPool)pool, minBytesToKeep));
}

SIM_EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                               cudaStream_t s)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocFromPoolAsync(&d, size, (CUmemoryPool)pool, (CUstream)s);
    *p = (void *)(uintptr_t)d;
    return rt_ret_cu(r);
}

/* What a program built with --default-stream per-thread calls: stream 0
 * there is the calling thread's own stream. */
static cudaStream_t per_thread(cudaStream_t s)
{
    return s ? s : cudaStreamPerThread;
}

SIM_EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s);
SIM_EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);

cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s)
{
    return cudaMallocAsync(p, size, per_thread(s));
}

cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
    return cudaFreeAsync(p, per_thread(s));
}

SIM_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    ENTER();
    return rt_ret_cu(cuMemGetInfo(free_bytes, total));
}

/* As the runtime does since CUDA 11: memory the driver does not know is
 * cudaMemoryTypeUnregistered, not an error; host memory has both
 * pointers, device memory only its device pointer. */
SIM_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    ENTER();
    if (!attr)
        return rt_ret(cudaErrorInvalidValue);
    unsigned type = 0;
    int ordinal = 0;
    CUpointer_attribute what[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[] = {&type, &ordinal};
    CUresult r = cuPointerGetAttributes(2, what, data, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        return rt_ret_cu(r);
    memset(attr, 0, sizeof *attr);
    attr->device = ordinal;
    if (type == CU_MEMORYTYPE_DEVICE) {
        attr->type = cudaMemoryTypeDevice;
        attr->devicePointer = (void *)ptr;
    } else if (type == CU_MEMORYTYPE_HOST) {
        attr->type = cudaMemoryTypeHost;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr)
{
    ENTER();
    return rt_ret_cu(cuIpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)(uintptr_t)ptr));
}

SIM_EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    ENTER();
    return rt_ret_cu(cuMemHostAlloc(p, size, flags));
}

SIM_EXPORT cudaError_t cudaMallocHost(void **p, size_t size)
{
    return cudaHostAlloc(p, size, 0);
}

SIM_EXPORT cudaError_t cudaFreeHost(void *p)
{
    ENTER();
    return rt_ret_cu(cuMemFreeHost(p));
}

SIM_EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    ENTER();
    return rt_ret_cu(cuMemHostRegister(p, size, flags));
}

SIM_EXPORT cudaError_t cudaHostUnregister(void *p)
{
    ENTER();
    return rt_ret_cu(cuMemHostUnregister(p));
}

SIM_EXPORT cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    ENTER();
    if (!dev)
        return rt_ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = cuMemHostGetDevicePointer(&d, host, flags);
    if (r == CUDA_SUCCESS)
        *dev = (void *)(uintptr_t)d;
    return rt_ret_cu(r);
}

static bool valid_kind(enum cudaMemcpyKind kind)
{
    return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault;
}

SIM_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    ENTER();
    if (!valid_kind(kind))
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    return rt_ret_cu(cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n));
}

SIM_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                       enum cudaMemcpyKind kind, cudaStream_t s)
{
    ENTER();
    if (!valid_kind(kind))
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    return rt_ret_cu(
        cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)s));
}

/* cudaMemcpy2D(Async): the driver's, with either kind of pointer on each
 * side (unified: the driver tells them apart). */
static CUDA_MEMCPY2D rt_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height)
{
    return (CUDA_MEMCPY2D){.srcMemoryType = CU_MEMORYTYPE_UNIFIED,
                           .srcDevice = (CUdeviceptr)(uintptr_t)src,
                           .srcPitch = spitch,
                           .dstMemoryType = CU_MEMORYTYPE_UNIFIED,
                           .dstDevice = (CUdeviceptr)(uintptr_t)dst,
                           .dstPitch = dpitch,
                           .WidthInBytes = width,
                           .Height = height};
}

SIM_EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                    size_t width, size_t height, enum cudaMemcpyKind kind)
{
    ENTER();
    if (!valid_kind(kind))
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    CUDA_MEMCPY2D p = rt_2d(dst, dpitch, src, spitch, width, height);
    return rt_ret_cu(cuMemcpy2D_v2(&p));
}

SIM_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                         size_t width, size_t height, enum cudaMemcpyKind kind,
                                         cudaStream_t s)
{
    ENTER();
    if (!valid_kind(kind))
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    CUDA_MEMCPY2D p = rt_2d(dst, dpitch, src, spitch, width, height);
    return rt_ret_cu(cuMemcpy2DAsync_v2(&p, (CUstream)s));
}

/* Copies between devices, through the devices' primary contexts. */
static cudaError_t memcpy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                               cudaStream_t s, bool sync)
{
    ENTER();
    if (!rt_device_valid(dst_dev) || !rt_device_valid(src_dev))
        return rt_ret(cudaErrorInvalidDevice);
    CUcontext dc = NULL, sc = NULL;
    CUresult r = rt_primary(dst_dev, &dc);
    if (r == CUDA_SUCCESS)
        r = rt_primary(src_dev, &sc);
    if (r != CUDA_SUCCESS)
        return rt_ret_cu(r);
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, from = (CUdeviceptr)(uintptr_t)src;
    return rt_ret_cu(sync ? cuMemcpyPeer(d, dc, from, sc, n)
                          : cuMemcpyPeerAsync(d, dc, from, sc, n, (CUstream)s));
}

SIM_EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev,
                                      size_t n)
{
    return memcpy_peer(dst, dst_dev, src, src_dev, n, NULL, true);
}

SIM_EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev,
                                           size_t n, cudaStream_t s)
{
    return memcpy_peer(dst, dst_dev, src, src_dev, n, s, false);
}

SIM_EXPORT cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    ENTER();
    return rt_ret_cu(cuMemsetD8((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, n));
}

SIM_EXPORT cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s)
{
    ENTER();
    return rt_ret_cu(
        cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, n, (CUstream)s));
}
