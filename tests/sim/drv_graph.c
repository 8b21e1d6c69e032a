/* drv_graph.c — stream capture into graphs, and graph launches.
 *
 * A capture records the ops a stream would have run as a linear chain of
 * template nodes. Instantiation copies the templates; a launch copies them
 * again and submits the copies to a stream, so one executable graph can be
 * launched many times. Kernel nodes keep their parameter values as
 * captured, as on a GPU.
 *
 * Locking: graph_mu guards node arrays while they grow and the list of
 * graphs handed out; a handle is valid while it is on that list (checked by
 * address, never by reading a graph that may have been freed), and graphs
 * are freed only by their destroy calls.
 */
#include "sim.h"

#include <cupti.h> /* the parameter structs CUPTI hands out */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_MAGIC 0x47524150u
#define EXEC_MAGIC  0x47455845u

struct sim_graph {
    unsigned magic;
    struct sim_op **nodes;
    size_t n, cap;
    /* An executable graph: the template node each node was made from (the
     * handle an update names it by; compared, never read). */
    const void **origin;
    struct sim_graph *next; /* on the handed-out list */
};

static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_graph *handed_out; /* graphs and executable graphs; graph_mu */

/* Makes g a valid handle. */
static void hand_out(struct sim_graph *g)
{
    pthread_mutex_lock(&graph_mu);
    g->next = handed_out;
    handed_out = g;
    pthread_mutex_unlock(&graph_mu);
}

/* The handed-out graph h with this magic, or NULL; unlinked from the list
 * too when take is set. graph_mu held. */
static struct sim_graph *lookup(const void *h, unsigned magic, bool take)
{
    for (struct sim_graph **pp = &handed_out; *pp; pp = &(*pp)->next) {
        struct sim_graph *g = *pp;
        if ((const void *)g != h)
            continue;
        if (g->magic != magic)
            return NULL;
        if (take)
            *pp = g->next;
        return g;
    }
    return NULL;
}

struct sim_graph *sim_graph_new(void)
{
    struct sim_graph *g = calloc(1, sizeof *g);
    if (g)
        g->magic = GRAPH_MAGIC;
    return g;
}

CUresult sim_graph_append(struct sim_graph *g, struct sim_op *op)
{
    pthread_mutex_lock(&graph_mu);
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct sim_op **t = realloc(g->nodes, cap * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&graph_mu);
            if (op->fini)
                op->fini(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g->nodes = t;
        g->cap = cap;
    }
    g->nodes[g->n++] = op;
    pthread_mutex_unlock(&graph_mu);
    return CUDA_SUCCESS;
}

struct sim_op *sim_op_clone(const struct sim_op *op)
{
    struct sim_op *c = malloc(op->size);
    if (!c)
        return NULL;
    memcpy(c, op, op->size);
    c->next = NULL;
    c->waits = NULL;
    c->nwaits = 0;
    if (c->relocate)
        c->relocate(c);
    return c;
}

static void free_nodes(struct sim_op **nodes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (nodes[i]->fini)
            nodes[i]->fini(nodes[i]);
    free(nodes);
}

static struct sim_graph *graph_get(CUgraph h, unsigned magic)
{
    pthread_mutex_lock(&graph_mu);
    struct sim_graph *g = lookup(h, magic, false);
    pthread_mutex_unlock(&graph_mu);
    return g;
}

/* A copy of g's nodes, with the given magic: an executable graph. */
static struct sim_graph *copy_graph(const struct sim_graph *g, unsigned magic)
{
    struct sim_graph *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->magic = magic;
    e->nodes = calloc(g->n ? g->n : 1, sizeof *e->nodes);
    e->origin = calloc(g->n ? g->n : 1, sizeof *e->origin);
    for (size_t i = 0; e->origin && i < g->n; i++)
        e->origin[i] = g->nodes[i];
    if (!e->origin) {
        free(e->nodes);
        e->nodes = NULL;
    }
    for (size_t i = 0; e->nodes && i < g->n; i++) {
        if (!(e->nodes[i] = sim_op_clone(g->nodes[i]))) {
            free_nodes(e->nodes, i);
            e->nodes = NULL;
        }
        e->n = i + 1;
    }
    if (!e->nodes) {
        free(e->origin);
        free(e);
        return NULL;
    }
    e->n = g->n;
    return e;
}

/* ---- capture ---- */

SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    return sim_capture_begin(s);
}

SIM_EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *graph)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *g;
    bool invalid;
    if ((r = sim_capture_end(s, &g, &invalid)))
        return r;
    if (invalid) {
        free_nodes(g->nodes, g->n);
        free(g);
        *graph = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    hand_out(g);
    *graph = (CUgraph)g;
    return CUDA_SUCCESS;
}

