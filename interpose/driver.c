/* driver.c — the driver entry-point table, and the pool's VMM and fence
 * operations on top of it.
 *
 * Shared state: each device's free list of recycled events, guarded by its
 * event_mu. The table itself is written once, before any other thread
 * reads it.
 */
#include "interpose/dl.h"
#include "interpose/driver.h"
#include "interpose/peermap.h"

#include "sh_err.h"
#include "sh_log.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

int sh_driver_load(struct sh_driver *drv, const char *path)
{
    drv->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!drv->lib) {
        sh_log(SH_LOG_ERROR, "cannot load the CUDA driver (%s): %s", path, dlerror());
        return SH_EDRIVER;
    }
    get_proc_fn get_proc = (get_proc_fn)sh_dl_lookup(drv->lib, "cuGetProcAddress_v2");
    if (!get_proc) {
        sh_log(SH_LOG_ERROR, "%s has no cuGetProcAddress_v2: a CUDA 12 or newer driver is needed",
               path);
        return SH_EDRIVER;
    }
    int (*get_version)(int *) = (int (*)(int *))sh_dl_lookup(drv->lib, "cuDriverGetVersion");
    if (!get_version || get_version(&drv->version) != CUDA_SUCCESS || drv->version < 12000) {
        sh_log(SH_LOG_ERROR, "%s is older than CUDA 12.0 (version %d): passing through", path,
               drv->version);
        return SH_EDRIVER;
    }
    /* Evicting maps host memory at a region's address, which only drivers
     * from 12.2 can do: on an older one the library would only change how
     * memory is allocated, with nothing to gain. */
    if (drv->version < SH_DRIVER_EVICTS) {
        sh_log(SH_LOG_WARN,
               "the CUDA driver is %d.%d: eviction needs host-located virtual memory, from "
               "CUDA 12.2; passing through",
               drv->version / 1000, drv->version % 1000 / 10);
        return SH_EDRIVER;
    }
    CUdriverProcAddressQueryResult status;
#define SH_DRIVER_LOAD(name)                                                                       \
    if (get_proc(#name, (void **)&drv->name, SH_DRIVER_ABI, CU_GET_PROC_ADDRESS_DEFAULT,           \
                 &status) != CUDA_SUCCESS ||                                                       \
        !drv->name) {                                                                              \
        sh_log(SH_LOG_ERROR, "the CUDA driver lacks %s", #name);                                   \
        return SH_EDRIVER;                                                                         \
    }
    SH_DRIVER_ENTRIES(SH_DRIVER_LOAD)
#undef SH_DRIVER_LOAD
    return SH_OK;
}

void *sh_driver_optional(const struct sh_driver *drv, const char *name, int since)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult q;
    if (drv->version < since ||
        drv->cuGetProcAddress(name, &f, since, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS ||
        q != CU_GET_PROC_ADDRESS_SUCCESS)
        return NULL;
    return f;
}

