/* graph.c — stream capture and CUDA graphs.
 *
 * While any stream captures, a remap (which drains the device) would break
 * the capture, so evictions and restores wait until the last capture ends.
 * A graph's work is not issued op by op where we can see it, so the
 * regions its kernel, memset and memcpy nodes touch are learned when it is
 * instantiated, and made resident before each launch of it. A node given
 * new parameters in the executable graph adds what they touch (what the
 * old ones touched stays: it costs a restore, never a byte); an
 * executable graph updated from another graph is learned again from it.
 *
 * Locking: graphs_mu guards the exec -> regions table. Capture and
 * instantiate hooks nest per thread (a runtime call reaching a hooked
 * driver call counts once).
 */
#include "interpose/interpose.h"

#include "sh_log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT           __attribute__((visibility("default")))
#define GRAPH_MAX_ADDRS  4096
#define GRAPH_NODE_ADDRS 256 /* what one kernel node's parameters can name */

struct learned {
    CUgraphExec exec;
    uintptr_t *addrs;
    size_t n;
    /* Its kernel nodes' candidates, checked again against the pointer
     * tables whenever one is recorded (gen): hit, the last answer. */
    struct sh_node_scan ns;
    uint64_t gen;
    int hit;
    struct learned *next;
};

static pthread_mutex_t graphs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct learned *graphs;
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
    __typeof__(cuGraphExecKernelNodeSetParams_v2) *cuGraphExecKernelNodeSetParams;
    CUresult (*cuGraphExecKernelNodeSetParams_v1)(CUgraphExec, CUgraphNode,
                                                  const CUDA_KERNEL_NODE_PARAMS_v1 *);
    __typeof__(cuGraphExecMemsetNodeSetParams) *cuGraphExecMemsetNodeSetParams;
    __typeof__(cuGraphExecMemcpyNodeSetParams) *cuGraphExecMemcpyNodeSetParams;
    __typeof__(cuGraphExecUpdate_v2) *cuGraphExecUpdate;
    CUresult (*cuGraphExecUpdate_v1)(CUgraphExec, CUgraph, CUgraphNode *,
                                     CUgraphExecUpdateResult *);
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define R(field, name) real.field = (__typeof__(real.field))dlsym(RTLD_NEXT, name)
    R(cudaGraphInstantiate, "cudaGraphInstantiate");
    R(cudaGraphInstantiateWithFlags, "cudaGraphInstantiateWithFlags");
    R(cudaGraphExecDestroy, "cudaGraphExecDestroy");
    R(cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    R(cuGraphExecDestroy, "cuGraphExecDestroy");
    R(cudaGraphExecKernelNodeSetParams, "cudaGraphExecKernelNodeSetParams");
    R(cudaGraphExecMemsetNodeSetParams, "cudaGraphExecMemsetNodeSetParams");
    R(cudaGraphExecMemcpyNodeSetParams, "cudaGraphExecMemcpyNodeSetParams");
    R(cudaGraphExecUpdate, "cudaGraphExecUpdate");
    R(cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2");
    R(cuGraphExecKernelNodeSetParams_v1, "cuGraphExecKernelNodeSetParams");
    R(cuGraphExecMemsetNodeSetParams, "cuGraphExecMemsetNodeSetParams");
    R(cuGraphExecMemcpyNodeSetParams, "cuGraphExecMemcpyNodeSetParams");
    R(cuGraphExecUpdate, "cuGraphExecUpdate_v2");
    R(cuGraphExecUpdate_v1, "cuGraphExecUpdate");
#undef R
}

static void ready(void)
{
    pthread_once(&real_once, resolve);
}

int sh_capturing(void)
{
    return atomic_load(&sh_rt.captures) > 0;
}

/* ---- capture ---- */

/* Counted once per capture, by the outermost intercepted call: the
 * interception table's depth keeps the runtime's own call into the driver
 * from counting it twice. */
void sh_graph_capture(int begin, int result)
{
    if (!sh_managed())
        return;
    if (begin) {
        if (result == 0)
            atomic_fetch_add(&sh_rt.captures, 1);
        return;
    }
    /* An invalidated capture has ended too (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
     * and cudaErrorStreamCaptureInvalidated are both 901). */
    if ((result == 0 || result == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) &&
        atomic_fetch_sub(&sh_rt.captures, 1) == 1)
        sh_engine_make_room(&sh_rt.engine, 0, NULL, 0); /* the evictions that waited for it */
}

/* ---- learning a graph's regions at instantiation ---- */

/* The first and last byte of a pitched range starting at base (0 if none). */
static size_t span(uintptr_t base, size_t off, size_t pitch, size_t rows, size_t width,
                   size_t height, size_t depth, uintptr_t *out)
{
    if (!base || width == 0)
        return 0;
    height = height ? height : 1;
    depth = depth ? depth : 1;
    out[0] = base + off;
    out[1] = out[0] + (depth - 1) * pitch * rows + (height - 1) * pitch + width - 1;
    return 2;
}

static size_t memset_addrs(const CUDA_MEMSET_NODE_PARAMS *p, uintptr_t *addrs, size_t max)
{
    if (max < 2)
        return 0;
    return span((uintptr_t)p->dst, 0, p->pitch, 1, (size_t)p->elementSize * p->width, p->height, 1,
                addrs);
}

/* Both ends of a copy (host ends too: they match no region). */
static size_t memcpy_addrs(const CUDA_MEMCPY3D *p, uintptr_t *addrs, size_t max)
{
    if (max < 4)
        return 0;
    uintptr_t src = p->srcMemoryType == CU_MEMORYTYPE_HOST    ? (uintptr_t)p->srcHost
                    : p->srcMemoryType == CU_MEMORYTYPE_ARRAY ? 0
                                                              : (uintptr_t)p->srcDevice;
    uintptr_t dst = p->dstMemoryType == CU_MEMORYTYPE_HOST    ? (uintptr_t)p->dstHost
                    : p->dstMemoryType == CU_MEMORYTYPE_ARRAY ? 0
                                                              : (uintptr_t)p->dstDevice;
    size_t k =
        span(src, p->srcXInBytes + p->srcY * p->srcPitch + p->srcZ * p->srcPitch * p->srcHeight,
             p->srcPitch, p->srcHeight, p->WidthInBytes, p->Height, p->Depth, addrs);
    return k + span(dst,
                    p->dstXInBytes + p->dstY * p->dstPitch + p->dstZ * p->dstPitch * p->dstHeight,
                    p->dstPitch, p->dstHeight, p->WidthInBytes, p->Height, p->Depth, addrs + k);
}

static size_t kernel_addrs(const CUDA_KERNEL_NODE_PARAMS *p, uintptr_t *addrs, size_t max,
                           struct sh_node_scan *ns)
{
    if (p->func)
        return sh_launch_scan(p->func, SH_KEY_FUNCTION, p->kernelParams, addrs, max, ns);
    return sh_launch_scan(p->kern, SH_KEY_KERNEL, p->kernelParams, addrs, max, ns);
}

/* What a node reads or writes: kernels' pointer parameters, memset and
 * memcpy ranges. Nodes that run nothing on the device, or only the
 * graph's own memory, touch no region's bytes; any other node (a child
 * graph, a conditional, a batch of memory operations, a type this build
 * does not know) or one whose parameters cannot be read makes the graph
 * opaque. */
static size_t scan_node(CUgraphNode node, uintptr_t *addrs, size_t max, struct sh_node_scan *ns)
{
    CUgraphNodeType type;
    if (sh_rt.drv.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS) {
        ns->opaque = 1;
        return 0;
    }
    switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        CUDA_KERNEL_NODE_PARAMS p;
        if (sh_rt.drv.cuGraphKernelNodeGetParams(node, &p) == CUDA_SUCCESS)
            return kernel_addrs(&p, addrs, max, ns);
        ns->opaque = 1;
        return 0;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS p;
        return sh_rt.drv.cuGraphMemsetNodeGetParams(node, &p) == CUDA_SUCCESS
                   ? memset_addrs(&p, addrs, max)
                   : 0;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
        CUDA_MEMCPY3D p;
        return sh_rt.drv.cuGraphMemcpyNodeGetParams(node, &p) == CUDA_SUCCESS
                   ? memcpy_addrs(&p, addrs, max)
                   : 0;
    }
    case CU_GRAPH_NODE_TYPE_HOST:
    case CU_GRAPH_NODE_TYPE_EMPTY:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
        return 0;
    default:
        ns->opaque = 1;
        return 0;
    }
}

