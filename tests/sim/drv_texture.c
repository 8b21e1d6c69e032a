/* drv_texture.c — texture objects over linear device memory
 * (cuTexObjectCreate / cuTexObjectDestroy, over CU_RESOURCE_TYPE_LINEAR or
 * CU_RESOURCE_TYPE_PITCH2D). The simulated GPU has no texture hardware: a
 * kernel reads through an object with simcuda_texture_address, the address
 * its resource starts at. Objects over arrays are refused, as the
 * simulated GPU has no arrays.
 *
 * Shared state: the table (tex_mu). A handle is its slot + 1, never 0;
 * a destroyed slot is reused.
 */
#include "sim.h"

#include <pthread.h>

#define MAX_TEXTURES 256

static pthread_mutex_t tex_mu = PTHREAD_MUTEX_INITIALIZER;
static CUdeviceptr textures[MAX_TEXTURES]; /* 0: free */

/* Where a resource's memory starts, 0 if it is none the GPU has. */
static CUdeviceptr resource_start(const CUDA_RESOURCE_DESC *r)
{
    if (r->resType == CU_RESOURCE_TYPE_LINEAR && r->res.linear.sizeInBytes)
        return r->res.linear.devPtr;
    if (r->resType == CU_RESOURCE_TYPE_PITCH2D && r->res.pitch2D.height &&
        r->res.pitch2D.pitchInBytes)
        return r->res.pitch2D.devPtr;
    return 0;
}

SIM_EXPORT CUresult cuTexObjectCreate(CUtexObject *tex, const CUDA_RESOURCE_DESC *res,
                                      const CUDA_TEXTURE_DESC *desc,
                                      const CUDA_RESOURCE_VIEW_DESC *view)
{
    (void)view;
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!tex || !res || !desc)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr at = resource_start(res);
    if (!at)
        return res->resType == CU_RESOURCE_TYPE_LINEAR || res->resType == CU_RESOURCE_TYPE_PITCH2D
                   ? CUDA_ERROR_INVALID_VALUE
                   : CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&tex_mu);
    size_t i = 0;
    while (i < MAX_TEXTURES && textures[i])
        i++;
    if (i < MAX_TEXTURES)
        textures[i] = at;
    pthread_mutex_unlock(&tex_mu);
    if (i == MAX_TEXTURES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *tex = (CUtexObject)(i + 1);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuTexObjectDestroy(CUtexObject tex)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    pthread_mutex_lock(&tex_mu);
    int live = tex && tex <= MAX_TEXTURES && textures[tex - 1];
    if (live)
        textures[tex - 1] = 0;
    pthread_mutex_unlock(&tex_mu);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT void *simcuda_texture_address(unsigned long long tex)
{
    pthread_mutex_lock(&tex_mu);
    CUdeviceptr at = tex && tex <= MAX_TEXTURES ? textures[tex - 1] : 0;
    pthread_mutex_unlock(&tex_mu);
    return (void *)(uintptr_t)at;
}