static CUresult sync_ctx(const struct sh_driver *drv, CUcontext ctx)
{
    if (!ctx)
        return drv->cuCtxSynchronize();
    CUresult r = drv->cuCtxPushCurrent(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    r = drv->cuCtxSynchronize();
    CUcontext popped;
    drv->cuCtxPopCurrent(&popped);
    sh_peers_sync_except(drv, ctx);
    return r;
}

CUresult sh_driver_sync_dev(const struct sh_driver_dev *dd)
{
    return sync_ctx(dd->drv, dd->ctx);
}

/* Makes ctx current for a call that acts on the current context, when the
 * caller's may be another: 1 when it was pushed. */
static int enter_ctx(const struct sh_driver *drv, CUcontext ctx)
{
    return (drv->several || sh_peers_waiting()) && ctx &&
           drv->cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
}

int sh_driver_enter_dev(const struct sh_driver_dev *dd)
{
    return enter_ctx(dd->drv, dd->ctx);
}

void sh_driver_leave(const struct sh_driver *drv, int pushed)
{
    CUcontext popped;
    if (pushed)
        drv->cuCtxPopCurrent(&popped);
}

int sh_driver_ctx_device(const struct sh_driver *drv, CUcontext ctx)
{
    CUdevice dev = -1;
    CUcontext popped;
    if (!ctx || drv->cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
        return -1;
    if (drv->cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        dev = -1;
    drv->cuCtxPopCurrent(&popped);
    return (int)dev;
}

const char *sh_driver_error(const struct sh_driver *drv, CUresult r)
{
    const char *s = NULL;
    if (drv->cuGetErrorString)
        drv->cuGetErrorString(r, &s);
    return s ? s : "unknown CUDA error";
}

void sh_driver_dev_init(struct sh_driver_dev *dd, struct sh_driver *drv, CUdevice dev,
                        CUcontext ctx)
{
    *dd = (struct sh_driver_dev){.drv = drv, .dev = dev, .ctx = ctx};
    pthread_mutex_init(&dd->event_mu, NULL);
}

/* ---- VMM operations ---- */

static int result(struct sh_driver *drv, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return SH_OK;
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return SH_ENOMEM;
    sh_log(SH_LOG_WARN, "%s failed: %s", what, sh_driver_error(drv, r));
    return SH_EDRIVER;
}

static int vmm_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    struct sh_driver_dev *c = ctx;
    CUdeviceptr p = 0;
    int rc =
        result(c->drv, c->drv->cuMemAddressReserve(&p, size, align, 0, 0), "cuMemAddressReserve");
    *va = (uintptr_t)p;
    return rc;
}

static int vmm_unreserve(void *ctx, uintptr_t va, size_t size)
{
    struct sh_driver_dev *c = ctx;
    return result(c->drv, c->drv->cuMemAddressFree((CUdeviceptr)va, size), "cuMemAddressFree");
}

static int vmm_create(void *ctx, size_t size, int loc, uint64_t *handle)
{
    struct sh_driver_dev *c = ctx;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED};
    prop.location.type =
        loc == SH_LOC_DEVICE ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = loc == SH_LOC_DEVICE ? c->dev : 0;
    CUmemGenericAllocationHandle h = 0;
    int rc = result(c->drv, c->drv->cuMemCreate(&h, size, &prop, 0), "cuMemCreate");
    *handle = h;
    return rc;
}

static int vmm_release(void *ctx, uint64_t handle)
{
    struct sh_driver_dev *c = ctx;
    return result(c->drv, c->drv->cuMemRelease(handle), "cuMemRelease");
}

/* Access for the managed device; with several devices, for the peer
 * devices too, and the mapping is listed so that later peer access
 * changes reach it (peermap.c). */
static int vmm_map(void *ctx, uintptr_t va, size_t size, uint64_t handle)
{
    struct sh_driver_dev *c = ctx;
    int rc = result(c->drv, c->drv->cuMemMap((CUdeviceptr)va, size, 0, handle, 0), "cuMemMap");
    if (rc)
        return rc;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, c->dev},
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = c->drv->several ? sh_peers_mapped(c->drv, c->dev, va, size)
                                 : c->drv->cuMemSetAccess((CUdeviceptr)va, size, &access, 1);
    rc = result(c->drv, r, "cuMemSetAccess");
    if (rc)
        c->drv->cuMemUnmap((CUdeviceptr)va, size);
    return rc;
}

static int vmm_unmap(void *ctx, uintptr_t va, size_t size)
{
    struct sh_driver_dev *c = ctx;
    if (c->drv->several)
        sh_peers_listed(c->dev, va, size, 0);
    int rc = result(c->drv, c->drv->cuMemUnmap((CUdeviceptr)va, size), "cuMemUnmap");
    if (rc && c->drv->several)
        sh_peers_listed(c->dev, va, size, 1); /* still mapped: peer access changes must reach it */
    return rc;
}

/* A slab's staging mapping: without host access the CPU faults on a
 * device address even where host memory lies under it. */
static int vmm_map_host(void *ctx, uintptr_t va, size_t size, uint64_t handle)
{
    struct sh_driver_dev *c = ctx;
    int rc = vmm_map(ctx, va, size, handle);
    if (rc)
        return rc;
    CUmemAccessDesc cpu = {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = result(c->drv, c->drv->cuMemSetAccess((CUdeviceptr)va, size, &cpu, 1),
                "cuMemSetAccess (host)");
    if (rc)
        vmm_unmap(ctx, va, size);
    return rc;
}

void sh_driver_vmm_ops(struct sh_driver_dev *dd, struct sh_vmm_ops *ops)
{
    *ops = (struct sh_vmm_ops){dd,          vmm_reserve, vmm_unreserve, vmm_create,
                               vmm_release, vmm_map,     vmm_unmap,     vmm_map_host};
}

/* ---- fences: recycled events ---- */

uint64_t sh_driver_fence_record(struct sh_driver_dev *dd, CUstream stream)
{
    struct sh_driver *drv = dd->drv;
    CUevent ev = NULL;
    pthread_mutex_lock(&dd->event_mu);
    if (dd->nspare > 0)
        ev = dd->spare[--dd->nspare];
    pthread_mutex_unlock(&dd->event_mu);
    /* in the device's context, whose streams fences are recorded on */
    int pushed = ev ? 0 : enter_ctx(drv, dd->ctx);
    CUresult r = ev ? CUDA_SUCCESS : drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (pushed) {
        CUcontext popped;
        drv->cuCtxPopCurrent(&popped);
    }
    if (r != CUDA_SUCCESS)
        return 0;
    if (drv->cuEventRecord(ev, stream) != CUDA_SUCCESS) {
        drv->cuEventDestroy(ev);
        return 0;
    }
    return (uint64_t)(uintptr_t)ev;
}

static int fence_done(void *ctx, uint64_t fence)
{
    const struct sh_driver_dev *dd = ctx;
    CUresult r = dd->drv->cuEventQuery((CUevent)(uintptr_t)fence);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY)
        return r == CUDA_SUCCESS;
    /* The query failed: memory is reused only once the work is surely done. */
    if (dd->drv->cuEventSynchronize((CUevent)(uintptr_t)fence) != CUDA_SUCCESS)
        sh_driver_sync_dev(dd);
    return 1;
}

