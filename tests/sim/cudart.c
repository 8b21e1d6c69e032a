/* cudart.c — the simulated CUDA runtime (libcudart.so.13), built on the
 * simulated driver as the real runtime is built on the real one: it
 * initialises the driver lazily, makes the primary context current on each
 * thread, maps driver results to runtime errors and keeps the per-thread
 * last error. Launches raise runtime API callbacks, then call the driver,
 * which raises its own, as on a GPU (a tool sees both).
 *
 * Shared state: none beyond the once-flag; the last error and the "context
 * is current" flag are thread-local.
 */
#include "sim.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>

SIM_EXPORT void simcuda__api_enter(struct sim_api_call *call, int domain, int cbid,
                                   const char *fname, const char *symbol, const void *params);
SIM_EXPORT void simcuda__api_exit(struct sim_api_call *call, void *ret);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result;
static CUcontext primary_ctx;
static _Thread_local bool ctx_set;
static _Thread_local cudaError_t last_error;

static void init(void)
{
    CUdevice dev;
    init_result = cuInit(0);
    if (init_result == CUDA_SUCCESS)
        init_result = cuDeviceGet(&dev, 0);
    if (init_result == CUDA_SUCCESS)
        init_result = cuDevicePrimaryCtxRetain(&primary_ctx, dev);
}

static cudaError_t to_rt(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_CONTEXT:
        return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE:
        return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_READY:
        return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        return cudaErrorIllegalAddress;
    case CUDA_ERROR_INVALID_DEVICE:
        return cudaErrorInvalidDevice;
    case CUDA_ERROR_NOT_SUPPORTED:
        return cudaErrorNotSupported;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        return cudaErrorHostMemoryAlreadyRegistered;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
        return cudaErrorHostMemoryNotRegistered;
    default:
        return (cudaError_t)r; /* the remaining codes share their values */
    }
}

/* Records err as the thread's last error (success never overwrites it). */
static cudaError_t ret(cudaError_t err)
{
    if (err != cudaSuccess && err != cudaErrorNotReady)
        last_error = err;
    return err;
}

static cudaError_t ret_cu(CUresult r)
{
    return ret(to_rt(r));
}

/* Lazy initialisation and a current context on this thread. */
static cudaError_t enter(void)
{
    pthread_once(&init_once, init);
    if (init_result != CUDA_SUCCESS)
        return ret_cu(init_result);
    if (!ctx_set) {
        CUresult r = cuCtxSetCurrent(primary_ctx);
        if (r != CUDA_SUCCESS)
            return ret_cu(r);
        ctx_set = true;
    }
    return cudaSuccess;
}

#define ENTER()                                                                                    \
    do {                                                                                           \
        cudaError_t e_ = enter();                                                                  \
        if (e_ != cudaSuccess)                                                                     \
            return e_;                                                                             \
    } while (0)

int sim_refuse_runtime(const char *name, int code);
int sim_refuse_runtime(const char *name, int code)
{
    fprintf(stderr, "simcuda: %s is not supported by the simulated runtime\n", name);
    return ret(code);
}

/* ---- errors and versions ---- */

SIM_EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    CUcontext c;
    CUresult sticky = cuCtxGetCurrent(&c);
    if (sticky == CUDA_ERROR_ILLEGAL_ADDRESS) /* sticky errors cannot be cleared */
        last_error = e = to_rt(sticky);
    return e;
}

SIM_EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

SIM_EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    const char *s = NULL;
    if (error == cudaErrorInvalidDeviceFunction)
        return "cudaErrorInvalidDeviceFunction";
    if (error == cudaErrorInvalidMemcpyDirection)
        return "cudaErrorInvalidMemcpyDirection";
    if (error == cudaErrorMemoryAllocation)
        return "cudaErrorMemoryAllocation";
    if (error == cudaErrorIllegalAddress)
        return "cudaErrorIllegalAddress";
    if (error == cudaErrorInvalidValue)
        return "cudaErrorInvalidValue";
    if (error == cudaSuccess)
        return "cudaSuccess";
    cuGetErrorName((CUresult)error, &s);
    return s ? s : "unrecognized error code";
}

SIM_EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    const char *s = NULL;
    if (error == cudaErrorInvalidDeviceFunction)
        return "invalid device function";
    if (error == cudaErrorInvalidMemcpyDirection)
        return "invalid copy direction for memcpy";
    if (error == cudaErrorMemoryAllocation)
        return "out of memory";
    cuGetErrorString((CUresult)error, &s);
    return s ? s : "unrecognized error code";
}

SIM_EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
    return ret_cu(cuDriverGetVersion(v));
}

SIM_EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* ---- devices ---- */

