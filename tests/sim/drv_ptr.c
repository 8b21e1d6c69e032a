/* drv_ptr.c — the simulated driver's pointer queries: cuPointerGetAttribute,
 * cuPointerGetAttributes and cuMemGetAddressRange, over what drv_mem.c
 * knows of an address (sim_ptr_info).
 *
 * Shared state: none.
 */
#include "sim.h"

#include <string.h>

/* One attribute of known memory; CUDA_ERROR_INVALID_VALUE where it has none. */
static CUresult attribute(void *data, CUpointer_attribute a, uintptr_t p,
                          const struct sim_ptr_info *i)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = (unsigned)i->type;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (i->type != CU_MEMORYTYPE_HOST || i->vmm)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = i->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = i->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = i->dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = i->type == CU_MEMORYTYPE_DEVICE && !i->vmm;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = i->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_CONTEXT: /* device memory: its device's */
        *(CUcontext *)data =
            i->type == CU_MEMORYTYPE_DEVICE ? sim_primary_ctx(i->dev) : sim_ctx_current();
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* The bytes an attribute's value takes: enums and booleans are 4. */
static size_t attr_size(CUpointer_attribute a)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        return 4;
    default:
        return 8;
    }
}

SIM_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr ptr)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_ptr_info i = sim_ptr_info(ptr);
    return i.type ? attribute(data, a, ptr, &i) : CUDA_ERROR_INVALID_VALUE;
}

/* Unlike cuPointerGetAttribute, memory the driver does not know is no
 * error: its attributes read as zero (cuda.h). */
SIM_EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data,
                                           CUdeviceptr ptr)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_ptr_info i = sim_ptr_info(ptr);
    for (unsigned k = 0; k < n; k++) {
        if (!data[k])
            return CUDA_ERROR_INVALID_VALUE;
        if (!i.type || attribute(data[k], attrs[k], ptr, &i) != CUDA_SUCCESS)
            memset(data[k], 0, attr_size(attrs[k]));
    }
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_ptr_info i = sim_ptr_info(dptr);
    if (i.type != CU_MEMORYTYPE_DEVICE && !i.vmm)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = i.base;
    if (psize)
        *psize = i.size;
    return CUDA_SUCCESS;
}