/* The memory is unmapped after this returns: a failed event wait falls
 * back to waiting for the whole context, retried once. */
static void fence_wait(void *ctx, uint64_t fence)
{
    const struct sh_driver_dev *dd = ctx;
    if (dd->drv->cuEventSynchronize((CUevent)(uintptr_t)fence) == CUDA_SUCCESS ||
        sh_driver_sync_dev(dd) == CUDA_SUCCESS || sh_driver_sync_dev(dd) == CUDA_SUCCESS)
        return;
    sh_log(SH_LOG_ERROR, "cannot wait for the work before a free (%s); the context has failed",
           sh_driver_error(dd->drv, sh_driver_sync_dev(dd)));
}

static void fence_drop(void *ctx, uint64_t fence)
{
    struct sh_driver_dev *dd = ctx;
    CUevent ev = (CUevent)(uintptr_t)fence;
    pthread_mutex_lock(&dd->event_mu);
    bool kept = dd->nspare < SH_DRIVER_EVENT_CACHE;
    if (kept)
        dd->spare[dd->nspare++] = ev;
    pthread_mutex_unlock(&dd->event_mu);
    if (!kept)
        dd->drv->cuEventDestroy(ev);
}

void sh_driver_fence_drop(struct sh_driver_dev *dd, uint64_t fence)
{
    fence_drop(dd, fence);
}

void sh_driver_fence_ops(struct sh_driver_dev *dd, struct sh_fence_ops *ops)
{
    *ops = (struct sh_fence_ops){dd, fence_done, fence_wait, fence_drop};
}

/* ---- copy operations: two dedicated streams ---- */

CUstream sh_driver_copy_stream(const struct sh_driver_dev *dd, int dir)
{
    return dir == 0 || dir == 1 ? dd->stream[dir] : NULL;
}

static int copy_issue(void *ctx, int dir, uintptr_t dst, uintptr_t src, size_t n, uint64_t *token)
{
    struct sh_driver_dev *dd = ctx;
    struct sh_driver *drv = dd->drv;
    CUresult r = drv->cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, dd->stream[dir]);
    if (r != CUDA_SUCCESS)
        return result(drv, r, "cuMemcpyAsync");
    *token = sh_driver_fence_record(dd, dd->stream[dir]);
    if (*token == 0) /* no event: wait now, so the token means "done" */
        return result(drv, drv->cuStreamSynchronize(dd->stream[dir]), "cuStreamSynchronize");
    return SH_OK;
}

static int copy_done(void *ctx, uint64_t token)
{
    return token == 0 || fence_done(ctx, token);
}

/* The caller unmaps or reuses the copy's memory once this returns, so a
 * failed event wait falls back to waiting for the whole context (retried
 * once): the copy is finished whenever this returns, even with an error. */
static int copy_wait(void *ctx, uint64_t token)
{
    const struct sh_driver_dev *dd = ctx;
    if (token == 0 || dd->drv->cuEventSynchronize((CUevent)(uintptr_t)token) == CUDA_SUCCESS)
        return SH_OK;
    CUresult r = sh_driver_sync_dev(dd);
    if (r != CUDA_SUCCESS)
        r = sh_driver_sync_dev(dd);
    return result(dd->drv, r, "waiting for a copy");
}

static void copy_forget(void *ctx, uint64_t token)
{
    if (token)
        fence_drop(ctx, token);
}

static int copy_drain(void *ctx)
{
    const struct sh_driver_dev *dd = ctx;
    return result(dd->drv, sh_driver_sync_dev(dd), "cuCtxSynchronize");
}

int sh_driver_copy_ops(struct sh_driver_dev *dd, struct sh_copy_ops *ops)
{
    struct sh_driver *drv = dd->drv;
    int least = 0, greatest = 0;
    drv->cuCtxGetStreamPriorityRange(&least, &greatest);
    for (int d = 0; d < 2; d++) /* a retry keeps the stream a failed try made */
        if (!dd->stream[d] &&
            drv->cuStreamCreateWithPriority(&dd->stream[d], CU_STREAM_NON_BLOCKING, greatest) !=
                CUDA_SUCCESS) {
            dd->stream[d] = NULL;
            return SH_EDRIVER;
        }
    *ops = (struct sh_copy_ops){dd, copy_issue, copy_done, copy_wait, copy_forget, copy_drain};
    return SH_OK;
}
