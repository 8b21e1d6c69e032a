/* hooks.c — the launch entry points the CUDA headers do not declare.
 *
 * CUDA 13's runtime launch stubs call __cudaLaunchKernel (_ptsz with
 * per-thread default streams), which no public header declares, so the interception table
 * (intercept.def) cannot list it. While the library does not hold CUPTI
 * it does what the CUPTI callbacks would: scan, restore, hold the gate
 * while issuing; otherwise it leaves the launch to them. In both it refuses a launch while memory
 * the driver failed to map again cannot be mapped (pool/repair.c), as the table's wrappers do.
 *
 * Shared state: the real entry point, resolved once.
 */
#include "interpose/intercept.h"

#include <dlfcn.h>
#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

typedef cudaError_t (*launch13_fn)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
static launch13_fn real_launch13, real_launch13_ptsz;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
    real_launch13 = (launch13_fn)sh_dl_lookup(RTLD_NEXT, "__cudaLaunchKernel");
    real_launch13_ptsz = (launch13_fn)sh_dl_lookup(RTLD_NEXT, "__cudaLaunchKernel_ptsz");
}

static cudaError_t launch13(launch13_fn real, cudaKernel_t k, dim3 g, dim3 b, void **args,
                            size_t shmem, cudaStream_t s, CUstream tracked)
{
    if (!real)
        return cudaErrorSymbolNotFound;
    if (!sh_managed())
        return real(k, g, b, args, shmem, s);
    struct sh_work w = {.kind = SH_WORK_LAUNCH};
    if (sh_work_refused(&w))
        return cudaErrorMemoryAllocation;
    if (sh_cupti_pass_begin()) {
        cudaError_t e = real(k, g, b, args, shmem, s);
        sh_cupti_pass_end();
        return e;
    }
    sh_launch_begin(k, SH_KEY_KERNEL, args, tracked);
    cudaError_t e = real(k, g, b, args, shmem, s);
    sh_launch_end();
    return e;
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shmem,
                                      cudaStream_t s);
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shmem,
                               cudaStream_t s)
{
    pthread_once(&real_once, resolve);
    return launch13(real_launch13, k, g, b, args, shmem, s, (CUstream)s);
}

/* Programs built with --default-stream per-thread launch through this one. */
EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t k, dim3 g, dim3 b, void **args,
                                           size_t shmem, cudaStream_t s);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shmem,
                                    cudaStream_t s)
{
    pthread_once(&real_once, resolve);
    return launch13(real_launch13_ptsz, k, g, b, args, shmem, s, sh_stream_ptsz((CUstream)s));
}
