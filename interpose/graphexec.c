/* graphexec.c — the program's executable graphs as it makes, changes and
 * destroys them: cudaGraphInstantiate, cuGraphInstantiateWithFlags, the
 * ExecDestroy calls, the Exec*NodeSetParams calls (the generic
 * ExecNodeSetParams of CUDA 12.2 too) and ExecUpdate, in their runtime and
 * driver forms. Each passes through, and what it made or changed is
 * learned, or forgotten, in graph.c.
 *
 * Shared state: the real functions, resolved once. The hooks nest per
 * thread (a runtime call reaching a hooked driver call counts once).
 */
#include "interpose/dl.h"
#include "interpose/graph.h"

#include <dlfcn.h>
#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

static _Thread_local int inst_depth, destroy_depth, update_depth;

static struct {
    __typeof__(cudaGraphInstantiate) *cudaGraphInstantiate;
    __typeof__(cudaGraphInstantiateWithFlags) *cudaGraphInstantiateWithFlags;
    __typeof__(cudaGraphExecDestroy) *cudaGraphExecDestroy;
    __typeof__(cuGraphInstantiateWithFlags) *cuGraphInstantiate;
    __typeof__(cuGraphExecDestroy) *cuGraphExecDestroy;
    __typeof__(cudaGraphExecKernelNodeSetParams) *cudaGraphExecKernelNodeSetParams;
    __typeof__(cudaGraphExecMemsetNodeSetParams) *cudaGraphExecMemsetNodeSetParams;
    __typeof__(cudaGraphExecMemcpyNodeSetParams) *cudaGraphExecMemcpyNodeSetParams;
    __typeof__(cudaGraphExecUpdate) *cudaGraphExecUpdate;
    __typeof__(cudaGraphExecNodeSetParams) *cudaGraphExecNodeSetParams;
    __typeof__(cuGraphExecKernelNodeSetParams_v2) *cuGraphExecKernelNodeSetParams;
    CUresult (*cuGraphExecKernelNodeSetParams_v1)(CUgraphExec, CUgraphNode,
                                                  const CUDA_KERNEL_NODE_PARAMS_v1 *);
    __typeof__(cuGraphExecMemsetNodeSetParams) *cuGraphExecMemsetNodeSetParams;
    __typeof__(cuGraphExecMemcpyNodeSetParams) *cuGraphExecMemcpyNodeSetParams;
    __typeof__(cuGraphExecUpdate_v2) *cuGraphExecUpdate;
    __typeof__(cuGraphExecNodeSetParams) *cuGraphExecNodeSetParams;
    CUresult (*cuGraphExecUpdate_v1)(CUgraphExec, CUgraph, CUgraphNode *,
                                     CUgraphExecUpdateResult *);
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define R(field, name) real.field = (__typeof__(real.field))sh_dl_lookup(RTLD_NEXT, name)
    R(cudaGraphInstantiate, "cudaGraphInstantiate");
    R(cudaGraphInstantiateWithFlags, "cudaGraphInstantiateWithFlags");
    R(cudaGraphExecDestroy, "cudaGraphExecDestroy");
    R(cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    R(cuGraphExecDestroy, "cuGraphExecDestroy");
    R(cudaGraphExecKernelNodeSetParams, "cudaGraphExecKernelNodeSetParams");
    R(cudaGraphExecMemsetNodeSetParams, "cudaGraphExecMemsetNodeSetParams");
    R(cudaGraphExecMemcpyNodeSetParams, "cudaGraphExecMemcpyNodeSetParams");
    R(cudaGraphExecUpdate, "cudaGraphExecUpdate");
    R(cudaGraphExecNodeSetParams, "cudaGraphExecNodeSetParams");
    R(cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2");
    R(cuGraphExecKernelNodeSetParams_v1, "cuGraphExecKernelNodeSetParams");
    R(cuGraphExecMemsetNodeSetParams, "cuGraphExecMemsetNodeSetParams");
    R(cuGraphExecMemcpyNodeSetParams, "cuGraphExecMemcpyNodeSetParams");
    R(cuGraphExecUpdate, "cuGraphExecUpdate_v2");
    R(cuGraphExecUpdate_v1, "cuGraphExecUpdate");
    R(cuGraphExecNodeSetParams, "cuGraphExecNodeSetParams");
#undef R
}

static void ready(void)
{
    pthread_once(&real_once, resolve);
}

static void instantiated(int ok, CUgraphExec exec, CUgraph graph)
{
    if (ok && inst_depth == 1 && sh_managed())
        sh_graph_learn(exec, graph);
}

EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                        unsigned long long flags)
{
    ready();
    inst_depth++;
    cudaError_t e = real.cudaGraphInstantiate(exec, graph, flags);
    instantiated(e == cudaSuccess, (CUgraphExec)*exec, (CUgraph)graph);
    inst_depth--;
    return e;
}

EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                                 unsigned long long flags)
{
    ready();
    inst_depth++;
    cudaError_t e = real.cudaGraphInstantiateWithFlags(exec, graph, flags);
    instantiated(e == cudaSuccess, (CUgraphExec)*exec, (CUgraph)graph);
    inst_depth--;
    return e;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                            unsigned long long flags)
{
    ready();
    inst_depth++;
    CUresult r = real.cuGraphInstantiate(exec, graph, flags);
    instantiated(r == CUDA_SUCCESS, *exec, graph);
    inst_depth--;
    return r;
}

EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ready();
    destroy_depth++;
    if (destroy_depth == 1)
        sh_graph_forget((CUgraphExec)exec);
    cudaError_t e = real.cudaGraphExecDestroy(exec);
    destroy_depth--;
    return e;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    ready();
    destroy_depth++;
    if (destroy_depth == 1)
        sh_graph_forget(exec);
    CUresult r = real.cuGraphExecDestroy(exec);
    destroy_depth--;
    return r;
}

/* ---- executable graphs changed after instantiation ---- */

static int updating(void)
{
    ready();
    return ++update_depth == 1 && sh_managed();
}

static void node_changed(int ok, int outer, CUgraphExec exec, const uintptr_t *addrs, size_t n)
{
    if (ok && outer)
        sh_graph_learn_more(exec, addrs, n);
    update_depth--;
}

/* The driver's view of runtime kernel node parameters, for the scan. */
static size_t rt_kernel_addrs(const void *func, void **params, uintptr_t *addrs)
{
    return func ? sh_launch_scan(func, SH_KEY_HOST_FN, params, addrs, SH_GRAPH_NODE_ADDRS, NULL)
                : 0;
}

static size_t rt_memset_addrs(const void *dst, size_t pitch, unsigned elem, size_t width,
                              size_t height, uintptr_t *addrs)
{
    return sh_graph_span((uintptr_t)dst, 0, pitch, 1, (size_t)elem * width, height, 1, addrs);
}

static size_t rt_memcpy_addrs(const struct cudaMemcpy3DParms *p, uintptr_t *addrs)
{
    if (!p)
        return 0;
    const struct cudaPitchedPtr *s = &p->srcPtr, *d = &p->dstPtr;
    size_t row = sh_copy3d_row_bytes(p->extent.width, p->srcArray || p->dstArray);
    size_t k = p->srcArray
                   ? 0
                   : sh_graph_span(
                         (uintptr_t)s->ptr,
                         p->srcPos.x + p->srcPos.y * s->pitch + p->srcPos.z * s->pitch * s->ysize,
                         s->pitch, s->ysize, row, p->extent.height, p->extent.depth, addrs);
    return k + (p->dstArray
                    ? 0
                    : sh_graph_span(
                          (uintptr_t)d->ptr,
                          p->dstPos.x + p->dstPos.y * d->pitch + p->dstPos.z * d->pitch * d->ysize,
                          d->pitch, d->ysize, row, p->extent.height, p->extent.depth, addrs + k));
}

