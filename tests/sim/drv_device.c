/* drv_device.c — the simulated devices (SIMCUDA_DEVICES), their primary
 * contexts, the contexts a program creates (cuCtxCreate), the context
 * stack of each thread, and peer access.
 *
 * Shared state: each primary context's reference count is updated
 * atomically, as is each context's peer mask and a created context's
 * state; the context stack and the device a stream worker runs are
 * thread-local. Created contexts take the slots after the primary ones in
 * order and a slot is never reused, so a destroyed context's handle stays
 * destroyed.
 */
#include "sim.h"

#include <stdio.h>

enum { CTX_FREE = 0, CTX_LIVE = 1, CTX_DESTROYED = 2 };

/* A context. Its address is the CUcontext handle; slot i < SIM_MAX_DEVICES
 * is device i's primary context. */
struct sim_ctx {
    int retains;
    atomic_uint peers; /* primary: bit e, peer access to device e's memory enabled */
    atomic_int state;  /* created contexts: CTX_* */
    int dev;           /* created contexts: their device */
};
static struct sim_ctx ctxs[SIM_MAX_CTX];
#define primary ctxs
static atomic_int ncreated; /* created slots taken so far */

/* The thread's context stack; the current context is its top. */
#define CTX_STACK 64
static _Thread_local CUcontext stack[CTX_STACK];
static _Thread_local int depth;
static _Thread_local int running = -1; /* a stream worker's device */

CUcontext sim_ctx_current(void)
{
    return depth ? stack[depth - 1] : NULL;
}

int sim_ctx_index(CUcontext ctx)
{
    const struct sim_ctx *c = (const struct sim_ctx *)ctx;
    if (c < ctxs || c >= ctxs + SIM_MAX_CTX)
        return -1;
    int i = (int)(c - ctxs);
    if (i < SIM_MAX_DEVICES)
        return i < sim_cfg.ndevices ? i : -1;
    return atomic_load(&ctxs[i].state) != CTX_FREE ? i : -1;
}

bool sim_ctx_destroyed(CUcontext ctx)
{
    int i = sim_ctx_index(ctx);
    return i >= SIM_MAX_DEVICES && atomic_load(&ctxs[i].state) == CTX_DESTROYED;
}

/* The device of a live context; -1 for a destroyed one or no context. */
int sim_ctx_device(CUcontext ctx)
{
    int i = sim_ctx_index(ctx);
    if (i < 0 || sim_ctx_destroyed(ctx))
        return -1;
    return i < SIM_MAX_DEVICES ? i : ctxs[i].dev;
}

int sim_ctx_current_index(void)
{
    CUcontext c = sim_ctx_current();
    return c ? sim_ctx_index(c) : 0;
}

CUcontext sim_ctx_handle(int index)
{
    return (CUcontext)&ctxs[index];
}

/* A destroyed context still current to another thread keeps its device,
 * so the calls its error refuses index nothing out of range. */
int sim_current_device(void)
{
    int i = sim_ctx_current_index();
    return i < SIM_MAX_DEVICES ? i : ctxs[i].dev;
}

int sim_running_device(void)
{
    return running >= 0 ? running : sim_current_device();
}

void sim_set_running_device(int dev)
{
    running = dev;
}

bool sim_device_valid(CUdevice dev)
{
    return dev >= 0 && dev < sim_cfg.ndevices;
}

CUcontext sim_primary_ctx(int dev)
{
    return (CUcontext)&primary[dev];
}

bool sim_peer_enabled(int from, int to)
{
    return from == to || (atomic_load(&primary[from].peers) & (1u << to));
}

/* For the simulated runtime: what it needs to know without making a call
 * that SIMCUDA_FAIL would count. Internal ABI, not for tests. */
SIM_EXPORT int simcuda__device_count(void);
SIM_EXPORT int simcuda__current_device(void);
int simcuda__device_count(void)
{
    return sim_cfg.ndevices;
}

/* The device of the calling thread's current context; -1 with none. */
int simcuda__current_device(void)
{
    CUcontext c = sim_ctx_current();
    return c ? sim_ctx_device(c) : -1;
}

SIM_EXPORT CUresult cuDeviceGetCount(int *count)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = sim_cfg.ndevices;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CUresult r = sim_enter_dev(__func__, ordinal);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_device_valid(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Simulated GPU (simcuda)");
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = sim_cfg.vram_bytes[dev];
    return CUDA_SUCCESS;
}

static int attribute(CUdevice_attribute a, CUdevice dev, int *known)
{
    *known = 1;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        return 0;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        return 132;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        return 1024;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        return 32;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
        return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
        return 1;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
        return 2;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        return 1 + dev; /* one card per bus, as in a server */
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
        return 0;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
        return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
        return 0;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
        return 0;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
        return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
        return 1; /* as an H200 says: PyTorch then asks cuMemCreate for RDMA-capable memory */
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG:
        return CU_DEVICE_NUMA_CONFIG_NONE;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID:
        return -1;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
        return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        return !sim_cfg.no_host_vmm;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
        return 1;
    default:
        *known = 0;
        return 0;
    }
}

SIM_EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!value || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    /* The host-NUMA attributes came with host-located memory in 12.2: an
     * older driver knows no such attribute. */
    if ((attrib == CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID ||
         attrib == CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) &&
        sim_driver_version() < SIM_HOST_VMM_SINCE)
        return CUDA_ERROR_INVALID_VALUE;
    int known;
    int v = attribute(attrib, dev, &known);
    if (!known) {
        fprintf(stderr, "simcuda: cuDeviceGetAttribute: attribute %d is not modelled\n",
                (int)attrib);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *value = v;
    return CUDA_SUCCESS;
}

