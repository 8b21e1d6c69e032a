/* peers.c — the program's peer-access calls: cuCtxEnablePeerAccess,
 * cuCtxDisablePeerAccess and their runtime forms, however the program
 * found them (intercept.c and dlsym.c hand out these exports).
 *
 * Each passes through, and what it did becomes a link in peermap.c, which
 * gives the peer device access to every mapping the library makes (peer
 * access alone does not reach VMM memory) and makes drains wait for the
 * context that opened it. A runtime call reaches the driver's, through
 * these hooks too where it looks the driver up as a program would; a link
 * is recorded once either way. Links are recorded before the library
 * manages anything as well: mappings made later read them.
 *
 * Shared state: the real functions, resolved once.
 */
#include "interpose/intercept.h"

#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

static struct {
    __typeof__(cuCtxEnablePeerAccess) *enable;
    __typeof__(cuCtxDisablePeerAccess) *disable;
    __typeof__(cuCtxGetCurrent) *current;
    __typeof__(cuCtxGetDevice) *device;
    __typeof__(cuCtxPushCurrent_v2) *push;
    __typeof__(cuCtxPopCurrent_v2) *pop;
    __typeof__(cudaDeviceEnablePeerAccess) *rt_enable;
    __typeof__(cudaDeviceDisablePeerAccess) *rt_disable;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define REAL(field, rt, name) real.field = (__typeof__(real.field))sh_icept_lookup(rt, name)
    REAL(enable, 0, "cuCtxEnablePeerAccess");
    REAL(disable, 0, "cuCtxDisablePeerAccess");
    REAL(current, 0, "cuCtxGetCurrent");
    REAL(device, 0, "cuCtxGetDevice");
    REAL(push, 0, "cuCtxPushCurrent_v2");
    REAL(pop, 0, "cuCtxPopCurrent_v2");
    REAL(rt_enable, 1, "cudaDeviceEnablePeerAccess");
    REAL(rt_disable, 1, "cudaDeviceDisablePeerAccess");
#undef REAL
}

#define RESOLVE() pthread_once(&real_once, resolve)

/* The device of ctx; -1 if the driver cannot say. */
static int device_of(CUcontext ctx)
{
    CUdevice dev = -1;
    CUcontext popped;
    if (!ctx || !real.push || !real.device || real.push(ctx) != CUDA_SUCCESS)
        return -1;
    if (real.device(&dev) != CUDA_SUCCESS)
        dev = -1;
    real.pop(&popped);
    return (int)dev;
}

/* The calling thread's current context opened (on = 1) or closed its
 * access to device `to`. */
static void link_current(int to, int on)
{
    CUcontext ctx = NULL;
    CUdevice from = -1;
    if (!real.current || !real.device || real.current(&ctx) != CUDA_SUCCESS || !ctx ||
        real.device(&from) != CUDA_SUCCESS)
        return;
    sh_peers_link(&sh_rt.drv, ctx, (int)from, to, on);
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    RESOLVE();
    if (!real.enable)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real.enable(peer, flags);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        link_current(device_of(peer), 1);
    return r;
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    RESOLVE();
    if (!real.disable)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real.disable(peer);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
        link_current(device_of(peer), 0);
    return r;
}

EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    RESOLVE();
    if (!real.rt_enable)
        return cudaErrorSymbolNotFound;
    cudaError_t e = real.rt_enable(peer, flags);
    if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled)
        link_current(peer, 1); /* the runtime made the current device's context current */
    return e;
}

EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peer)
{
    RESOLVE();
    if (!real.rt_disable)
        return cudaErrorSymbolNotFound;
    cudaError_t e = real.rt_disable(peer);
    if (e == cudaSuccess || e == cudaErrorPeerAccessNotEnabled)
        link_current(peer, 0);
    return e;
}
