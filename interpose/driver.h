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

/* Loads the driver; SH_EDRIVER with a log line naming what is missing.
 * drv->version is the driver's CUDA version (12040 for 12.4). */
int sh_driver_load(struct sh_driver *drv, const char *path);

/* Waits for all work in the managed device's context (drv->ctx), whatever
 * context the calling thread has current: a program that drives two GPUs
 * calls in with the other one's current, and a wait for that one would
 * let the managed device's kernels run on under a remap. Then for the
 * other contexts that may touch regions (sh_peers_sync): with several
 * devices, those of peers and copies; with one or several, those the
 * program created on the managed device. Before drv->ctx is known: the
 * current context. Returns the managed context's result. */
CUresult sh_driver_sync(const struct sh_driver *drv);

/* With several devices, or once the program created a context, makes the
 * managed context current for a call that acts on the current one
 * (creating an event, asking for free memory): returns 1 when it pushed
 * it, for sh_driver_leave. */
int sh_driver_enter(const struct sh_driver *drv);
void sh_driver_leave(const struct sh_driver *drv, int pushed);

/* The device of context ctx; -1 if the driver cannot say. */
int sh_driver_ctx_device(const struct sh_driver *drv, CUcontext ctx);

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

/* ---- several devices in one process (peermap.c) ----
 *
 * sh_peers_init: the managed device, and whether the process sees more
 * than one (several = 0: nothing below is used). sh_peers_link: context
 * ctx, on device from, enabled (on = 1) or disabled peer access to device
 * to; while any link lets `from` reach the managed device, every listed
 * mapping gives it read and write access, and ctx is waited for by every
 * drain from then on. sh_peers_mapped: a mapping was just made at [va,
 * va + size): lists it and sets its access (dev, and every peer device);
 * on failure it is not listed. sh_peers_listed: lists (1) or forgets (0)
 * a mapping without touching its access. sh_peers_note: work on a stream
 * of ctx used regions: drains wait for ctx from now on. sh_peers_own: the
 * program created ctx on device dev: on the managed device (or before it
 * is known), drains wait for it from now on, with one device as with
 * several. sh_peers_destroying(1) ... (0): the program destroys a context
 * meanwhile, and no drain waits for the noted ones; sh_peers_forget, in
 * between: ctx is destroyed, drains no longer wait for it (and
 * sh_peers_generation changes). sh_peers_waiting: whether any context but
 * the managed one is noted (one relaxed load). sh_peers_sync: waits for
 * every noted context but drv->ctx (their errors ignored); nothing to do
 * when none is noted. */
void sh_peers_init(CUdevice dev, int several);
void sh_peers_link(const struct sh_driver *drv, CUcontext ctx, int from, int to, int on);
CUresult sh_peers_mapped(const struct sh_driver *drv, CUdevice dev, uintptr_t va, size_t size);
void sh_peers_listed(uintptr_t va, size_t size, int listed);
size_t sh_peers_mappings(void);
void sh_peers_note(CUcontext ctx);
void sh_peers_own(CUcontext ctx, int dev);
void sh_peers_destroying(int on);
void sh_peers_forget(CUcontext ctx);
unsigned sh_peers_generation(void);
int sh_peers_waiting(void);
void sh_peers_sync(const struct sh_driver *drv);

#endif
