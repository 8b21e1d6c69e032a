/* cudart_work.c — the simulated runtime's streams, events, graphs and
 * launches, over the driver. Launches raise runtime API callbacks, then call
 * the driver, which raises its own, as on a GPU (a tool sees both).
 *
 * Shared state: none.
 */
#include "rt.h"

#include <cupti.h>

/* ---- streams and events ---- */

SIM_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags,
                                                    int priority)
{
    ENTER();
    return rt_ret_cu(cuStreamCreateWithPriority((CUstream *)s, flags, priority));
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
    return rt_ret_cu(cuStreamDestroy((CUstream)s));
}

SIM_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ENTER();
    return rt_ret_cu(cuStreamSynchronize((CUstream)s));
}

SIM_EXPORT cudaError_t cudaStreamQuery(cudaStream_t s)
{
    ENTER();
    return rt_ret_cu(cuStreamQuery((CUstream)s));
}

SIM_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    ENTER();
    return rt_ret_cu(cuStreamWaitEvent((CUstream)s, (CUevent)e, flags));
}

SIM_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    ENTER();
    return rt_ret_cu(cuStreamIsCapturing((CUstream)s, (CUstreamCaptureStatus *)status));
}

SIM_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority)
{
    ENTER();
    return rt_ret_cu(cuStreamGetPriority((CUstream)s, priority));
}

SIM_EXPORT cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags)
{
    ENTER();
    return rt_ret_cu(cuStreamGetFlags((CUstream)s, flags));
}

SIM_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user)
{
    ENTER();
    return rt_ret_cu(cuLaunchHostFunc((CUstream)s, fn, user));
}

SIM_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    ENTER();
    return rt_ret_cu(cuEventCreate((CUevent *)e, flags));
}

SIM_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

SIM_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    ENTER();
    return rt_ret_cu(cuEventDestroy((CUevent)e));
}

SIM_EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER();
    return rt_ret_cu(cuEventRecord((CUevent)e, (CUstream)s));
}

SIM_EXPORT cudaError_t cudaEventQuery(cudaEvent_t e)
{
    ENTER();
    return rt_ret_cu(cuEventQuery((CUevent)e));
}

SIM_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    ENTER();
    return rt_ret_cu(cuEventSynchronize((CUevent)e));
}

SIM_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    ENTER();
    return rt_ret_cu(cuEventElapsedTime((float *)ms, (CUevent)a, (CUevent)b));
}

/* ---- capture and graphs ---- */

SIM_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    ENTER();
    return rt_ret_cu(cuStreamBeginCapture((CUstream)s, (CUstreamCaptureMode)mode));
}

SIM_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    ENTER();
    return rt_ret_cu(cuStreamEndCapture((CUstream)s, (CUgraph *)graph));
}

SIM_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                            unsigned long long flags)
{
    ENTER();
    return rt_ret_cu(cuGraphInstantiate((CUgraphExec *)exec, (CUgraph)graph, flags));
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
    cudaError_t r = rt_ret_cu(cuGraphLaunch((CUgraphExec)exec, (CUstream)s));
    simcuda__api_exit(&call, &r);
    return r;
}

SIM_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *num)
{
    ENTER();
    return rt_ret_cu(cuGraphGetNodes((CUgraph)graph, (CUgraphNode *)nodes, num));
}

SIM_EXPORT cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *type)
{
    ENTER();
    return rt_ret_cu(cuGraphNodeGetType((CUgraphNode)node, (CUgraphNodeType *)type));
}

SIM_EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaKernelNodeParams *p)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
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
        return rt_ret(cudaErrorInvalidDeviceFunction);
    return rt_ret_cu(cuGraphExecKernelNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &k));
}

SIM_EXPORT cudaError_t cudaGraphExecMemsetNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaMemsetParams *p)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
    CUDA_MEMSET_NODE_PARAMS m = {
        (CUdeviceptr)(uintptr_t)p->dst, p->pitch, p->value, p->elementSize, p->width, p->height};
    return rt_ret_cu(
        cuGraphExecMemsetNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &m, NULL));
}

/* The driver's form of a runtime 3D copy: pointers of either kind, which
 * the driver tells apart (unified). */
static CUDA_MEMCPY3D rt_copy3d(const struct cudaMemcpy3DParms *p)
{
    return (CUDA_MEMCPY3D){
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
}

SIM_EXPORT cudaError_t cudaGraphExecMemcpyNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaMemcpy3DParms *p)
{
    ENTER();
    if (!p)
        return rt_ret(cudaErrorInvalidValue);
    if (p->srcArray || p->dstArray)
        return rt_ret(cudaErrorNotSupported); /* no arrays on the simulated GPU */
    CUDA_MEMCPY3D c = rt_copy3d(p);
    return rt_ret_cu(
        cuGraphExecMemcpyNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &c, NULL));
}

/* The driver's form of generic kernel, memset and memcpy parameters; other
 * types go as they are (by type alone), for the driver to refuse. */
