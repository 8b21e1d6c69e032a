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
#include <string.h>

SIM_EXPORT void simcuda__api_enter(struct sim_api_call *call, int domain, int cbid,
                                   const char *fname, const char *symbol, const void *params);
SIM_EXPORT void simcuda__api_exit(struct sim_api_call *call, void *ret);
SIM_EXPORT const char *simcuda__function_name(CUfunction f);

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

/* The simulated device as cudaDeviceProp: what the driver models comes from
 * its attributes (so the two agree); the rest are the figures of the GPU it
 * poses as (compute capability 9.0). */
SIM_EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    ENTER();
    if (!prop)
        return ret(cudaErrorInvalidValue);
    if (device != 0)
        return ret(cudaErrorInvalidDevice);
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
        return ret_cu(r);
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
    return ret_cu(r);
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

/* ---- memory pools: the driver's, by device ordinal ---- */

static cudaError_t device_of(int device, CUdevice *d)
{
    return ret_cu(cuDeviceGet(d, device));
}

SIM_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    ENTER();
    CUdevice d;
    cudaError_t e = device_of(device, &d);
    return e ? e : ret_cu(cuDeviceGetDefaultMemPool((CUmemoryPool *)pool, d));
}

SIM_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int device)
{
    ENTER();
    CUdevice d;
    cudaError_t e = device_of(device, &d);
    return e ? e : ret_cu(cuDeviceGetMemPool((CUmemoryPool *)pool, d));
}

SIM_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool)
{
    ENTER();
    CUdevice d;
    cudaError_t e = device_of(device, &d);
    return e ? e : ret_cu(cuDeviceSetMemPool(d, (CUmemoryPool)pool));
}

SIM_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props)
{
    ENTER();
    if (!props)
        return ret(cudaErrorInvalidValue);
    CUmemPoolProps p = {.allocType = (CUmemAllocationType)props->allocType,
                        .handleTypes = (CUmemAllocationHandleType)props->handleTypes,
                        .location = {(CUmemLocationType)props->location.type, props->location.id},
                        .win32SecurityAttributes = props->win32SecurityAttributes,
                        .maxSize = props->maxSize,
                        .usage = props->usage};
    memcpy(p.reserved, props->reserved, sizeof p.reserved);
    return ret_cu(cuMemPoolCreate((CUmemoryPool *)pool, &p));
}

SIM_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
    ENTER();
    return ret_cu(cuMemPoolDestroy((CUmemoryPool)pool));
}

/* cudaMemPoolAttr and CUmemPool_attribute share their values. */
SIM_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                               void *value)
{
    ENTER();
    return ret_cu(cuMemPoolGetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value));
}

SIM_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                               void *value)
{
    ENTER();
    return ret_cu(cuMemPoolSetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value));
}

SIM_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep)
{
    ENTER();
    return ret_cu(cuMemPoolTrimTo((CUmemoryPool)pool, minBytesToKeep));
}

SIM_EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                               cudaStream_t s)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocFromPoolAsync(&d, size, (CUmemoryPool)pool, (CUstream)s);
    *p = (void *)(uintptr_t)d;
    return ret_cu(r);
}

/* What a program built with --default-stream per-thread calls: stream 0
 * there is the calling thread's own stream. */
static cudaStream_t per_thread(cudaStream_t s)
{
    return s ? s : cudaStreamPerThread;
}

SIM_EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s);
SIM_EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);

cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s)
{
    return cudaMallocAsync(p, size, per_thread(s));
}

cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
    return cudaFreeAsync(p, per_thread(s));
}

SIM_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    ENTER();
    return ret_cu(cuMemGetInfo(free_bytes, total));
}

/* As the runtime does since CUDA 11: memory the driver does not know is
 * cudaMemoryTypeUnregistered, not an error; host memory has both
 * pointers, device memory only its device pointer. */
SIM_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    ENTER();
    if (!attr)
        return ret(cudaErrorInvalidValue);
    unsigned type = 0;
    int ordinal = 0;
    CUpointer_attribute what[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[] = {&type, &ordinal};
    CUresult r = cuPointerGetAttributes(2, what, data, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        return ret_cu(r);
    memset(attr, 0, sizeof *attr);
    attr->device = ordinal;
    if (type == CU_MEMORYTYPE_DEVICE) {
        attr->type = cudaMemoryTypeDevice;
        attr->devicePointer = (void *)ptr;
    } else if (type == CU_MEMORYTYPE_HOST) {
        attr->type = cudaMemoryTypeHost;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr)
{
    ENTER();
    return ret_cu(cuIpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)(uintptr_t)ptr));
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

SIM_EXPORT cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    ENTER();
    if (!dev)
        return ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = cuMemHostGetDevicePointer(&d, host, flags);
    if (r == CUDA_SUCCESS)
        *dev = (void *)(uintptr_t)d;
    return ret_cu(r);
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

SIM_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *num)
{
    ENTER();
    return ret_cu(cuGraphGetNodes((CUgraph)graph, (CUgraphNode *)nodes, num));
}

