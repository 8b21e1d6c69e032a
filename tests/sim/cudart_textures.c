/* cudart_textures.c — the runtime's texture objects over linear memory
 * (cudaCreateTextureObject, cudaDestroyTextureObject), made by the
 * driver's (drv_texture.c) as the runtime makes them.
 *
 * Shared state: none.
 */
#include "rt.h"

#include <string.h>

SIM_EXPORT cudaError_t cudaCreateTextureObject(cudaTextureObject_t *tex,
                                               const struct cudaResourceDesc *res,
                                               const struct cudaTextureDesc *desc,
                                               const struct cudaResourceViewDesc *view)
{
    (void)view;
    if (!tex || !res || !desc)
        return cudaErrorInvalidValue;
    CUDA_RESOURCE_DESC r;
    memset(&r, 0, sizeof r);
    switch (res->resType) {
    case cudaResourceTypeLinear:
        r.resType = CU_RESOURCE_TYPE_LINEAR;
        r.res.linear.devPtr = (CUdeviceptr)(uintptr_t)res->res.linear.devPtr;
        r.res.linear.sizeInBytes = res->res.linear.sizeInBytes;
        break;
    case cudaResourceTypePitch2D:
        r.resType = CU_RESOURCE_TYPE_PITCH2D;
        r.res.pitch2D.devPtr = (CUdeviceptr)(uintptr_t)res->res.pitch2D.devPtr;
        r.res.pitch2D.width = res->res.pitch2D.width;
        r.res.pitch2D.height = res->res.pitch2D.height;
        r.res.pitch2D.pitchInBytes = res->res.pitch2D.pitchInBytes;
        break;
    default:
        return cudaErrorNotSupported; /* no arrays here */
    }
    CUDA_TEXTURE_DESC d;
    memset(&d, 0, sizeof d);
    CUtexObject t = 0;
    cudaError_t e = rt_ret_cu(cuTexObjectCreate(&t, &r, &d, NULL));
    if (e == cudaSuccess)
        *tex = (cudaTextureObject_t)t;
    return e;
}

SIM_EXPORT cudaError_t cudaDestroyTextureObject(cudaTextureObject_t tex)
{
    return rt_ret_cu(cuTexObjectDestroy((CUtexObject)tex));
}