static cudaError_t rt_node_params(const struct cudaGraphNodeParams *p, CUgraphNodeParams *d)
{
    *d = (CUgraphNodeParams){.type = (CUgraphNodeType)p->type};
    switch (p->type) {
    case cudaGraphNodeTypeKernel: {
        const struct cudaKernelNodeParamsV2 *k = &p->kernel;
        d->kernel = (CUDA_KERNEL_NODE_PARAMS_v3){
            .func = simcuda_function((simcuda_kernel_fn)k->func),
            .gridDimX = k->gridDim.x,
            .gridDimY = k->gridDim.y,
            .gridDimZ = k->gridDim.z,
            .blockDimX = k->blockDim.x,
            .blockDimY = k->blockDim.y,
            .blockDimZ = k->blockDim.z,
            .sharedMemBytes = k->sharedMemBytes,
            .kernelParams = k->kernelParams,
            .extra = k->extra,
        };
        return d->kernel.func ? cudaSuccess : cudaErrorInvalidDeviceFunction;
    }
    case cudaGraphNodeTypeMemset: {
        const struct cudaMemsetParamsV2 *m = &p->memset;
        d->memset = (CUDA_MEMSET_NODE_PARAMS_v2){.dst = (CUdeviceptr)(uintptr_t)m->dst,
                                                 .pitch = m->pitch,
                                                 .value = m->value,
                                                 .elementSize = m->elementSize,
                                                 .width = m->width,
                                                 .height = m->height};
        return cudaSuccess;
    }
    case cudaGraphNodeTypeMemcpy: {
        const struct cudaMemcpyNodeParams *c = &p->memcpy;
        if (c->flags || c->reserved[0] || c->reserved[1] || c->reserved[2])
            return cudaErrorInvalidValue;
        if (c->copyParams.srcArray || c->copyParams.dstArray)
            return cudaErrorNotSupported; /* no arrays on the simulated GPU */
        d->memcpy.copyParams = rt_copy3d(&c->copyParams);
        return cudaSuccess;
    }
    default:
        return cudaSuccess;
    }
}

SIM_EXPORT cudaError_t cudaGraphExecNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                  struct cudaGraphNodeParams *p)
{
    ENTER();
    if (!p || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
        return rt_ret(cudaErrorInvalidValue);
    CUgraphNodeParams d;
    cudaError_t e = rt_node_params(p, &d);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret_cu(cuGraphExecNodeSetParams((CUgraphExec)exec, (CUgraphNode)node, &d));
}

SIM_EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                           cudaGraphExecUpdateResultInfo *info)
{
    ENTER();
    return rt_ret_cu(
        cuGraphExecUpdate((CUgraphExec)exec, (CUgraph)graph, (CUgraphExecUpdateResultInfo *)info));
}

SIM_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    ENTER();
    return rt_ret_cu(cuGraphDestroy((CUgraph)graph));
}

SIM_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ENTER();
    return rt_ret_cu(cuGraphExecDestroy((CUgraphExec)exec));
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
        return rt_ret(cudaErrorInvalidDeviceFunction);
    if (!valid_config(g, b))
        return rt_ret(cudaErrorInvalidConfiguration);
    if (cooperative)
        return rt_ret_cu(cuLaunchCooperativeKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem,
                                                   (CUstream)s, args));
    return rt_ret_cu(
        cuLaunchKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem, (CUstream)s, args, NULL));
}

/* A launch's func: a stub's address, or a kernel handle (cudaKernel_t),
 * which the runtime takes in its place since CUDA 12. */
static CUfunction function_of(const void *func)
{
    CUfunction f = simcuda_function((simcuda_kernel_fn)func);
    return f || !simcuda__function_name((CUfunction)func) ? f : (CUfunction)func;
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
    CUfunction f = function_of(func);
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
 * compiled with --default-stream per-thread). As the real runtime does, the
 * handle comes from the driver's cuLibraryGetKernel, reached through
 * cuGetProcAddress. */
SIM_EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func)
{
    ENTER();
    if (!kernel)
        return rt_ret(cudaErrorInvalidValue);
    const char *name = kernel_name(simcuda_function((simcuda_kernel_fn)func));
    CUresult (*get)(CUkernel *, CUlibrary, const char *) = NULL;
    CUdriverProcAddressQueryResult q;
    *kernel = NULL;
    if (name &&
        cuGetProcAddress_v2("cuLibraryGetKernel", (void **)&get, 12000, CU_GET_PROC_ADDRESS_DEFAULT,
                            &q) == CUDA_SUCCESS &&
        get && get((CUkernel *)kernel, (CUlibrary)1, name) != CUDA_SUCCESS)
        *kernel = NULL;
    return *kernel ? cudaSuccess : rt_ret(cudaErrorInvalidDeviceFunction);
}

/* CUPTI reports a stub's launch as cudaLaunchKernel, the kernel handle in
 * func (seen on an H200 with CUDA 13.0: the callbacks never named
 * __cudaLaunchKernel, and their func was the handle, not the stub). */
static cudaError_t stub_launch(int cbid, const char *fname, cudaKernel_t kernel, dim3 gridDim,
                               dim3 blockDim, void **args, size_t sharedMem, cudaStream_t stream,
                               cudaStream_t dflt)
{
    ENTER();
    cudaLaunchKernel_v7000_params p = {kernel, gridDim, blockDim, args, sharedMem, stream};
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
    return stub_launch(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cudaLaunchKernel", kernel,
                       gridDim, blockDim, args, sharedMem, stream, NULL);
}

SIM_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                               void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream)
{
    return stub_launch(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
                       "cudaLaunchKernel_ptsz", kernel, gridDim, blockDim, args, sharedMem, stream,
                       (cudaStream_t)CU_STREAM_PER_THREAD);
}

SIM_EXPORT cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    ENTER();
    if (!functionPtr)
        return rt_ret(cudaErrorInvalidValue);
    *functionPtr = (cudaFunction_t)simcuda_function((simcuda_kernel_fn)symbolPtr);
    return *functionPtr ? cudaSuccess : rt_ret(cudaErrorInvalidDeviceFunction);
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
