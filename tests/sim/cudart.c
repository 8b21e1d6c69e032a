/* cudart.c — the simulated CUDA runtime (libcudart.so.13), built on the
 * simulated driver as the real runtime is built on the real one: it
 * initialises the driver lazily, makes the primary context current on each
 * thread, maps driver results to runtime errors and keeps the per-thread
 * last error. This file has that state, the errors and the devices;
 * cudart_mem.c and cudart_work.c the rest (rt.h).
 *
 * Each thread has a current device, as in CUDA: device 0 until it calls
 * cudaSetDevice, or the device of a context it made current through the
 * driver. The runtime retains each device's primary context the first time
 * it needs it.
 *
 * Shared state: the once-flag, and the primary contexts retained so far
 * (ctx_mu); the last error and the "context is current" flag are
 * thread-local.
 */
#include "rt.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result;
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary_ctx[SIM_MAX_DEVICES]; /* ctx_mu */
static _Thread_local bool ctx_set;
static _Thread_local cudaError_t last_error;

static void init(void)
{
    CUdevice dev;
    init_result = cuInit(0);
    if (init_result == CUDA_SUCCESS)
        init_result = cuDeviceGet(&dev, 0);
    if (init_result == CUDA_SUCCESS)
        init_result = cuDevicePrimaryCtxRetain(&primary_ctx[0], dev);
}

bool rt_device_valid(int dev)
{
    return dev >= 0 && dev < simcuda__device_count();
}

CUresult rt_primary(int dev, CUcontext *out)
{
    if (!rt_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mu);
    CUresult r = CUDA_SUCCESS;
    if (!primary_ctx[dev])
        r = cuDevicePrimaryCtxRetain(&primary_ctx[dev], dev);
    *out = primary_ctx[dev];
    pthread_mutex_unlock(&ctx_mu);
    return r;
}

int rt_device(void)
{
    int d = simcuda__current_device();
    return d >= 0 ? d : 0;
}

cudaError_t rt_from_cu(CUresult r)
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

cudaError_t rt_ret(cudaError_t err)
{
    if (err != cudaSuccess && err != cudaErrorNotReady)
        last_error = err;
    return err;
}

cudaError_t rt_ret_cu(CUresult r)
{
    return rt_ret(rt_from_cu(r));
}

cudaError_t rt_enter(void)
{
    pthread_once(&init_once, init);
    if (init_result != CUDA_SUCCESS)
        return rt_ret_cu(init_result);
    if (!ctx_set) {
        /* A context made current through the driver (a device's primary
         * one, or one the program created) is the thread's; otherwise
         * device 0's primary context. */
        int d = simcuda__current_device();
        CUresult r = d >= 0 ? CUDA_SUCCESS : cuCtxSetCurrent(primary_ctx[0]);
        if (r != CUDA_SUCCESS)
            return rt_ret_cu(r);
        ctx_set = true;
    }
    return cudaSuccess;
}

int sim_refuse_runtime(const char *name, int code);
int sim_refuse_runtime(const char *name, int code)
{
    fprintf(stderr, "simcuda: %s is not supported by the simulated runtime\n", name);
    return rt_ret(code);
}

/* ---- errors and versions ---- */

SIM_EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    CUcontext c;
    CUresult sticky = cuCtxGetCurrent(&c);
    if (sticky == CUDA_ERROR_ILLEGAL_ADDRESS) /* sticky errors cannot be cleared */
        last_error = e = rt_from_cu(sticky);
    return e;
}

SIM_EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

/* The real runtime's text where the simulator knows it; every other code of
 * the cudaError enum gets a description derived from its name. */
