/* entries.h — the CUDA driver's entry points, one table (struct sh_driver),
 * filled by driver.c and read by every file that calls the driver: a
 * header of its own, so that peermap.c, below driver.c, can read it too.
 */
#ifndef SH_INTERPOSE_ENTRIES_H
#define SH_INTERPOSE_ENTRIES_H

#include <cuda.h>

#define SH_DRIVER_ENTRIES(X)                                                                       \
    X(cuInit)                                                                                      \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDeviceTotalMem)                                                                            \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuCtxGetCurrent)                                                                             \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxSynchronize)                                                                            \
    X(cuCtxPushCurrent)                                                                            \
    X(cuCtxPopCurrent)                                                                             \
    X(cuCtxGetDevice)                                                                              \
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
    X(cuStreamGetCtx)                                                                              \
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
    int several;   /* the process sees more than one device (peermap.c is in use) */
};

/* Every entry in the table has had the signature cuda.h declares since
 * CUDA 12.0, so they are asked for at that version, which every driver
 * from 12.0 on answers (one older than the version asked refuses). */
#define SH_DRIVER_ABI 12000

/* The first CUDA version whose driver maps host-located memory
 * (CU_MEM_LOCATION_TYPE_HOST_NUMA): older ones are passed through. */
#define SH_DRIVER_EVICTS 12020

#endif