/* ---- contexts: a primary context per device, a stack per thread ---- */

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    __atomic_add_fetch(&primary[dev].retains, 1, __ATOMIC_RELAXED);
    *pctx = sim_primary_ctx(dev);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (__atomic_load_n(&primary[dev].retains, __ATOMIC_RELAXED) <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    __atomic_sub_fetch(&primary[dev].retains, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    *active = __atomic_load_n(&primary[dev].retains, __ATOMIC_RELAXED) > 0;
    return CUDA_SUCCESS;
}

/* cuda.h: replaces the top of the stack (pushes onto an empty one); NULL
 * pops it. A destroyed context current here may be replaced. */
SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = sim_enter_dev(__func__, sim_ctx_device(ctx));
    if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED && !ctx)
        r = CUDA_SUCCESS;
    if (r)
        return r;
    if (ctx && sim_ctx_device(ctx) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx)
        depth -= depth > 0;
    else if (depth)
        stack[depth - 1] = ctx;
    else
        stack[depth++] = ctx;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = sim_ctx_current();
    return CUDA_SUCCESS;
}

/* The stack holds CTX_STACK contexts; a push beyond is
 * CUDA_ERROR_OUT_OF_MEMORY. */
SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult r = sim_enter_dev(__func__, sim_ctx_device(ctx));
    if (r)
        return r;
    if (!ctx || sim_ctx_device(ctx) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = ctx;
    return CUDA_SUCCESS;
}

/* A destroyed context current to this thread may still be popped. */
SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = sim_enter(__func__, false);
    if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED)
        r = CUDA_SUCCESS;
    if (r)
        return r;
    if (!depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = stack[depth - 1];
    depth--;
    return CUDA_SUCCESS;
}

/* ---- contexts the program creates ---- */

/* cuCtxCreate: a new context on dev, pushed on the calling thread's stack;
 * its streams are its own, and another context's synchronisation does not
 * wait for them. */
static CUresult ctx_create(const char *api, CUcontext *pctx, unsigned flags, CUdevice dev)
{
    CUresult r = sim_enter_dev(api, dev);
    if (r)
        return r;
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int i = SIM_MAX_DEVICES + atomic_fetch_add(&ncreated, 1);
    if (i >= SIM_MAX_CTX) {
        fprintf(stderr, "simcuda: %s: more than %d contexts created in this process\n", api,
                SIM_MAX_CTX - SIM_MAX_DEVICES);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ctxs[i].dev = dev;
    atomic_store(&ctxs[i].state, CTX_LIVE);
    if ((r = sim_ctx_open(i)) != CUDA_SUCCESS) {
        atomic_store(&ctxs[i].state, CTX_DESTROYED);
        return r;
    }
    *pctx = sim_ctx_handle(i);
    stack[depth++] = *pctx;
    return CUDA_SUCCESS;
}

/* Execution affinity and CIG (graphics interop) are not modelled. */
static CUresult refuse_affinity(const char *api)
{
    fprintf(stderr, "simcuda: %s: execution affinity and CIG are not modelled\n", api);
    return CUDA_ERROR_NOT_SUPPORTED;
}

#undef cuCtxCreate
#undef cuCtxDestroy
SIM_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                                   unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx);

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(__func__, pctx, flags, dev);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(__func__, pctx, flags, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                        CUdevice dev)
{
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    return n > 0 ? refuse_affinity(__func__) : ctx_create(__func__, pctx, flags, dev);
}

/* cuda.h: ctxCreateParams may be NULL. */
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                                   CUdevice dev)
{
    if (p &&
        (p->numExecAffinityParams < 0 || (p->numExecAffinityParams > 0 && !p->execAffinityParams)))
        return CUDA_ERROR_INVALID_VALUE;
    if (p && (p->numExecAffinityParams > 0 || p->cigParams))
        return refuse_affinity(__func__);
    return ctx_create(__func__, pctx, flags, dev);
}

/* cuda.h: waits for nothing the program must not have finished, but the
 * simulated one lets the context's queued work end first, so no worker
 * runs for a context that is gone. A primary context is not destroyed. */
static CUresult ctx_destroy(const char *api, CUcontext ctx)
{
    CUresult r = sim_inject(api);
    if (r)
        return r;
    int i = sim_ctx_index(ctx);
    if (i < SIM_MAX_DEVICES || sim_ctx_destroyed(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_ctx_close(i);
    atomic_store(&ctxs[i].state, CTX_DESTROYED);
    if (depth && stack[depth - 1] == ctx)
        depth--;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    return ctx_destroy(__func__, ctx);
}

SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return ctx_destroy(__func__, ctx);
}

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = sim_current_device();
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSynchronize(void)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    return sim_ctx_synchronize();
}

SIM_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

/* ---- peer access: every pair of distinct devices can, once enabled;
 * access is one-way and applies to cuMemAlloc memory only (VMM mappings
 * take cuMemSetAccess, pools their own access), as cuda.h describes. ---- */

SIM_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    CUresult r = sim_enter_dev(__func__, dev);
    if (r)
        return r;
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_device_valid(dev) || !sim_device_valid(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    int from = sim_current_device(), to = sim_ctx_device(peer);
    if (to < 0 || peer == sim_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned bit = 1u << to;
    if (atomic_fetch_or(&primary[from].peers, bit) & bit)
        return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    int from = sim_current_device(), to = sim_ctx_device(peer);
    if (to < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    unsigned bit = 1u << to;
    if (!(atomic_fetch_and(&primary[from].peers, ~bit) & bit))
        return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    return CUDA_SUCCESS;
}
