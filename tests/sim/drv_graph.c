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
    for (size_t i = 0; e->nodes && i < g->n; i++) {
        if (!(e->nodes[i] = sim_op_clone(g->nodes[i]))) {
            free_nodes(e->nodes, i);
            e->nodes = NULL;
        }
        e->n = i + 1;
    }
    if (!e->nodes) {
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