SIM_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    pthread_once(&init_once, init);
    if (init_result != CUDA_SUCCESS && init_result != CUDA_ERROR_ILLEGAL_ADDRESS)
        return ret(cudaErrorNoDevice);
    return ret_cu(cuDeviceGetCount(count));
}

SIM_EXPORT cudaError_t cudaGetDevice(int *device)
{
    ENTER();
    if (!device)
        return ret(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaSetDevice(int device)
{
    ENTER();
    return device == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

SIM_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    return ret_cu(cuCtxSynchronize());
}

SIM_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    ENTER();
    return ret_cu(cuDeviceGetAttribute(value, (CUdevice_attribute)attr, device));
}

SIM_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER();
    return ret_cu(cuCtxGetStreamPriorityRange(least, greatest));
}

/* ---- memory ---- */

SIM_EXPORT cudaError_t cudaMalloc(void **p, size_t size)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *p = NULL; /* the runtime accepts 0 and returns NULL */
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc(&d, size);
    *p = (void *)(uintptr_t)d;
    return ret_cu(r);
}

SIM_EXPORT cudaError_t cudaFree(void *p)
{
    ENTER();
    return ret_cu(cuMemFree((CUdeviceptr)(uintptr_t)p));
}

SIM_EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocAsync(&d, size, (CUstream)s);
    *p = (void *)(uintptr_t)d;
    return ret_cu(r);
}

SIM_EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    ENTER();
    if (!p)
        return cudaSuccess;
    return ret_cu(cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, (CUstream)s));
}

SIM_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    ENTER();
    return ret_cu(cuMemGetInfo(free_bytes, total));
}

SIM_EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    ENTER();
    return ret_cu(cuMemHostAlloc(p, size, flags));
}

SIM_EXPORT cudaError_t cudaMallocHost(void **p, size_t size)
{
    return cudaHostAlloc(p, size, 0);
}

SIM_EXPORT cudaError_t cudaFreeHost(void *p)
{
    ENTER();
    return ret_cu(cuMemFreeHost(p));
}

SIM_EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    ENTER();
    return ret_cu(cuMemHostRegister(p, size, flags));
}

SIM_EXPORT cudaError_t cudaHostUnregister(void *p)
{
    ENTER();
    return ret_cu(cuMemHostUnregister(p));
}

static bool valid_kind(enum cudaMemcpyKind kind)
{
    return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault;
}

SIM_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    ENTER();
    if (!valid_kind(kind))
        return ret(cudaErrorInvalidMemcpyDirection);
    return ret_cu(cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n));
}

SIM_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                       enum cudaMemcpyKind kind, cudaStream_t s)
{
    ENTER();
    if (!valid_kind(kind))
        return ret(cudaErrorInvalidMemcpyDirection);
    return ret_cu(
        cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)s));
}

SIM_EXPORT cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    ENTER();
    return ret_cu(cuMemsetD8((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, n));
}

SIM_EXPORT cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s)
{
    ENTER();
    return ret_cu(
        cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, n, (CUstream)s));
}

/* ---- streams and events ---- */

SIM_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags,
                                                    int priority)
{
    ENTER();
    return ret_cu(cuStreamCreateWithPriority((CUstream *)s, flags, priority));
}

SIM_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    return cudaStreamCreateWithPriority(s, flags, 0);
}

SIM_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithPriority(s, cudaStreamDefault, 0);
}

SIM_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENTER();
    return ret_cu(cuStreamDestroy((CUstream)s));
}

SIM_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ENTER();
    return ret_cu(cuStreamSynchronize((CUstream)s));
}

SIM_EXPORT cudaError_t cudaStreamQuery(cudaStream_t s)
{
    ENTER();
    return ret_cu(cuStreamQuery((CUstream)s));
}

SIM_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    ENTER();
    return ret_cu(cuStreamWaitEvent((CUstream)s, (CUevent)e, flags));
}

SIM_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    ENTER();
    return ret_cu(cuStreamIsCapturing((CUstream)s, (CUstreamCaptureStatus *)status));
}

SIM_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority)
{
    ENTER();
    return ret_cu(cuStreamGetPriority((CUstream)s, priority));
}

SIM_EXPORT cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags)
{
    ENTER();
    return ret_cu(cuStreamGetFlags((CUstream)s, flags));
}

SIM_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user)
{
    ENTER();
    return ret_cu(cuLaunchHostFunc((CUstream)s, fn, user));
}

SIM_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    ENTER();
    return ret_cu(cuEventCreate((CUevent *)e, flags));
}

SIM_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

SIM_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    ENTER();
    return ret_cu(cuEventDestroy((CUevent)e));
}