/* ---- graphs ---- */

SIM_EXPORT CUresult cuGraphGetNodes(CUgraph h, CUgraphNode *nodes, size_t *num)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    struct sim_graph *g = graph_get(h, GRAPH_MAGIC);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    if (!num)
        return CUDA_ERROR_INVALID_VALUE;
    if (!nodes) {
        *num = g->n;
        return CUDA_SUCCESS;
    }
    size_t k = *num < g->n ? *num : g->n;
    for (size_t i = 0; i < k; i++)
        nodes[i] = (CUgraphNode)g->nodes[i];
    *num = k;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!node || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = (CUgraphNodeType)((struct sim_op *)node)->node_type;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *p)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    CUfunction f;
    void **params;
    if (!node || !p || !sim_launch_info((struct sim_op *)node, &f, &params))
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->func = f;
    p->gridDimX = p->gridDimY = p->gridDimZ = 1;
    p->blockDimX = p->blockDimY = p->blockDimZ = 1;
    p->kernelParams = params;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph h,
                                                unsigned long long flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_graph *g = graph_get(h, GRAPH_MAGIC);
    if (!g || !exec || flags & ~0xfull)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *e = copy_graph(g, EXEC_MAGIC);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    hand_out(e);
    *exec = (CUgraphExec)e;
    return CUDA_SUCCESS;
}

static CUresult graph_launch(struct sim_graph *e, CUstream hs)
{
    struct sim_stream *s = sim_stream_get(hs);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < e->n; i++) {
        struct sim_op *op = sim_op_clone(e->nodes[i]);
        if (!op)
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (op->node_type == CU_GRAPH_NODE_TYPE_KERNEL)
            atomic_fetch_add(&sim_stats.launches, 1);
        CUresult r = sim_stream_submit(s, op, NULL);
        if (r)
            return r;
    }
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec h, CUstream hs)
{
    cuGraphLaunch_params p = {h, hs};
    struct sim_api_call call;
    sim_api_enter(&call, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
                  "cuGraphLaunch", NULL, &p);
    CUresult r = sim_enter(__func__, true);
    if (r == CUDA_SUCCESS) {
        struct sim_graph *e = graph_get((CUgraph)h, EXEC_MAGIC);
        r = e ? graph_launch(e, hs) : CUDA_ERROR_INVALID_VALUE;
    }
    sim_api_exit(&call, &r);
    return r;
}

static CUresult destroy(void *h, unsigned magic)
{
    CUresult r = sim_enter(magic == GRAPH_MAGIC ? "cuGraphDestroy" : "cuGraphExecDestroy", false);
    if (r)
        return r;
    pthread_mutex_lock(&graph_mu);
    struct sim_graph *g = lookup(h, magic, true);
    pthread_mutex_unlock(&graph_mu);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    g->magic = 0;
    free_nodes(g->nodes, g->n);
    free(g->origin);
    free(g);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphDestroy(CUgraph h)
{
    return destroy(h, GRAPH_MAGIC);
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec h)
{
    return destroy(h, EXEC_MAGIC);
}

/* ---- node parameters, and updating an executable graph ---- */

SIM_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS *p)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!node || !p || !sim_fill_info((struct sim_op *)node, p))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D *p)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!node || !p || !sim_copy_info((struct sim_op *)node, p))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Puts op in place of the exec's node made from template node tmpl, which
 * must be of the same type; op is freed if it is refused. */
static CUresult exec_set(CUgraphExec h, CUgraphNode tmpl, struct sim_op *op)
{
    struct sim_op *old = NULL;
    pthread_mutex_lock(&graph_mu);
    struct sim_graph *e = lookup(h, EXEC_MAGIC, false);
    for (size_t i = 0; e && tmpl && i < e->n; i++)
        if (e->origin[i] == (const void *)tmpl && e->nodes[i]->node_type == op->node_type) {
            old = e->nodes[i];
            e->nodes[i] = op;
            break;
        }
    pthread_mutex_unlock(&graph_mu);
    struct sim_op *gone = old ? old : op;
    if (gone->fini)
        gone->fini(gone);
    return old ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec h, CUgraphNode node,
                                                      const CUDA_KERNEL_NODE_PARAMS *p)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    struct sim_op *op = sim_kernel_op(p, &r);
    return op ? exec_set(h, node, op) : r;
}

SIM_EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec h, CUgraphNode node,
                                                   const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx)
{
    (void)ctx; /* one context */
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    struct sim_op *op = sim_fill_op(p, &r);
    return op ? exec_set(h, node, op) : r;
}

