/* contexts.c — the contexts a program creates itself: cuCtxCreate in each
 * of its versions and cuCtxDestroy, however the program found them
 * (intercept.c and dlsym.c hand out these exports).
 *
 * A kernel in a created context on the managed device reaches every
 * region (a mapping's access is per device, not per context), but the
 * managed device's primary context, which a drain synchronises, does not
 * wait for it. So each such context is noted at creation and waited for by
 * every drain after (peermap.c), and forgotten when it is destroyed, its
 * work waited for first (a tracked drain's events made there go with it,
 * launch.c); the destruction holds drains off, since cuda.h forbids any
 * call that uses a context while cuCtxDestroy runs. Green contexts need
 * nothing here: the primary context's cuCtxSynchronize waits for them
 * (cuda.h).
 *
 * Shared state: the real functions, resolved once.
 */
#include "interpose/intercept.h"

#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

/* cuda.h renames both to their newest version; every version is exported. */
#undef cuCtxCreate
#undef cuCtxDestroy

typedef CUresult (*create_v2_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*create_v3_fn)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
typedef CUresult (*create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult (*destroy_fn)(CUcontext);

/* Found at their first call (sh_icept_lazy): a cuCtxCreate may come
 * before anything else loads the driver. */
static void *_Atomic real[6];
#define REAL(i, type, name) ((type)sh_icept_lazy(&real[i], 0, name))

static CUresult created(CUresult r, CUcontext *pctx, CUdevice dev)
{
    if (r == CUDA_SUCCESS && pctx && *pctx)
        sh_peers_own(*pctx, (int)dev);
    return r;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    create_v2_fn f = REAL(0, create_v2_fn, "cuCtxCreate");
    return f ? created(f(pctx, flags, dev), pctx, dev) : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    create_v2_fn f = REAL(1, create_v2_fn, "cuCtxCreate_v2");
    return f ? created(f(pctx, flags, dev), pctx, dev) : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                        CUdevice dev)
{
    create_v3_fn f = REAL(2, create_v3_fn, "cuCtxCreate_v3");
    return f ? created(f(pctx, params, n, flags, dev), pctx, dev) : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                        CUdevice dev)
{
    create_v4_fn f = REAL(3, create_v4_fn, "cuCtxCreate_v4");
    return f ? created(f(pctx, params, flags, dev), pctx, dev) : CUDA_ERROR_NOT_FOUND;
}

/* Waits for ctx's work, so that nothing it issued runs once it is
 * forgotten, whatever the driver's destruction waits for. Before the
 * library manages anything no region exists for it to touch. */
static void settle(CUcontext ctx)
{
    const struct sh_driver *d = &sh_rt.drv;
    CUcontext popped;
    if (!sh_managed() || d->cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
        return;
    d->cuCtxSynchronize();
    d->cuCtxPopCurrent(&popped);
}

/* The context is forgotten only if the driver destroyed it: one it refused
 * may still run work. */
static CUresult destroy(destroy_fn f, CUcontext ctx)
{
    if (!f)
        return CUDA_ERROR_NOT_FOUND;
    sh_peers_destroying(1);
    settle(ctx);
    CUresult r = f(ctx);
    if (r == CUDA_SUCCESS) {
        sh_peers_forget(ctx);
        if (sh_managed())
            sh_slots_forget_context(ctx);
    }
    sh_peers_destroying(0);
    return r;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxDestroy(CUcontext ctx)
{
    return destroy(REAL(4, destroy_fn, "cuCtxDestroy"), ctx);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return destroy(REAL(5, destroy_fn, "cuCtxDestroy_v2"), ctx);
}