SIM_EXPORT cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *type)
{
    ENTER();
    return ret_cu(cuGraphNodeGetType((CUgraphNode)node, (CUgraphNodeType *)type));
}

SIM_EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaKernelNodeParams *p)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    CUDA_KERNEL_NODE_PARAMS k = {
        .func = simcuda_function((simcuda_kernel_fn)p->func),
        .gridDimX = p->gridDim.x,
        .gridDimY = p->gridDim.y,
        .gridDimZ = p->gridDim.z,
        .blockDimX = p->blockDim.x,
        .blockDimY = p->blockDim.y,
        .blockDimZ = p->blockDim.z,
        .sharedMemBytes = p->sharedMemBytes,
        .kernelParams = p->kernelParams,
        .extra = p->extra,
    };
    if (!k.func)
        return ret(cudaErrorInvalidDeviceFunction);
    return ret_cu(cuGraphExecKernelNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &k));
}

SIM_EXPORT cudaError_t cudaGraphExecMemsetNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaMemsetParams *p)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    CUDA_MEMSET_NODE_PARAMS m = {
        (CUdeviceptr)(uintptr_t)p->dst, p->pitch, p->value, p->elementSize, p->width, p->height};
    return ret_cu(cuGraphExecMemsetNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &m, NULL));
}

SIM_EXPORT cudaError_t cudaGraphExecMemcpyNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaMemcpy3DParms *p)
{
    ENTER();
    if (!p)
        return ret(cudaErrorInvalidValue);
    if (p->srcArray || p->dstArray)
        return ret(cudaErrorNotSupported); /* no arrays on the simulated GPU */
    /* Pointers of either kind: the driver tells them apart (unified). */
    CUDA_MEMCPY3D c = {
        .srcXInBytes = p->srcPos.x,
        .srcY = p->srcPos.y,
        .srcZ = p->srcPos.z,
        .srcMemoryType = CU_MEMORYTYPE_UNIFIED,
        .srcDevice = (CUdeviceptr)(uintptr_t)p->srcPtr.ptr,
        .srcPitch = p->srcPtr.pitch,
        .srcHeight = p->srcPtr.ysize,
        .dstXInBytes = p->dstPos.x,
        .dstY = p->dstPos.y,
        .dstZ = p->dstPos.z,
        .dstMemoryType = CU_MEMORYTYPE_UNIFIED,
        .dstDevice = (CUdeviceptr)(uintptr_t)p->dstPtr.ptr,
        .dstPitch = p->dstPtr.pitch,
        .dstHeight = p->dstPtr.ysize,
        .WidthInBytes = p->extent.width,
        .Height = p->extent.height,
        .Depth = p->extent.depth,
    };
    return ret_cu(cuGraphExecMemcpyNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &c, NULL));
}

SIM_EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                           cudaGraphExecUpdateResultInfo *info)
{
    ENTER();
    return ret_cu(
        cuGraphExecUpdate((CUgraphExec)exec, (CUgraph)graph, (CUgraphExecUpdateResultInfo *)info));
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

/* The limits cudaGetDeviceProperties reports; beyond them a launch is
 * cudaErrorInvalidConfiguration ("requesting too many threads or blocks"),
 * as is an empty grid or block. */
static bool valid_config(dim3 g, dim3 b)
{
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        return false;
    if (g.y > 65535 || g.z > 65535 || g.x > 2147483647u)
        return false;
    return b.x <= 1024 && b.y <= 1024 && b.z <= 64 && (unsigned long long)b.x * b.y * b.z <= 1024;
}

static cudaError_t launch(CUfunction f, dim3 g, dim3 b, void **args, size_t shmem, cudaStream_t s,
                          bool cooperative)
{
    if (!f)
        return ret(cudaErrorInvalidDeviceFunction);
    if (!valid_config(g, b))
        return ret(cudaErrorInvalidConfiguration);
    if (cooperative)
        return ret_cu(cuLaunchCooperativeKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem,
                                                (CUstream)s, args));
    return ret_cu(
        cuLaunchKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem, (CUstream)s, args, NULL));
}