#define SIM_RT_ERROR_TEXTS(X)                                                                      \
    X(cudaSuccess, "no error")                                                                     \
    X(cudaErrorInvalidValue, "invalid argument")                                                   \
    X(cudaErrorMemoryAllocation, "out of memory")                                                  \
    X(cudaErrorInitializationError, "initialization error")                                        \
    X(cudaErrorCudartUnloading, "driver shutting down")                                            \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                             \
    X(cudaErrorInvalidPitchValue, "invalid pitch argument")                                        \
    X(cudaErrorInvalidSymbol, "invalid device symbol")                                             \
    X(cudaErrorInvalidHostPointer, "invalid host pointer")                                         \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                     \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                        \
    X(cudaErrorMissingConfiguration, "__global__ function call is not configured")                 \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                     \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                            \
    X(cudaErrorDeviceUninitialized, "invalid device context")                                      \
    X(cudaErrorInvalidKernelImage, "device kernel image is invalid")                               \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                   \
    X(cudaErrorIllegalState, "the operation cannot be performed in the present state")             \
    X(cudaErrorSymbolNotFound, "named symbol not found")                                           \
    X(cudaErrorNotReady, "device not ready")                                                       \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                         \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")                    \
    X(cudaErrorLaunchTimeout, "the launch timed out and was terminated")                           \
    X(cudaErrorHostMemoryAlreadyRegistered,                                                        \
      "part or all of the requested memory range is already mapped")                               \
    X(cudaErrorHostMemoryNotRegistered,                                                            \
      "pointer does not correspond to a registered memory region")                                 \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                        \
    X(cudaErrorNotPermitted, "operation not permitted")                                            \
    X(cudaErrorNotSupported, "operation not supported")                                            \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")       \
    X(cudaErrorStreamCaptureInvalidated,                                                           \
      "operation failed due to a previous error during capture")                                   \
    X(cudaErrorStreamCaptureImplicit,                                                              \
      "operation would make the legacy stream depend on a capturing blocking stream")              \
    X(cudaErrorInvalidDeviceFunction, "invalid device function")                                   \
    X(cudaErrorTimeout, "wait operation timed out")                                                \
    X(cudaErrorUnknown, "unknown error")

static const struct sim_error_name *rt_error(cudaError_t e)
{
    for (size_t i = 0; i < sim_rt_errors_count; i++)
        if (sim_rt_errors[i].code == (int)e)
            return &sim_rt_errors[i];
    return NULL;
}

SIM_EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    const struct sim_error_name *n = rt_error(error);
    return n ? n->name : "unrecognized error code";
}

SIM_EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
#define X(code, text)                                                                              \
    case code:                                                                                     \
        return text;
        SIM_RT_ERROR_TEXTS(X)
#undef X
    default:
        break;
    }
    const struct sim_error_name *n = rt_error(error);
    return n ? n->text : "unrecognized error code";
}

SIM_EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
    return rt_ret_cu(cuDriverGetVersion(v));
}

SIM_EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return rt_ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* ---- devices ---- */

SIM_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    pthread_once(&init_once, init);
    if (init_result != CUDA_SUCCESS && init_result != CUDA_ERROR_ILLEGAL_ADDRESS)
        return rt_ret(cudaErrorNoDevice);
    return rt_ret_cu(cuDeviceGetCount(count));
}

SIM_EXPORT cudaError_t cudaGetDevice(int *device)
{
    ENTER();
    if (!device)
        return rt_ret(cudaErrorInvalidValue);
    *device = rt_device();
    return cudaSuccess;
}

/* Makes the device's primary context current on this thread (no call when
 * it already is). */
SIM_EXPORT cudaError_t cudaSetDevice(int device)
{
    ENTER();
    if (!rt_device_valid(device))
        return rt_ret(cudaErrorInvalidDevice);
    if (simcuda__current_device() == device)
        return cudaSuccess;
    CUcontext c = NULL;
    CUresult r = rt_primary(device, &c);
    return rt_ret_cu(r ? r : cuCtxSetCurrent(c));
}

SIM_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    return rt_ret_cu(cuCtxSynchronize());
}

SIM_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    ENTER();
    return rt_ret_cu(cuDeviceGetAttribute(value, (CUdevice_attribute)attr, device));
}

SIM_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER();
    return rt_ret_cu(cuCtxGetStreamPriorityRange(least, greatest));
}

/* The simulated device as cudaDeviceProp: what the driver models comes from
 * its attributes (so the two agree); the rest are the figures of the GPU it
 * poses as (compute capability 9.0). */
