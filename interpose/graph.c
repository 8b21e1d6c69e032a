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
 * A copy node from the host reads the host's bytes when the graph runs,
 * not when it was captured: they are read for pointers at each launch, as
 * a host-to-device copy's are when it is issued.
 *
 * This file keeps what is learned, and counts captures; graphexec.c holds
 * the hooks that see graphs made, changed and destroyed.
 *
 * Locking: graphs_mu guards the exec -> regions table.
 */
#include "interpose/graph.h"

#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_MAX_ADDRS 4096

/* A copy node from host memory to the device. */
struct upload {
    uintptr_t dst;
    const void *src;
    size_t dpitch, drows, spitch, srows, width, height, depth;
};

struct learned {
    CUgraphExec exec;
    uintptr_t *addrs;
    size_t n;
    struct upload *ups;
    size_t nups;
    /* Its kernel nodes' candidates, checked again against the pointer
     * tables whenever one is recorded (gen): hit, the last answer. */
    struct sh_node_scan ns;
    uint64_t gen;
    int hit;
    struct learned *next;
};

static pthread_mutex_t graphs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct learned *graphs;

/* ---- capture ---- */

/* Counted once per capture, by the outermost intercepted call: the
 * interception table's depth keeps the runtime's own call into the driver
 * from counting it twice. Returns 1 when the last capture ended: the
 * evictions that waited for it are due, once the caller has left the
 * gates (sh_graph_captures_ended). */