/* Runtime launch callbacks name the kernel, as CUPTI's symbolName does. */
static const char *kernel_name(CUfunction f)
{
    return f ? simcuda__function_name(f) : NULL;
}

SIM_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                        size_t sharedMem, cudaStream_t stream)
{
    ENTER();
    cudaLaunchKernel_v7000_params p = {func, gridDim, blockDim, args, sharedMem, stream};
    CUfunction f = simcuda_function((simcuda_kernel_fn)func);
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API,
                       CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cudaLaunchKernel",
                       kernel_name(f), &p);
    cudaError_t r = launch(f, gridDim, blockDim, args, sharedMem, stream, false);
    simcuda__api_exit(&call, &r);
    return r;
}

SIM_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                                   void **args, size_t sharedMem,
                                                   cudaStream_t stream)
{
    ENTER();
    cudaLaunchCooperativeKernel_v9000_params p = {func, gridDim, blockDim, args, sharedMem, stream};
    CUfunction f = simcuda_function((simcuda_kernel_fn)func);
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API,
                       CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
                       "cudaLaunchCooperativeKernel", kernel_name(f), &p);
    cudaError_t r = launch(f, gridDim, blockDim, args, sharedMem, stream, true);
    simcuda__api_exit(&call, &r);
    return r;
}

/* What nvcc-generated launch stubs call in CUDA 13: a kernel handle from
 * __cudaGetKernel, then __cudaLaunchKernel (__cudaLaunchKernel_ptsz when
 * compiled with --default-stream per-thread). */
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

static cudaError_t stub_launch(int cbid, const char *fname, cudaKernel_t kernel, dim3 gridDim,
                               dim3 blockDim, void **args, size_t sharedMem, cudaStream_t stream,
                               cudaStream_t dflt)
{
    ENTER();
    sim_cudaLaunchKernel_v13000_params p = {kernel, gridDim, blockDim, args, sharedMem, stream};
    struct sim_api_call call;
    simcuda__api_enter(&call, CUPTI_CB_DOMAIN_RUNTIME_API, cbid, fname,
                       kernel_name((CUfunction)kernel), &p);
    cudaError_t r = launch((CUfunction)kernel, gridDim, blockDim, args, sharedMem,
                           stream ? stream : dflt, false);
    simcuda__api_exit(&call, &r);
    return r;
}

SIM_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                          void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream)
{
    return stub_launch(CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000, "__cudaLaunchKernel",
                       kernel, gridDim, blockDim, args, sharedMem, stream, NULL);
}

SIM_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                               void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream)
{
    return stub_launch(CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
                       "__cudaLaunchKernel_ptsz", kernel, gridDim, blockDim, args, sharedMem,
                       stream, (cudaStream_t)CU_STREAM_PER_THREAD);
}

SIM_EXPORT cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    ENTER();
    if (!functionPtr)
        return ret(cudaErrorInvalidValue);
    *functionPtr = (cudaFunction_t)simcuda_function((simcuda_kernel_fn)symbolPtr);
    return *functionPtr ? cudaSuccess : ret(cudaErrorInvalidDeviceFunction);
}

/* ---- driver entry points: through the driver's cuGetProcAddress, as the
 * real runtime does (the flags have the same values in both APIs). ---- */

SIM_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **pfn,
                                                        unsigned int version,
                                                        unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *st)
{
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = cuGetProcAddress_v2(symbol, pfn, (int)version, flags, &q);
    if (st)
        *st = q == CU_GET_PROC_ADDRESS_SUCCESS            ? cudaDriverEntryPointSuccess
              : q == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND ? cudaDriverEntryPointSymbolNotFound
                                                          : cudaDriverEntryPointVersionNotSufficent;
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* CUDA 12 programs still call it */
/* Documented as comparing the symbol's version with the runtime's only: a
 * runtime newer than the driver (minor-version compatibility) still gets
 * the driver's symbols, so the lookup asks at the older of the two. */
SIM_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **pfn,
                                               unsigned long long flags,
                                               enum cudaDriverEntryPointQueryResult *st)
{
    int driver = CUDART_VERSION;
    if (cuDriverGetVersion(&driver) != CUDA_SUCCESS || driver > CUDART_VERSION)
        driver = CUDART_VERSION;
    return cudaGetDriverEntryPointByVersion(symbol, pfn, (unsigned)driver, flags, st);
}
#pragma GCC diagnostic pop