SIM_EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec h, CUgraphNode node,
                                                   const CUDA_MEMCPY3D *p, CUcontext ctx)
{
    (void)ctx;
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    struct sim_op *op = sim_copy_op(p, &r);
    return op ? exec_set(h, node, op) : r;
}

/* The generic update (CUDA 12.2): kernel, memset and memcpy nodes as the
 * typed calls update them. CUDA refuses it for memory nodes; the simulated
 * GPU makes no node of any other type, so no exec node can match one. */
static struct sim_op *node_op(const CUgraphNodeParams *p, CUresult *r)
{
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        const CUDA_KERNEL_NODE_PARAMS_v3 *k = &p->kernel;
        CUDA_KERNEL_NODE_PARAMS v2 = {.func = k->func,
                                      .gridDimX = k->gridDimX,
                                      .gridDimY = k->gridDimY,
                                      .gridDimZ = k->gridDimZ,
                                      .blockDimX = k->blockDimX,
                                      .blockDimY = k->blockDimY,
                                      .blockDimZ = k->blockDimZ,
                                      .sharedMemBytes = k->sharedMemBytes,
                                      .kernelParams = k->kernelParams,
                                      .extra = k->extra,
                                      .kern = k->kern,
                                      .ctx = k->ctx};
        return sim_kernel_op(&v2, r);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        const CUDA_MEMSET_NODE_PARAMS_v2 *m = &p->memset;
        CUDA_MEMSET_NODE_PARAMS v1 = {m->dst,         m->pitch, m->value,
                                      m->elementSize, m->width, m->height};
        return sim_fill_op(&v1, r);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        *r = CUDA_ERROR_INVALID_VALUE;
        if (p->memcpy.flags || p->memcpy.reserved)
            return NULL;
        return sim_copy_op(&p->memcpy.copyParams, r);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
        *r = CUDA_ERROR_NOT_SUPPORTED;
        return NULL;
    default:
        *r = CUDA_ERROR_INVALID_VALUE;
        return NULL;
    }
}

SIM_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec h, CUgraphNode node, CUgraphNodeParams *p)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!p || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_op *op = node_op(p, &r);
    return op ? exec_set(h, node, op) : r;
}

/* Why g cannot replace e's nodes: CU_GRAPH_EXEC_UPDATE_SUCCESS if it can
 * (same nodes, in order, of the same types, kernels of the same function,
 * memory nodes the same allocations). graph_mu held. */
static CUgraphExecUpdateResult update_check(const struct sim_graph *e, const struct sim_graph *g,
                                            size_t *bad)
{
    if (e->n != g->n) {
        *bad = 0;
        return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    }
    for (size_t i = 0; i < e->n; i++) {
        *bad = i;
        const struct sim_op *a = e->nodes[i], *b = g->nodes[i];
        if (a->node_type != b->node_type)
            return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
        CUfunction fa, fb;
        void **pa, **pb;
        if (sim_launch_info(a, &fa, &pa) && sim_launch_info(b, &fb, &pb) && fa != fb)
            return CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED;
        if ((a->node_type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
             a->node_type == CU_GRAPH_NODE_TYPE_MEM_FREE) &&
            e->origin[i] != (const void *)b)
            return CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED;
    }
    return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

SIM_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec h, CUgraph hg,
                                         CUgraphExecUpdateResultInfo *info)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!info)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    struct sim_graph *e = lookup(h, EXEC_MAGIC, false), *g = lookup(hg, GRAPH_MAGIC, false);
    if (!e || !g) {
        pthread_mutex_unlock(&graph_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t bad = 0;
    CUgraphExecUpdateResult res = update_check(e, g, &bad);
    *info = (CUgraphExecUpdateResultInfo){res, NULL, NULL};
    if (res != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
        info->errorNode = bad < g->n ? (CUgraphNode)g->nodes[bad] : NULL;
        info->errorFromNode = bad < e->n ? (CUgraphNode)e->origin[bad] : NULL;
        pthread_mutex_unlock(&graph_mu);
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    struct sim_op **fresh = calloc(g->n ? g->n : 1, sizeof *fresh);
    for (size_t i = 0; fresh && i < g->n; i++)
        if (!(fresh[i] = sim_op_clone(g->nodes[i]))) {
            free_nodes(fresh, i);
            fresh = NULL;
        }
    if (!fresh) {
        pthread_mutex_unlock(&graph_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_op **old = e->nodes;
    e->nodes = fresh;
    for (size_t i = 0; i < g->n; i++)
        e->origin[i] = g->nodes[i];
    pthread_mutex_unlock(&graph_mu);
    free_nodes(old, g->n);
    return CUDA_SUCCESS;
}