/* A packed parameter buffer (extra only) is not read: the update makes the
 * exec opaque anyway (sh_graph_learn_more). */
static size_t drv_kernel_addrs(const CUDA_KERNEL_NODE_PARAMS *p, uintptr_t *addrs)
{
    return p && (p->kernelParams || !p->extra)
               ? sh_graph_kernel_addrs(p, addrs, SH_GRAPH_NODE_ADDRS, NULL)
               : 0;
}

EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                    const struct cudaKernelNodeParams *p)
{
    int outer = updating();
    uintptr_t addrs[SH_GRAPH_NODE_ADDRS];
    size_t n = outer && p ? rt_kernel_addrs(p->func, p->kernelParams, addrs) : 0;
    cudaError_t e = real.cudaGraphExecKernelNodeSetParams(exec, node, p);
    node_changed(e == cudaSuccess, outer, (CUgraphExec)exec, addrs, n);
    return e;
}

EXPORT cudaError_t cudaGraphExecMemsetNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                    const struct cudaMemsetParams *p)
{
    int outer = updating();
    uintptr_t addrs[2];
    size_t n = outer && p
                   ? rt_memset_addrs(p->dst, p->pitch, p->elementSize, p->width, p->height, addrs)
                   : 0;
    cudaError_t e = real.cudaGraphExecMemsetNodeSetParams(exec, node, p);
    node_changed(e == cudaSuccess, outer, (CUgraphExec)exec, addrs, n);
    return e;
}

EXPORT cudaError_t cudaGraphExecMemcpyNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                    const struct cudaMemcpy3DParms *p)
{
    int outer = updating();
    uintptr_t addrs[4];
    size_t n = outer ? rt_memcpy_addrs(p, addrs) : 0;
    cudaError_t e = real.cudaGraphExecMemcpyNodeSetParams(exec, node, p);
    node_changed(e == cudaSuccess, outer, (CUgraphExec)exec, addrs, n);
    return e;
}

EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                  const CUDA_KERNEL_NODE_PARAMS *p)
{
    int outer = updating();
    uintptr_t addrs[SH_GRAPH_NODE_ADDRS];
    size_t n = outer ? drv_kernel_addrs(p, addrs) : 0;
    CUresult r = real.cuGraphExecKernelNodeSetParams(exec, node, p);
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

/* The CUDA 11 entry point: its parameters lack the kernel handle. (cuda.h
 * names the _v2 function by this name.) */
#undef cuGraphExecKernelNodeSetParams
EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_KERNEL_NODE_PARAMS_v1 *p);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                        const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    int outer = updating();
    uintptr_t addrs[SH_GRAPH_NODE_ADDRS];
    size_t n = outer && p && p->func ? sh_launch_scan(p->func, SH_KEY_FUNCTION, p->kernelParams,
                                                      addrs, SH_GRAPH_NODE_ADDRS, NULL)
                                     : 0;
    CUresult r = real.cuGraphExecKernelNodeSetParams_v1
                     ? real.cuGraphExecKernelNodeSetParams_v1(exec, node, p)
                     : CUDA_ERROR_NOT_SUPPORTED;
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx)
{
    int outer = updating();
    uintptr_t addrs[2];
    size_t n = outer && p ? sh_graph_memset_addrs(p, addrs, 2) : 0;
    CUresult r = real.cuGraphExecMemsetNodeSetParams(exec, node, p, ctx);
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_MEMCPY3D *p, CUcontext ctx)
{
    int outer = updating();
    uintptr_t addrs[4];
    size_t n = outer && p ? sh_graph_memcpy_addrs(p, addrs, 4) : 0;
    CUresult r = real.cuGraphExecMemcpyNodeSetParams(exec, node, p, ctx);
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

/* The generic calls (CUDA 12.2): what kernel, memset and memcpy
 * parameters touch, read as the typed calls read them; any other type
 * touches nothing here (the update makes the exec opaque whatever it is). */
static size_t rt_node_addrs(const struct cudaGraphNodeParams *p, uintptr_t *addrs)
{
    if (!p)
        return 0;
    switch (p->type) {
    case cudaGraphNodeTypeKernel:
        return rt_kernel_addrs(p->kernel.func, p->kernel.kernelParams, addrs);
    case cudaGraphNodeTypeMemset: {
        const struct cudaMemsetParamsV2 *m = &p->memset;
        return rt_memset_addrs(m->dst, m->pitch, m->elementSize, m->width, m->height, addrs);
    }
    case cudaGraphNodeTypeMemcpy:
        return rt_memcpy_addrs(&p->memcpy.copyParams, addrs);
    default:
        return 0;
    }
}

static size_t drv_node_addrs(const CUgraphNodeParams *p, uintptr_t *addrs)
{
    if (!p)
        return 0;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: { /* _v3 has the fields of the typed call's _v2 */
        const CUDA_KERNEL_NODE_PARAMS_v3 *k = &p->kernel;
        CUDA_KERNEL_NODE_PARAMS v2 = {.func = k->func,
                                      .kernelParams = k->kernelParams,
                                      .extra = k->extra,
                                      .kern = k->kern,
                                      .ctx = k->ctx};
        return drv_kernel_addrs(&v2, addrs);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        const CUDA_MEMSET_NODE_PARAMS_v2 *m = &p->memset;
        CUDA_MEMSET_NODE_PARAMS v1 = {m->dst,         m->pitch, m->value,
                                      m->elementSize, m->width, m->height};
        return sh_graph_memset_addrs(&v1, addrs, 2);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        return sh_graph_memcpy_addrs(&p->memcpy.copyParams, addrs, 4);
    default:
        return 0;
    }
}

EXPORT cudaError_t cudaGraphExecNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                              struct cudaGraphNodeParams *p)
{
    int outer = updating();
    uintptr_t addrs[SH_GRAPH_NODE_ADDRS];
    size_t n = outer ? rt_node_addrs(p, addrs) : 0;
    cudaError_t e = real.cudaGraphExecNodeSetParams ? real.cudaGraphExecNodeSetParams(exec, node, p)
                                                    : cudaErrorNotSupported;
    node_changed(e == cudaSuccess, outer, (CUgraphExec)exec, addrs, n);
    return e;
}

EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *p)
{
    int outer = updating();
    uintptr_t addrs[SH_GRAPH_NODE_ADDRS];
    size_t n = outer ? drv_node_addrs(p, addrs) : 0;
    CUresult r = real.cuGraphExecNodeSetParams ? real.cuGraphExecNodeSetParams(exec, node, p)
                                               : CUDA_ERROR_NOT_SUPPORTED;
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

/* The whole executable graph now does what graph does: learned afresh. */
static void updated(int ok, int outer, CUgraphExec exec, CUgraph graph)
{
    if (ok && outer) {
        sh_graph_forget(exec);
        sh_graph_learn(exec, graph);
    }
    update_depth--;
}

EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                       cudaGraphExecUpdateResultInfo *info)
{
    int outer = updating();
    cudaError_t e = real.cudaGraphExecUpdate(exec, graph, info);
    updated(e == cudaSuccess, outer, (CUgraphExec)exec, (CUgraph)graph);
    return e;
}

EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph,
                                     CUgraphExecUpdateResultInfo *info)
{
    int outer = updating();
    CUresult r = real.cuGraphExecUpdate(exec, graph, info);
    updated(r == CUDA_SUCCESS, outer, exec, graph);
    return r;
}

/* The CUDA 11 entry point, with the result in two out-parameters. */
#undef cuGraphExecUpdate
EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                                  CUgraphExecUpdateResult *result);
CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                           CUgraphExecUpdateResult *result)
{
    int outer = updating();
    CUresult r = real.cuGraphExecUpdate_v1
                     ? real.cuGraphExecUpdate_v1(exec, graph, error_node, result)
                     : CUDA_ERROR_NOT_SUPPORTED;
    updated(r == CUDA_SUCCESS, outer, exec, graph);
    return r;
}
