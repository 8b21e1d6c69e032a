/* driver.h — the CUDA driver, reached through one table of entry points.
 *
 * The table is filled once from dlopen("libcuda.so.1") and cuGetProcAddress,
 * never by linking -lcuda, so tools and tests run without a GPU and the
 * simulated driver can stand in. It also implements the pool's VMM and fence
 * operations over the driver.
 */
#ifndef SH_INTERPOSE_DRIVER_H
#define SH_INTERPOSE_DRIVER_H

#include "pool/pool.h"
#include "transfer/transfer.h"

#include <cuda.h>

#define SH_DRIVER_ENTRIES(X)                                                                       \
    X(cuInit)                                                                                      \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDeviceTotalMem)                                                                            \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuCtxGetCurrent)                                                                             \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxSynchronize)                                                                            \
    X(cuCtxPushCurrent)                                                                            \
    X(cuCtxPopCurrent)                                                                             \
    X(cuMemGetInfo)                                                                                \
    X(cuMemAddressReserve)                                                                         \
    X(cuMemAddressFree)                                                                            \
    X(cuMemCreate)                                                                                 \
    X(cuMemRelease)                                                                                \
    X(cuMemMap)                                                                                    \
    X(cuMemUnmap)                                                                                  \
    X(cuMemSetAccess)                                                                              \
    X(cuMemGetAllocationGranularity)                                                               \
    X(cuEventCreate)                                                                               \
    X(cuEventDestroy)                                                                              \
    X(cuEventRecord)                                                                               \
    X(cuEventQuery)                                                                                \
    X(cuEventSynchronize)                                                                          \
    X(cuStreamSynchronize)                                                                         \
    X(cuStreamIsCapturing)                                                                         \
    X(cuGetErrorString)                                                                            \
    X(cuGetProcAddress)                                                                            \
    X(cuStreamCreateWithPriority)                                                                  \
    X(cuCtxGetStreamPriorityRange)                                                                 \
    X(cuMemcpyAsync)                                                                               \
    X(cuPointerGetAttribute)                                                                       \
    X(cuLaunchKernel)                                                                              \
    X(cuLaunchKernelEx)                                                                            \
    X(cuLaunchCooperativeKernel)                                                                   \
    X(cuGraphGetNodes)                                                                             \
    X(cuGraphNodeGetType)                                                                          \
    X(cuGraphKernelNodeGetParams)                                                                  \
    X(cuGraphMemsetNodeGetParams)                                                                  \
    X(cuGraphMemcpyNodeGetParams)

struct sh_driver {
#define SH_DRIVER_FIELD(name) __typeof__(name) *name;
    SH_DRIVER_ENTRIES(SH_DRIVER_FIELD)
#undef SH_DRIVER_FIELD
    void *lib;
    int version;
    CUcontext ctx; /* the managed device's context, once known: what a drain waits for */
};

/* Every entry in the table has had the signature cuda.h declares since
 * CUDA 12.0, so they are asked for at that version, which every driver
 * from 12.0 on answers (one older than the version asked refuses). */
#define SH_DRIVER_ABI 12000

/* The first CUDA version whose driver maps host-located memory
 * (CU_MEM_LOCATION_TYPE_HOST_NUMA): older ones are passed through. */
#define SH_DRIVER_EVICTS 12020

/* Loads the driver; SH_EDRIVER with a log line naming what is missing.
 * drv->version is the driver's CUDA version (12040 for 12.4). */
int sh_driver_load(struct sh_driver *drv, const char *path);

/* Waits for all work in the managed device's context (drv->ctx), whatever
 * context the calling thread has current: a program that drives two GPUs
 * calls in with the other one's current, and a wait for that one would
 * let the managed device's kernels run on under a remap. Before drv->ctx
 * is known: the current context. */
CUresult sh_driver_sync(const struct sh_driver *drv);

/* An entry point newer than CUDA 12.0, asked for at the version that
 * brought it in (since, as 12040); NULL where this driver lacks it. */
void *sh_driver_optional(const struct sh_driver *drv, const char *name, int since);

/* The driver's name for r, for messages. */
const char *sh_driver_error(const struct sh_driver *drv, CUresult r);

/* VMM and fence operations for the pool, on device dev. The returned
 * structs point at *drv, which must outlive them. */
void sh_driver_vmm_ops(struct sh_driver *drv, CUdevice dev, struct sh_vmm_ops *ops);
void sh_driver_fence_ops(struct sh_driver *drv, struct sh_fence_ops *ops);

/* Copy operations for the transfer engine: two high-priority non-blocking
 * streams, an event per copy. SH_EDRIVER if the streams cannot be made. */
int sh_driver_copy_ops(struct sh_driver *drv, struct sh_copy_ops *ops);

/* A fence: an event recorded on stream. 0 if none could be recorded. */
uint64_t sh_driver_fence_record(struct sh_driver *drv, CUstream stream);

#endif