int sh_graph_capture(int begin, int result)
{
    if (begin) {
        if (result == 0)
            atomic_fetch_add(&sh_rt.captures, 1);
        return 0;
    }
    /* An invalidated capture has ended too (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
     * and cudaErrorStreamCaptureInvalidated are both 901). Never below
     * zero: a count gone negative would hide the next capture. */
    if (result != 0 && result != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        return 0;
    int left = atomic_load(&sh_rt.captures);
    while (left > 0 && !atomic_compare_exchange_weak(&sh_rt.captures, &left, left - 1))
        ;
    return left == 1;
}

void sh_graph_captures_ended(void)
{
    for (int i = 0; i < atomic_load(&sh_rt.ndevs); i++) {
        struct sh_dev *d = sh_rt.devs[i];
        sh_engine_lock(&d->engine);
        sh_engine_make_room(&d->engine, 0, NULL, 0);
        sh_engine_unlock(&d->engine);
    }
}

/* ---- learning a graph's regions at instantiation ---- */

/* The first and last byte of a pitched range starting at base (0 if none). */
size_t sh_graph_span(uintptr_t base, size_t off, size_t pitch, size_t rows, size_t width,
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

size_t sh_graph_memset_addrs(const CUDA_MEMSET_NODE_PARAMS *p, uintptr_t *addrs, size_t max)
{
    if (max < 2)
        return 0;
    return sh_graph_span((uintptr_t)p->dst, 0, p->pitch, 1, (size_t)p->elementSize * p->width,
                         p->height, 1, addrs);
}

/* Both ends of a copy (host ends too: they match no region). */
size_t sh_graph_memcpy_addrs(const CUDA_MEMCPY3D *p, uintptr_t *addrs, size_t max)
{
    if (max < 4)
        return 0;
    uintptr_t src = p->srcMemoryType == CU_MEMORYTYPE_HOST    ? (uintptr_t)p->srcHost
                    : p->srcMemoryType == CU_MEMORYTYPE_ARRAY ? 0
                                                              : (uintptr_t)p->srcDevice;
    uintptr_t dst = p->dstMemoryType == CU_MEMORYTYPE_HOST    ? (uintptr_t)p->dstHost
                    : p->dstMemoryType == CU_MEMORYTYPE_ARRAY ? 0
                                                              : (uintptr_t)p->dstDevice;
    size_t k = sh_graph_span(
        src, p->srcXInBytes + p->srcY * p->srcPitch + p->srcZ * p->srcPitch * p->srcHeight,
        p->srcPitch, p->srcHeight, p->WidthInBytes, p->Height, p->Depth, addrs);
    return k + sh_graph_span(
                   dst,
                   p->dstXInBytes + p->dstY * p->dstPitch + p->dstZ * p->dstPitch * p->dstHeight,
                   p->dstPitch, p->dstHeight, p->WidthInBytes, p->Height, p->Depth, addrs + k);
}

size_t sh_graph_kernel_addrs(const CUDA_KERNEL_NODE_PARAMS *p, uintptr_t *addrs, size_t max,
                             struct sh_node_scan *ns)
{
    if (!p->kernelParams && p->extra) {
        ns->opaque = 1; /* a packed parameter buffer, as at a launch: not read */
        return 0;
    }
    if (p->func)
        return sh_launch_scan(p->func, SH_KEY_FUNCTION, p->kernelParams, addrs, max, ns);
    return sh_launch_scan(p->kern, SH_KEY_KERNEL, p->kernelParams, addrs, max, ns);
}

/* A copy node from the host: kept in l, to be read at each launch. A node
 * that cannot be kept makes the graph opaque. */
static void keep_upload(struct learned *l, const CUDA_MEMCPY3D *p)
{
    int from_host =
        p->srcMemoryType == CU_MEMORYTYPE_HOST || (p->srcMemoryType == CU_MEMORYTYPE_UNIFIED &&
                                                   p->srcDevice && sh_host_readable(p->srcDevice));
    if (!from_host || p->dstMemoryType == CU_MEMORYTYPE_HOST ||
        p->dstMemoryType == CU_MEMORYTYPE_ARRAY || !p->WidthInBytes)
        return;
    struct upload *u = realloc(l->ups, (l->nups + 1) * sizeof *u);
    if (!u) {
        l->ns.opaque = 1;
        return;
    }
    l->ups = u;
    const char *src =
        p->srcMemoryType == CU_MEMORYTYPE_HOST ? p->srcHost : (const void *)p->srcDevice;
    u[l->nups++] = (struct upload){
        .dst = p->dstDevice + p->dstXInBytes + (p->dstZ * p->dstHeight + p->dstY) * p->dstPitch,
        .src = src + p->srcXInBytes + (p->srcZ * p->srcHeight + p->srcY) * p->srcPitch,
        .dpitch = p->dstPitch,
        .drows = p->dstHeight,
        .spitch = p->srcPitch,
        .srows = p->srcHeight,
        .width = p->WidthInBytes,
        .height = p->Height ? p->Height : 1,
        .depth = p->Depth ? p->Depth : 1};
}

/* What a node reads or writes: kernels' pointer parameters, memset and
 * memcpy ranges. Nodes that run nothing on the device, or only the
 * graph's own memory, touch no region's bytes; any other node (a child
 * graph, a conditional, a batch of memory operations, a type this build
 * does not know) or one whose parameters cannot be read makes the graph
 * opaque. */
static size_t scan_node(CUgraphNode node, uintptr_t *addrs, size_t max, struct learned *l)
{
    struct sh_node_scan *ns = &l->ns;
    CUgraphNodeType type;
    if (sh_rt.drv.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS) {
        ns->opaque = 1;
        return 0;
    }
    switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        CUDA_KERNEL_NODE_PARAMS p;
        if (sh_rt.drv.cuGraphKernelNodeGetParams(node, &p) == CUDA_SUCCESS)
            return sh_graph_kernel_addrs(&p, addrs, max, ns);
        ns->opaque = 1;
        return 0;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS p;
        if (sh_rt.drv.cuGraphMemsetNodeGetParams(node, &p) == CUDA_SUCCESS)
            return sh_graph_memset_addrs(&p, addrs, max);
        ns->opaque = 1;
        return 0;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
        CUDA_MEMCPY3D p;
        if (sh_rt.drv.cuGraphMemcpyNodeGetParams(node, &p) == CUDA_SUCCESS) {
            keep_upload(l, &p);
            return sh_graph_memcpy_addrs(&p, addrs, max);
        }
        ns->opaque = 1;
        return 0;
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

void sh_graph_learn(CUgraphExec exec, CUgraph graph)
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
        k += scan_node(nodes[i], addrs + k, GRAPH_MAX_ADDRS - k, l);
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

void sh_graph_forget(CUgraphExec exec)
{
    pthread_mutex_lock(&graphs_mu);
    for (struct learned **pp = &graphs; *pp; pp = &(*pp)->next)
        if ((*pp)->exec == exec) {
            struct learned *l = *pp;
            *pp = l->next;
            free(l->addrs);
            free(l->ups);
            free(l->ns.cands);
            free(l);
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
}

/* New parameters of one node of exec: what they touch joins what exec is
 * known to touch; what they may reach through tables is not followed, so
 * exec counts as opaque from then on. */
void sh_graph_learn_more(CUgraphExec exec, const uintptr_t *addrs, size_t n)
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

/* ---- launches ---- */

/* The bytes l's copy nodes from the host upload now. graphs_mu held (it
 * is taken before the pool's and the tables' locks). */
static void read_uploads(const struct learned *l)
{
    for (size_t i = 0; i < l->nups; i++) {
        const struct upload *u = &l->ups[i];
        sh_launch_mark_upload_slices(u->dst, u->dpitch, u->drows, u->src, u->spitch, u->srows,
                                     u->width, u->height, u->depth);
    }
}

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
            read_uploads(l); /* first: a table they fill counts for this launch */
            memcpy(addrs, l->addrs, l->n * sizeof *addrs);
            n = l->n;
            opaque = launch_opaque(l);
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
    sh_launch_begin_addrs((uint64_t)(uintptr_t)exec, addrs, n, opaque, stream);
    free(addrs);
}
