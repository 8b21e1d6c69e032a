/* hooks.c — exported launch and copy entry points.
 *
 * In hook mode (no CUPTI) the launch hooks do what the CUPTI callbacks
 * would: scan, restore, hold the gate while issuing. In CUPTI mode they are
 * plain pass-throughs. The copy and memset hooks hold the gate's read side
 * in both modes, so no copy is issued into a range inside a remap window.
 * cuGetProcAddress hands out the hooks too, so callers that look the
 * driver up by name are seen as well.
 *
 * Shared state: the real entry points, resolved once.
 */
#include "interpose/interpose.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static struct {
    __typeof__(cudaLaunchKernel) *cudaLaunchKernel;
    __typeof__(cudaLaunchCooperativeKernel) *cudaLaunchCooperativeKernel;
    cudaError_t (*launch_kernel13)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
    __typeof__(cudaMemcpy) *cudaMemcpy;
    __typeof__(cudaMemcpyAsync) *cudaMemcpyAsync;
    __typeof__(cudaMemset) *cudaMemset;
    __typeof__(cudaMemsetAsync) *cudaMemsetAsync;
    __typeof__(cuLaunchKernel) *cuLaunchKernel;
    __typeof__(cuLaunchKernelEx) *cuLaunchKernelEx;
    __typeof__(cuLaunchCooperativeKernel) *cuLaunchCooperativeKernel;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define R(field, name) real.field = (__typeof__(real.field))dlsym(RTLD_NEXT, name)
    R(cudaLaunchKernel, "cudaLaunchKernel");
    R(cudaLaunchCooperativeKernel, "cudaLaunchCooperativeKernel");
    R(launch_kernel13, "__cudaLaunchKernel");
    R(cudaMemcpy, "cudaMemcpy");
    R(cudaMemcpyAsync, "cudaMemcpyAsync");
    R(cudaMemset, "cudaMemset");
    R(cudaMemsetAsync, "cudaMemsetAsync");
    /* The driver's own, for when the library is off and its table empty. */
    R(cuLaunchKernel, "cuLaunchKernel");
    R(cuLaunchKernelEx, "cuLaunchKernelEx");
    R(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel");
#undef R
}

/* 1 when this call must be seen by the hooks (not by CUPTI). */
static int hooking(void)
{
    pthread_once(&real_once, resolve);
    return sh_managed() && sh_launch_mode() == SH_TRACK_HOOKS;
}

static int gating(void)
{
    pthread_once(&real_once, resolve);
    return sh_managed();
}

/* ---- runtime launches ---- */

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shmem,
                                    cudaStream_t s)
{
    if (!hooking())
        return real.cudaLaunchKernel(func, g, b, args, shmem, s);
    sh_launch_begin(func, SH_KEY_HOST_FN, args, (CUstream)s);
    cudaError_t e = real.cudaLaunchKernel(func, g, b, args, shmem, s);
    sh_launch_end();
    return e;
}

EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 g, dim3 b, void **args,
                                               size_t shmem, cudaStream_t s)
{
    if (!hooking())
        return real.cudaLaunchCooperativeKernel(func, g, b, args, shmem, s);
    sh_launch_begin(func, SH_KEY_HOST_FN, args, (CUstream)s);
    cudaError_t e = real.cudaLaunchCooperativeKernel(func, g, b, args, shmem, s);
    sh_launch_end();
    return e;
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shmem,
                                      cudaStream_t s);
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shmem,
                               cudaStream_t s)
{
    if (!hooking())
        return real.launch_kernel13(k, g, b, args, shmem, s);
    sh_launch_begin(k, SH_KEY_KERNEL, args, (CUstream)s);
    cudaError_t e = real.launch_kernel13(k, g, b, args, shmem, s);
    sh_launch_end();
    return e;
}

/* ---- driver launches ---- */

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                               void **extra)
{
    if (!hooking())
        return real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    sh_launch_begin(f, SH_KEY_FUNCTION, params, s);
    CUresult r = sh_rt.drv.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    sh_launch_end();
    return r;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                 void **extra)
{
    if (!hooking())
        return real.cuLaunchKernelEx(config, f, params, extra);
    sh_launch_begin(f, SH_KEY_FUNCTION, params, config ? config->hStream : NULL);
    CUresult r = sh_rt.drv.cuLaunchKernelEx(config, f, params, extra);
    sh_launch_end();
    return r;
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                          CUstream s, void **params)
{
    if (!hooking())
        return real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
    sh_launch_begin(f, SH_KEY_FUNCTION, params, s);
    CUresult r = sh_rt.drv.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
    sh_launch_end();
    return r;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    static const struct {
        const char *name;
        void *hook;
    } hooks[] = {
        {"cuLaunchKernel", (void *)cuLaunchKernel},
        {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
        {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    };
    if (!sh_rt.drv.cuGetProcAddress) /* the library is off: find the driver's own */
        return ((__typeof__(cuGetProcAddress_v2) *)dlsym(RTLD_NEXT, "cuGetProcAddress_v2"))(
            symbol, pfn, version, flags, status);
    CUresult r = sh_rt.drv.cuGetProcAddress(symbol, pfn, version, flags, status);
    for (size_t i = 0; r == CUDA_SUCCESS && symbol && i < sizeof hooks / sizeof *hooks; i++)
        if (strcmp(symbol, hooks[i].name) == 0)
            *pfn = hooks[i].hook;
    return r;
}

/* ---- copies and memsets: issued outside remap windows ---- */

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    if (!gating())
        return real.cudaMemcpy(dst, src, n, kind);
    sh_gate_enter(sh_rt.gate);
    if (kind == cudaMemcpyHostToDevice)
        sh_launch_mark_upload(dst, src, n);
    cudaError_t e = real.cudaMemcpy(dst, src, n, kind);
    sh_launch_mark_copy(NULL, dst, src, n); /* device-to-device copies may still run */
    sh_gate_leave(sh_rt.gate);
    return e;
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s)
{
    if (!gating())
        return real.cudaMemcpyAsync(dst, src, n, kind, s);
    sh_gate_enter(sh_rt.gate);
    if (kind == cudaMemcpyHostToDevice)
        sh_launch_mark_upload(dst, src, n);
    cudaError_t e = real.cudaMemcpyAsync(dst, src, n, kind, s);
    sh_launch_mark_copy((CUstream)s, dst, src, n);
    sh_gate_leave(sh_rt.gate);
    return e;
}

EXPORT cudaError_t cudaMemset(void *dst, int v, size_t n)
{
    if (!gating())
        return real.cudaMemset(dst, v, n);
    sh_gate_enter(sh_rt.gate);
    cudaError_t e = real.cudaMemset(dst, v, n);
    sh_launch_mark_copy(NULL, dst, NULL, n);
    sh_gate_leave(sh_rt.gate);
    return e;
}

EXPORT cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
    if (!gating())
        return real.cudaMemsetAsync(dst, v, n, s);
    sh_gate_enter(sh_rt.gate);
    cudaError_t e = real.cudaMemsetAsync(dst, v, n, s);
    sh_launch_mark_copy((CUstream)s, dst, NULL, n);
    sh_gate_leave(sh_rt.gate);
    return e;
}