SIM_EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    ENTER();
    if (!prop)
        return rt_ret(cudaErrorInvalidValue);
    if (!rt_device_valid(device))
        return rt_ret(cudaErrorInvalidDevice);
    struct cudaDeviceProp p;
    memset(&p, 0, sizeof p);
    CUresult r = cuDeviceGetName(p.name, sizeof p.name, device);
    if (r == CUDA_SUCCESS)
        r = cuDeviceTotalMem(&p.totalGlobalMem, device);
    static const struct {
        CUdevice_attribute attr;
        size_t offset;
    } attrs[] = {
#define A(attr, field) {CU_DEVICE_ATTRIBUTE_##attr, offsetof(struct cudaDeviceProp, field)}
        A(COMPUTE_CAPABILITY_MAJOR, major),
        A(COMPUTE_CAPABILITY_MINOR, minor),
        A(MULTIPROCESSOR_COUNT, multiProcessorCount),
        A(MAX_THREADS_PER_BLOCK, maxThreadsPerBlock),
        A(WARP_SIZE, warpSize),
        A(UNIFIED_ADDRESSING, unifiedAddressing),
        A(CAN_MAP_HOST_MEMORY, canMapHostMemory),
        A(CONCURRENT_KERNELS, concurrentKernels),
        A(ASYNC_ENGINE_COUNT, asyncEngineCount),
        A(PCI_BUS_ID, pciBusID),
        A(PCI_DEVICE_ID, pciDeviceID),
        A(PCI_DOMAIN_ID, pciDomainID),
        A(INTEGRATED, integrated),
        A(MANAGED_MEMORY, managedMemory),
        A(CONCURRENT_MANAGED_ACCESS, concurrentManagedAccess),
        A(PAGEABLE_MEMORY_ACCESS, pageableMemoryAccess),
        A(COOPERATIVE_LAUNCH, cooperativeLaunch),
        A(MEMORY_POOLS_SUPPORTED, memoryPoolsSupported),
        A(STREAM_PRIORITIES_SUPPORTED, streamPrioritiesSupported),
        A(GPU_DIRECT_RDMA_SUPPORTED, gpuDirectRDMASupported),
        A(NUMA_CONFIG, deviceNumaConfig),
        A(NUMA_ID, deviceNumaId),
        A(HOST_NUMA_ID, hostNumaId),
#undef A
    };
    for (size_t i = 0; r == CUDA_SUCCESS && i < sizeof attrs / sizeof *attrs; i++)
        r = cuDeviceGetAttribute((int *)((char *)&p + attrs[i].offset), attrs[i].attr, device);
    if (r != CUDA_SUCCESS)
        return rt_ret_cu(r);
    p.sharedMemPerBlock = 48 << 10;
    p.sharedMemPerBlockOptin = 227 << 10;
    p.sharedMemPerMultiprocessor = 228 << 10;
    p.reservedSharedMemPerBlock = 1 << 10;
    p.regsPerBlock = p.regsPerMultiprocessor = 65536;
    p.memPitch = 2147483647;
    p.maxThreadsDim[0] = p.maxThreadsDim[1] = 1024;
    p.maxThreadsDim[2] = 64;
    p.maxGridSize[0] = 2147483647;
    p.maxGridSize[1] = p.maxGridSize[2] = 65535;
    p.totalConstMem = 64 << 10;
    p.textureAlignment = 512;
    p.texturePitchAlignment = 32;
    p.surfaceAlignment = 512;
    p.memoryBusWidth = 5120;
    p.l2CacheSize = 50 << 20;
    p.persistingL2CacheMaxSize = 30 << 20;
    p.maxThreadsPerMultiProcessor = 2048;
    p.maxBlocksPerMultiProcessor = 32;
    p.globalL1CacheSupported = p.localL1CacheSupported = 1;
    p.computePreemptionSupported = 1;
    p.hostRegisterSupported = 1;
    p.canUseHostPointerForRegisteredMem = 1;
    p.unifiedFunctionPointers = 1;
    p.clusterLaunch = 1;
    *prop = p;
    return cudaSuccess;
}

/* Waits for the device and clears this thread's last error. It frees
 * nothing: the runtime owns no memory of its own (every allocation belongs to
 * whoever made it, an interposer's pool among them), and the simulated
 * context, sticky error included, cannot be recreated. */
SIM_EXPORT cudaError_t cudaDeviceReset(void)
{
    ENTER();
    CUresult r = cuCtxSynchronize();
    last_error = cudaSuccess;
    return rt_ret_cu(r);
}

/* ---- peer access: from the current device to another ---- */

SIM_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    ENTER();
    return rt_ret_cu(cuDeviceCanAccessPeer(can, device, peer));
}

/* cuda_runtime_api.h: cudaErrorInvalidDevice where cudaDeviceCanAccessPeer
 * says no (the current device itself among them). */
SIM_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    ENTER();
    if (!rt_device_valid(peer) || peer == rt_device())
        return rt_ret(cudaErrorInvalidDevice);
    if (flags != 0)
        return rt_ret(cudaErrorInvalidValue);
    CUcontext c = NULL;
    CUresult r = rt_primary(peer, &c);
    return rt_ret_cu(r ? r : cuCtxEnablePeerAccess(c, 0));
}

SIM_EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peer)
{
    ENTER();
    if (!rt_device_valid(peer))
        return rt_ret(cudaErrorInvalidDevice);
    CUcontext c = NULL;
    CUresult r = rt_primary(peer, &c);
    return rt_ret_cu(r ? r : cuCtxDisablePeerAccess(c));
}
