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

static struct {
    create_v2_fn create_v1, create_v2;
    create_v3_fn create_v3;
    create_v4_fn create_v4;
    destroy_fn destroy_v1, destroy_v2;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define REAL(field, type, name) real.field = (type)sh_icept_lookup(0, name)
    REAL(create_v1, create_v2_fn, "cuCtxCreate");
    REAL(create_v2, create_v2_fn, "cuCtxCreate_v2");
    REAL(create_v3, create_v3_fn, "cuCtxCreate_v3");
    REAL(create_v4, create_v4_fn, "cuCtxCreate_v4");
    REAL(destroy_v1, destroy_fn, "cuCtxDestroy");
    REAL(destroy_v2, destroy_fn, "cuCtxDestroy_v2");
#undef REAL
}

#define RESOLVE() pthread_once(&real_once, resolve)

static CUresult created(CUresult r, CUcontext *pctx, CUdevice dev)
{
    if (r == CUDA_SUCCESS && pctx && *pctx)
        sh_peers_own(*pctx, (int)dev);
    return r;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    RESOLVE();
    if (!real.create_v1)
        return CUDA_ERROR_NOT_FOUND;
    return created(real.create_v1(pctx, flags, dev), pctx, dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    RESOLVE();
    if (!real.create_v2)
        return CUDA_ERROR_NOT_FOUND;
    return created(real.create_v2(pctx, flags, dev), pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                        CUdevice dev)
{
    RESOLVE();
    if (!real.create_v3)
        return CUDA_ERROR_NOT_FOUND;
    return created(real.create_v3(pctx, params, n, flags, dev), pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                        CUdevice dev)
{
    RESOLVE();
    if (!real.create_v4)
        return CUDA_ERROR_NOT_FOUND;
    return created(real.create_v4(pctx, params, flags, dev), pctx, dev);
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
            sh_launch_forget_context(ctx);
    }
    sh_peers_destroying(0);
    return r;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxDestroy(CUcontext ctx)
{
    RESOLVE();
    return destroy(real.destroy_v1, ctx);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    RESOLVE();
    return destroy(real.destroy_v2, ctx);
}
