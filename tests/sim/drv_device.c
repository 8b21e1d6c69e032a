/* drv_device.c — the simulated device, its primary context, and the
 * context current on each thread.
 *
 * Shared state: the primary context's reference count is updated
 * atomically; the current context is thread-local.
 */
#include "sim.h"

#include <stdio.h>

/* The primary context. Its address is the CUcontext handle. */
static struct {
    int retains;
    int dummy;
} primary;
static _Thread_local CUcontext current;

CUcontext sim_ctx_current(void)
{
    return current;
}

SIM_EXPORT CUresult cuDeviceGetCount(int *count)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Simulated GPU (simcuda)");
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = sim_cfg.vram_bytes;
    return CUDA_SUCCESS;
}

static int attribute(CUdevice_attribute a, int *known)
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
        return 1;
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
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!value || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    /* The host-NUMA attributes came with host-located memory in 12.2: an
     * older driver knows no such attribute. */
    if ((attrib == CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID ||
         attrib == CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) &&
        sim_driver_version() < SIM_HOST_VMM_SINCE)
        return CUDA_ERROR_INVALID_VALUE;
    int known;
    int v = attribute(attrib, &known);
    if (!known) {
        fprintf(stderr, "simcuda: cuDeviceGetAttribute: attribute %d is not modelled\n",
                (int)attrib);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *value = v;
    return CUDA_SUCCESS;
}

/* ---- contexts: one primary context, current per thread ---- */

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    __atomic_add_fetch(&primary.retains, 1, __ATOMIC_RELAXED);
    *pctx = (CUcontext)&primary;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (__atomic_load_n(&primary.retains, __ATOMIC_RELAXED) <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    __atomic_sub_fetch(&primary.retains, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    *active = __atomic_load_n(&primary.retains, __ATOMIC_RELAXED) > 0;
    return CUDA_SUCCESS;
}

static bool valid_ctx(CUcontext c)
{
    return c == (CUcontext)&primary;
}

static CUresult set_current(const char *api, CUcontext ctx)
{
    CUresult r = sim_enter(api, false);
    if (r)
        return r;
    if (ctx && !valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    return set_current(__func__, ctx);
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    return set_current(__func__, ctx); /* one context: the stack has depth one */
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (pctx)
        *pctx = current;
    current = NULL;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = 0;
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
