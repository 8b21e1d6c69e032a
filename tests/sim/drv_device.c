/* drv_device.c — the simulated devices (SIMCUDA_DEVICES), their primary
 * contexts, the context stack of each thread, and peer access.
 *
 * Shared state: each primary context's reference count is updated
 * atomically, as is each context's peer mask; the context stack and the
 * device a stream worker runs are thread-local.
 */
#include "sim.h"

#include <stdio.h>

/* A primary context. Its address is the CUcontext handle. */
struct sim_ctx {
    int retains;
    atomic_uint peers; /* bit e: peer access to device e's memory enabled */
};
static struct sim_ctx primary[SIM_MAX_DEVICES];

/* The thread's context stack; the current context is its top. */
#define CTX_STACK 64
static _Thread_local CUcontext stack[CTX_STACK];
static _Thread_local int depth;
static _Thread_local int running = -1; /* a stream worker's device */

CUcontext sim_ctx_current(void)
{
    return depth ? stack[depth - 1] : NULL;
}

int sim_ctx_device(CUcontext ctx)
{
    const struct sim_ctx *c = (const struct sim_ctx *)ctx;
    if (c < primary || c >= primary + sim_cfg.ndevices)
        return -1;
    return (int)(c - primary);
}

int sim_current_device(void)
{
    CUcontext c = sim_ctx_current();
    return c ? sim_ctx_device(c) : 0;
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
 * pops it. */
SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = sim_enter_dev(__func__, sim_ctx_device(ctx));
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

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (pctx)
        *pctx = stack[depth - 1];
    depth--;
    return CUDA_SUCCESS;
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