static void learn(CUgraphExec exec, CUgraph graph)
{
    size_t n = 0;
    if (sh_rt.drv.cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS)
        return;
    CUgraphNode *nodes = calloc(n ? n : 1, sizeof *nodes);
    struct learned *l = calloc(1, sizeof *l);
    uintptr_t *addrs = calloc(GRAPH_MAX_ADDRS, sizeof *addrs);
    if (!nodes || !l || !addrs || sh_rt.drv.cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        free(l);
        free(addrs);
        return;
    }
    size_t k = 0, i = 0;
    for (; i < n && k < GRAPH_MAX_ADDRS; i++)
        k += scan_node(nodes[i], addrs + k, GRAPH_MAX_ADDRS - k, &l->ns);
    free(nodes);
    l->ns.opaque |= i < n; /* nodes left unread */
    l->exec = exec;
    l->addrs = addrs;
    l->n = k;
    pthread_mutex_lock(&graphs_mu);
    l->next = graphs;
    graphs = l;
    pthread_mutex_unlock(&graphs_mu);
}

static void forget(CUgraphExec exec)
{
    pthread_mutex_lock(&graphs_mu);
    for (struct learned **pp = &graphs; *pp; pp = &(*pp)->next)
        if ((*pp)->exec == exec) {
            struct learned *l = *pp;
            *pp = l->next;
            free(l->addrs);
            free(l->ns.cands);
            free(l);
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
}

/* New parameters of one node of exec: what they touch joins what exec is
 * known to touch; what they may reach through tables is not followed, so
 * exec counts as opaque from then on. */
static void learn_more(CUgraphExec exec, const uintptr_t *addrs, size_t n)
{
    pthread_mutex_lock(&graphs_mu);
    for (struct learned *l = graphs; l; l = l->next)
        if (l->exec == exec) {
            size_t k = l->n + n <= GRAPH_MAX_ADDRS ? n : GRAPH_MAX_ADDRS - l->n;
            memcpy(l->addrs + l->n, addrs, k * sizeof *addrs);
            l->n += k;
            l->ns.opaque = 1;
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
}

static void instantiated(int ok, CUgraphExec exec, CUgraph graph)
{
    if (ok && inst_depth == 1 && sh_managed())
        learn(exec, graph);
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

/* ---- launches ---- */

/* Whether a launch of l is opaque: what its nodes were, or a candidate of
 * its kernels in a pointer table (checked again when tables change).
 * graphs_mu held. */
static int launch_opaque(struct learned *l)
{
    uint64_t gen = sh_launch_tables_gen();
    if (l->gen != gen) {
        l->hit = sh_launch_in_tables(l->ns.cands, l->ns.ncands);
        l->gen = gen;
    }
    return l->ns.opaque || l->hit;
}

void sh_graph_launch_begin(CUgraphExec exec, CUstream stream)
{
    uintptr_t *addrs = NULL;
    size_t n = 0;
    int opaque = 1; /* a graph not learned (instantiated before any region): anything */
    pthread_mutex_lock(&graphs_mu);
    for (struct learned *l = graphs; l; l = l->next)
        if (l->exec == exec && (addrs = malloc(l->n * sizeof *addrs + 1))) {
            memcpy(addrs, l->addrs, l->n * sizeof *addrs);
            n = l->n;
            opaque = launch_opaque(l);
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
    sh_launch_begin_addrs((uint64_t)(uintptr_t)exec, addrs, n, opaque, stream);
    free(addrs);
}

EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ready();
    destroy_depth++;
    if (destroy_depth == 1)
        forget((CUgraphExec)exec);
    cudaError_t e = real.cudaGraphExecDestroy(exec);
    destroy_depth--;
    return e;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    ready();
    destroy_depth++;
    if (destroy_depth == 1)
        forget(exec);
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
        learn_more(exec, addrs, n);
    update_depth--;
}

/* The driver's view of runtime kernel node parameters, for the scan. */
static size_t rt_kernel_addrs(const struct cudaKernelNodeParams *p, uintptr_t *addrs, size_t max)
{
    return p && p->func ? sh_launch_scan(p->func, SH_KEY_HOST_FN, p->kernelParams, addrs, max, NULL)
                        : 0;
}

static size_t rt_memcpy_addrs(const struct cudaMemcpy3DParms *p, uintptr_t *addrs)
{
    if (!p)
        return 0;
    const struct cudaPitchedPtr *s = &p->srcPtr, *d = &p->dstPtr;
    size_t k =
        p->srcArray
            ? 0
            : span((uintptr_t)s->ptr,
                   p->srcPos.x + p->srcPos.y * s->pitch + p->srcPos.z * s->pitch * s->ysize,
                   s->pitch, s->ysize, p->extent.width, p->extent.height, p->extent.depth, addrs);
    return k + (p->dstArray
                    ? 0
                    : span((uintptr_t)d->ptr,
                           p->dstPos.x + p->dstPos.y * d->pitch + p->dstPos.z * d->pitch * d->ysize,
                           d->pitch, d->ysize, p->extent.width, p->extent.height, p->extent.depth,
                           addrs + k));
}

EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                    const struct cudaKernelNodeParams *p)
{
    int outer = updating();
    uintptr_t addrs[GRAPH_NODE_ADDRS];
    size_t n = outer ? rt_kernel_addrs(p, addrs, GRAPH_NODE_ADDRS) : 0;
    cudaError_t e = real.cudaGraphExecKernelNodeSetParams(exec, node, p);
    node_changed(e == cudaSuccess, outer, (CUgraphExec)exec, addrs, n);
    return e;
}

EXPORT cudaError_t cudaGraphExecMemsetNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                    const struct cudaMemsetParams *p)
{
    int outer = updating();
    uintptr_t addrs[2];
    size_t n = outer && p ? span((uintptr_t)p->dst, 0, p->pitch, 1,
                                 (size_t)p->elementSize * p->width, p->height, 1, addrs)
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
    uintptr_t addrs[GRAPH_NODE_ADDRS];
    size_t n = outer && p ? kernel_addrs(p, addrs, GRAPH_NODE_ADDRS, NULL) : 0;
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
    uintptr_t addrs[GRAPH_NODE_ADDRS];
    size_t n = outer && p && p->func ? sh_launch_scan(p->func, SH_KEY_FUNCTION, p->kernelParams,
                                                      addrs, GRAPH_NODE_ADDRS, NULL)
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
    size_t n = outer && p ? memset_addrs(p, addrs, 2) : 0;
    CUresult r = real.cuGraphExecMemsetNodeSetParams(exec, node, p, ctx);
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_MEMCPY3D *p, CUcontext ctx)
{
    int outer = updating();
    uintptr_t addrs[4];
    size_t n = outer && p ? memcpy_addrs(p, addrs, 4) : 0;
    CUresult r = real.cuGraphExecMemcpyNodeSetParams(exec, node, p, ctx);
    node_changed(r == CUDA_SUCCESS, outer, exec, addrs, n);
    return r;
}

/* The whole executable graph now does what graph does: learned afresh. */
static void updated(int ok, int outer, CUgraphExec exec, CUgraph graph)
{
    if (ok && outer) {
        forget(exec);
        learn(exec, graph);
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