SIM_EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER();
    return ret_cu(cuEventRecord((CUevent)e, (CUstream)s));
}

SIM_EXPORT cudaError_t cudaEventQuery(cudaEvent_t e)
{
    ENTER();
    return ret_cu(cuEventQuery((CUevent)e));
}

SIM_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    ENTER();
    return ret_cu(cuEventSynchronize((CUevent)e));
}

SIM_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    ENTER();
    return ret_cu(cuEventElapsedTime((float *)ms, (CUevent)a, (CUevent)b));
}

/* ---- capture and graphs ---- */

SIM_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    ENTER();
    return ret_cu(cuStreamBeginCapture((CUstream)s, (CUstreamCaptureMode)mode));
}

SIM_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    ENTER();
    return ret_cu(cuStreamEndCapture((CUstream)s, (CUgraph *)graph));
}

SIM_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                            unsigned long long flags)
{
    ENTER();
    return ret_cu(cuGraphInstantiate((CUgraphExec *)exec, (CUgraph)graph, flags));
}

SIM_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                                     unsigned long long flags)
{
    return cudaGraphInstantiate(exec, graph, flags);
}

SIM_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    ENTER();
    cudaGraphLaunch_v10000_params p = {exec, s};
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API,
                       CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000, "cudaGraphLaunch", NULL,
                       &p);
    cudaError_t r = ret_cu(cuGraphLaunch((CUgraphExec)exec, (CUstream)s));
    simcuda__api_exit(&call, &r);
    return r;
}

SIM_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    ENTER();
    return ret_cu(cuGraphDestroy((CUgraph)graph));
}

SIM_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ENTER();
    return ret_cu(cuGraphExecDestroy((CUgraphExec)exec));
}

/* ---- launches ---- */

static cudaError_t launch(CUfunction f, dim3 g, dim3 b, void **args, size_t shmem, cudaStream_t s)
{
    if (!f)
        return ret(cudaErrorInvalidDeviceFunction);
    return ret_cu(
        cuLaunchKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem, (CUstream)s, args, NULL));
}

SIM_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                        size_t sharedMem, cudaStream_t stream)
{
    ENTER();
    cudaLaunchKernel_v7000_params p = {func, gridDim, blockDim, args, sharedMem, stream};
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API,
                       CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cudaLaunchKernel", NULL,
                       &p);
    cudaError_t r = launch(simcuda_function((simcuda_kernel_fn)func), gridDim, blockDim, args,
                           sharedMem, stream);
    simcuda__api_exit(&call, &r);
    return r;
}

SIM_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                                   void **args, size_t sharedMem,
                                                   cudaStream_t stream)
{
    ENTER();
    cudaLaunchCooperativeKernel_v9000_params p = {func, gridDim, blockDim, args, sharedMem, stream};
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API,
                       CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
                       "cudaLaunchCooperativeKernel", NULL, &p);
    CUfunction f = simcuda_function((simcuda_kernel_fn)func);
    cudaError_t r = f ? ret_cu(cuLaunchCooperativeKernel(
                            f, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z,
                            (unsigned)sharedMem, (CUstream)stream, args))
                      : ret(cudaErrorInvalidDeviceFunction);
    simcuda__api_exit(&call, &r);
    return r;
}

/* What nvcc-generated launch stubs call in CUDA 13: a kernel handle from
 * __cudaGetKernel, then __cudaLaunchKernel. */
SIM_EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func)
{
    ENTER();
    if (!kernel)
        return ret(cudaErrorInvalidValue);
    *kernel = (cudaKernel_t)simcuda_function((simcuda_kernel_fn)func);
    return *kernel ? cudaSuccess : ret(cudaErrorInvalidDeviceFunction);
}

typedef struct {
    cudaKernel_t kernel;
    dim3 gridDim, blockDim;
    void **args;
    size_t sharedMem;
    cudaStream_t stream;
} sim_cudaLaunchKernel_v13000_params;

SIM_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                          void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream)
{
    ENTER();
    sim_cudaLaunchKernel_v13000_params p = {kernel, gridDim, blockDim, args, sharedMem, stream};
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API,
                       CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000, "__cudaLaunchKernel",
                       NULL, &p);
    cudaError_t r = launch((CUfunction)kernel, gridDim, blockDim, args, sharedMem, stream);
    simcuda__api_exit(&call, &r);
    return r;
}

SIM_EXPORT cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    ENTER();
    if (!functionPtr)
        return ret(cudaErrorInvalidValue);
    *functionPtr = (cudaFunction_t)simcuda_function((simcuda_kernel_fn)symbolPtr);
    return *functionPtr ? cudaSuccess : ret(cudaErrorInvalidDeviceFunction);
}
