/* graph.c — stream capture and CUDA graphs.
 *
 * While any stream captures, a remap (which drains the device) would break
 * the capture, so evictions and restores wait until the last capture ends.
 * A graph's kernels are not launched one by one where we can see them, so
 * the regions its kernel nodes point into are learned when it is
 * instantiated, and made resident before each launch of it.
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

#define EXPORT          __attribute__((visibility("default")))
#define GRAPH_MAX_ADDRS 4096

struct learned {
    CUgraphExec exec;
    uintptr_t *addrs;
    size_t n;
    struct learned *next;
};

static pthread_mutex_t graphs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct learned *graphs;
static _Thread_local int cap_depth, inst_depth, destroy_depth;

static struct {
    __typeof__(cudaStreamBeginCapture) *cudaStreamBeginCapture;
    __typeof__(cudaStreamEndCapture) *cudaStreamEndCapture;
    __typeof__(cudaGraphInstantiate) *cudaGraphInstantiate;
    __typeof__(cudaGraphInstantiateWithFlags) *cudaGraphInstantiateWithFlags;
    __typeof__(cudaGraphLaunch) *cudaGraphLaunch;
    __typeof__(cudaGraphExecDestroy) *cudaGraphExecDestroy;
    __typeof__(cuStreamBeginCapture_v2) *cuStreamBeginCapture;
    __typeof__(cuStreamEndCapture) *cuStreamEndCapture;
    __typeof__(cuGraphInstantiateWithFlags) *cuGraphInstantiate;
    __typeof__(cuGraphLaunch) *cuGraphLaunch;
    __typeof__(cuGraphExecDestroy) *cuGraphExecDestroy;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define R(field, name) real.field = (__typeof__(real.field))dlsym(RTLD_NEXT, name)
    R(cudaStreamBeginCapture, "cudaStreamBeginCapture");
    R(cudaStreamEndCapture, "cudaStreamEndCapture");
    R(cudaGraphInstantiate, "cudaGraphInstantiate");
    R(cudaGraphInstantiateWithFlags, "cudaGraphInstantiateWithFlags");
    R(cudaGraphLaunch, "cudaGraphLaunch");
    R(cudaGraphExecDestroy, "cudaGraphExecDestroy");
    R(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    R(cuStreamEndCapture, "cuStreamEndCapture");
    R(cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    R(cuGraphLaunch, "cuGraphLaunch");
    R(cuGraphExecDestroy, "cuGraphExecDestroy");
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

static void capture_began(int ok)
{
    if (ok && cap_depth == 1 && sh_managed())
        atomic_fetch_add(&sh_rt.captures, 1);
}

static void capture_ended(int ended)
{
    if (!ended || cap_depth != 1 || !sh_managed())
        return;
    if (atomic_fetch_sub(&sh_rt.captures, 1) == 1)
        sh_make_room(0, NULL, 0); /* the evictions that waited for it */
}

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    ready();
    cap_depth++;
    cudaError_t e = real.cudaStreamBeginCapture(s, mode);
    capture_began(e == cudaSuccess);
    cap_depth--;
    return e;
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    ready();
    cap_depth++;
    cudaError_t e = real.cudaStreamEndCapture(s, graph);
    capture_ended(e == cudaSuccess || e == cudaErrorStreamCaptureInvalidated);
    cap_depth--;
    return e;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    ready();
    cap_depth++;
    CUresult r = real.cuStreamBeginCapture(s, mode);
    capture_began(r == CUDA_SUCCESS);
    cap_depth--;
    return r;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    ready();
    cap_depth++;
    CUresult r = real.cuStreamEndCapture(s, graph);
    capture_ended(r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cap_depth--;
    return r;
}

/* ---- learning a graph's regions at instantiation ---- */

static size_t scan_node(CUgraphNode node, uintptr_t *addrs, size_t max)
{
    CUgraphNodeType type;
    CUDA_KERNEL_NODE_PARAMS p;
    if (sh_rt.drv.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS ||
        type != CU_GRAPH_NODE_TYPE_KERNEL ||
        sh_rt.drv.cuGraphKernelNodeGetParams(node, &p) != CUDA_SUCCESS)
        return 0;
    if (p.func)
        return sh_launch_scan(p.func, SH_KEY_FUNCTION, p.kernelParams, addrs, max);
    return sh_launch_scan(p.kern, SH_KEY_KERNEL, p.kernelParams, addrs, max);
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
    size_t k = 0;
    for (size_t i = 0; i < n && k < GRAPH_MAX_ADDRS; i++)
        k += scan_node(nodes[i], addrs + k, GRAPH_MAX_ADDRS - k);
    free(nodes);
    *l = (struct learned){exec, addrs, k, NULL};
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
            free(l);
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

void sh_graph_launch_begin(CUgraphExec exec, CUstream stream)
{
    uintptr_t *addrs = NULL;
    size_t n = 0;
    pthread_mutex_lock(&graphs_mu);
    for (struct learned *l = graphs; l; l = l->next)
        if (l->exec == exec && (addrs = malloc(l->n * sizeof *addrs + 1))) {
            memcpy(addrs, l->addrs, l->n * sizeof *addrs);
            n = l->n;
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
    sh_launch_begin_addrs((uint64_t)(uintptr_t)exec, addrs, n, stream);
    free(addrs);
}

static int hooking(void)
{
    ready();
    return sh_managed() && sh_launch_mode() == SH_TRACK_HOOKS;
}

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!hooking())
        return real.cudaGraphLaunch(exec, s);
    sh_graph_launch_begin((CUgraphExec)exec, (CUstream)s);
    cudaError_t e = real.cudaGraphLaunch(exec, s);
    sh_launch_end();
    return e;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    if (!hooking())
        return real.cuGraphLaunch(exec, s);
    sh_graph_launch_begin(exec, s);
    CUresult r = real.cuGraphLaunch(exec, s);
    sh_launch_end();
    return r;
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
