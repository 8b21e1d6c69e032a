/* drv_alloc.c — allocations: cuMemAlloc (a private reservation with one
 * device handle), stream-ordered and graph allocations, and pinned host
 * memory.
 *
 * Locking: mem_mu (mem.h).
 */
#include "mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- cuMemAlloc: a private reservation with one device handle ---- */

/* Allocates size bytes on dev; pool: from dev's memory pool (stream-ordered
 * or graph), whose memory no other device reaches. */
static CUresult alloc_device(uintptr_t *out, size_t size, int dev, bool pool)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t mapped = round_up(size, page);
    uintptr_t va = reserve(mapped, 256 > page ? 256 : page, 0);
    if (!va)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mem_mu);
    unsigned long long h = 0;
    CUresult r = handle_create(mapped, CU_MEM_LOCATION_TYPE_DEVICE, dev, &h);
    if (r == CUDA_SUCCESS) {
        struct alloc_entry a = {va, size, mapped, h, false, pool, dev, NULL};
        struct map_entry m = {.va = va, .size = mapped, .handle = h};
        m.dev_access[dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (mmap((void *)va, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, handles[h]->fd,
                 0) == MAP_FAILED ||
            vec_insert(&allocs, &a) != 0 || vec_insert(&maps, &m) != 0) {
            struct alloc_entry *e = vec_find(&allocs, va);
            if (e)
                vec_erase(&allocs, e);
            handle_destroy(h);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            handles[h]->nmaps = 1;
            handles[h]->released = true;
        }
    }
    pthread_mutex_unlock(&mem_mu);
    if (r != CUDA_SUCCESS)
        munmap((void *)va, mapped);
    else
        *out = va;
    return r;
}

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t va = 0;
    r = alloc_device(&va, bytesize, sim_current_device(), false);
    if (r == CUDA_SUCCESS)
        *dptr = va;
    return r;
}

/* Managed memory: the CPU reaches device memory here anyway, so it is a
 * device allocation the program may also write from the host. */
SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t va = 0;
    r = alloc_device(&va, bytesize, sim_current_device(), false);
    if (r == CUDA_SUCCESS)
        *dptr = va;
    return r;
}

/* Frees a cuMemAlloc allocation; mem_mu held. */
static CUresult free_device(uintptr_t va)
{
    struct alloc_entry *a = vec_find(&allocs, va);
    if (!a || a->va != va)
        return CUDA_ERROR_INVALID_VALUE;
    struct map_entry *m = vec_find(&maps, va);
    size_t mapped = a->mapped;
    if (a->mpool)
        sim_pool_charge(a->mpool, a->size, false);
    handle_destroy(a->handle);
    vec_erase(&maps, m);
    vec_erase(&allocs, a);
    munmap((void *)va, mapped);
    return CUDA_SUCCESS;
}

static bool graph_alloc(uintptr_t va);

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (dptr == 0)
        return CUDA_SUCCESS;
    /* Like the real driver, freeing waits for the device. */
    if ((r = sim_ctx_synchronize()))
        return r;
    if (graph_alloc(dptr))
        return CUDA_SUCCESS; /* the graph gives it back when it goes */
    pthread_mutex_lock(&mem_mu);
    r = free_device(dptr);
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* ---- graph memory nodes ----
 * cuMemAllocAsync inside a capture makes an allocation node: the address is
 * fixed when it is captured and belongs to the graph (and every executable
 * graph made from it) until the last of them is destroyed. Every copy of
 * the node holds a reference; the last one frees the memory. A free of a
 * graph allocation (a free node in the capture, or a plain free outside
 * it) leaves the memory to the graph. */

struct gmem {
    _Atomic int refs;
    uintptr_t va;
};

struct gmem_op {
    struct sim_op op;
    struct gmem *g;
};

static void gmem_run(struct sim_op *op)
{
    (void)op; /* the memory is there from capture to destruction */
}

static void gmem_ref(struct sim_op *op)
{
    struct gmem *g = ((struct gmem_op *)op)->g;
    if (g)
        atomic_fetch_add(&g->refs, 1);
}

static void gmem_fini(struct sim_op *op)
{
    struct gmem *g = ((struct gmem_op *)op)->g;
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) {
        pthread_mutex_lock(&mem_mu);
        struct alloc_entry *a = vec_find(&allocs, g->va);
        if (a && a->va == g->va)
            a->graph = false;
        free_device(g->va);
        pthread_mutex_unlock(&mem_mu);
        free(g);
    }
    free(op->waits);
    free(op);
}

/* 1 when va is the start of a graph allocation. */
static bool graph_alloc(uintptr_t va)
{
    pthread_mutex_lock(&mem_mu);
    struct alloc_entry *a = vec_find(&allocs, va);
    bool g = a && a->va == va && a->graph;
    pthread_mutex_unlock(&mem_mu);
    return g;
}

static CUresult capture_alloc(CUdeviceptr *dptr, size_t bytesize, struct sim_stream *s)
{
    uintptr_t va = 0;
    struct gmem_op *op = calloc(1, sizeof *op);
    struct gmem *g = calloc(1, sizeof *g);
    CUresult r = op && g ? alloc_device(&va, bytesize, sim_stream_device(s), true)
                         : CUDA_ERROR_OUT_OF_MEMORY;
    if (r) {
        free(op);
        free(g);
        return r;
    }
    pthread_mutex_lock(&mem_mu);
    ((struct alloc_entry *)vec_find(&allocs, va))->graph = true;
    pthread_mutex_unlock(&mem_mu);
    *g = (struct gmem){1, va};
    *op = (struct gmem_op){.op = {.run = gmem_run,
                                  .fini = gmem_fini,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                                  .relocate = gmem_ref},
                           .g = g};
    if ((r = sim_stream_submit(s, &op->op, NULL))) /* op->fini has freed it */
        return r;
    *dptr = va;
    return CUDA_SUCCESS;
}

static CUresult capture_free(CUdeviceptr dptr, struct sim_stream *s)
{
    if (!graph_alloc(dptr)) /* a free node must free a graph allocation */
        return CUDA_ERROR_INVALID_VALUE;
    struct gmem_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (struct gmem_op){.op = {.run = gmem_run,
                                  .fini = gmem_fini,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEM_FREE}};
    return sim_stream_submit(s, &op->op, NULL);
}

/* Stream-ordered allocation from pool (NULL: the stream's device's
 * current pool): memory is usable at once; the free runs when the stream
 * reaches it. cuda.h: it comes from the pool of the stream's device. The
 * pools are device 0's (drv_pool.c): another device's allocation is
 * charged to none. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, struct sim_pool *mpool,
                            CUstream stream)
{
    CUresult r;
    struct sim_stream *s = sim_stream_get(stream);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureStatus cs;
    if ((r = sim_capture_query(s, &cs)))
        return r; /* the legacy stream while another captures */
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
        return capture_alloc(dptr, bytesize, s);
    uintptr_t va = 0;
    r = alloc_device(&va, bytesize, sim_stream_device(s), true);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Memory freed earlier on this stream is this allocation's to
         * reuse, in stream order: let those frees happen, then retry. */
        sim_stream_drain(s);
        r = alloc_device(&va, bytesize, sim_stream_device(s), true);
    }
    if (r != CUDA_SUCCESS)
        return r;
    if (!mpool && sim_stream_device(s) == 0)
        mpool = sim_pool_current();
    if (mpool) {
        pthread_mutex_lock(&mem_mu);
        ((struct alloc_entry *)vec_find(&allocs, va))->mpool = mpool;
        sim_pool_charge(mpool, bytesize, true);
        pthread_mutex_unlock(&mem_mu);
    }
    *dptr = va;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    CUresult r = sim_enter(__func__, true);
    return r ? r : alloc_async(dptr, bytesize, NULL, stream);
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream stream)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_pool *p = sim_pool_get(pool);
    return p ? alloc_async(dptr, bytesize, p, stream) : CUDA_ERROR_INVALID_VALUE;
}

struct free_op {
    struct sim_op op;
    uintptr_t va;
};

static void free_op_run(struct sim_op *op)
{
    pthread_mutex_lock(&mem_mu);
    free_device(((struct free_op *)op)->va);
    pthread_mutex_unlock(&mem_mu);
}

static void op_free(struct sim_op *op)
{
    free(op->waits);
    free(op);
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(stream);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mem_mu);
    struct alloc_entry *a = vec_find(&allocs, dptr);
    bool ok = a && a->va == dptr;
    pthread_mutex_unlock(&mem_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureStatus cs;
    if ((r = sim_capture_query(s, &cs)))
        return r;
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
        return capture_free(dptr, s);
    if (graph_alloc(dptr))
        return CUDA_SUCCESS; /* the graph gives it back when it goes */
    struct free_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->op.run = free_op_run;
    op->op.fini = op_free;
    op->op.size = sizeof *op;
    op->op.capture = SIM_CAP_REFUSE; /* a free node frees only graph memory */
    op->va = dptr;
    return sim_stream_submit(s, &op->op, NULL);
}

/* ---- pinned host memory ---- */

static CUresult host_alloc(const char *api, void **pp, size_t bytesize, unsigned int flags)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    if (!pp || bytesize == 0 || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = round_up(bytesize, (size_t)sysconf(_SC_PAGESIZE));
    pthread_mutex_lock(&mem_mu);
    if (!charge(CU_MEM_LOCATION_TYPE_HOST, 0, size)) {
        pthread_mutex_unlock(&mem_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct host_entry e = {(uintptr_t)p, size, false, sim_current_device()};
    if (p == MAP_FAILED || vec_insert(&hosts, &e) != 0) {
        if (p != MAP_FAILED)
            munmap(p, size);
        uncharge(CU_MEM_LOCATION_TYPE_HOST, 0, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *pp = p;
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    return host_alloc(__func__, pp, bytesize, flags);
}

SIM_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(__func__, pp, bytesize, 0);
}

SIM_EXPORT CUresult cuMemFreeHost(void *p)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    pthread_mutex_lock(&mem_mu);
    struct host_entry *e = vec_find(&hosts, (uintptr_t)p);
    if (!e || e->va != (uintptr_t)p || e->registered) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        munmap(p, e->size);
        uncharge(CU_MEM_LOCATION_TYPE_HOST, 0, e->size);
        vec_erase(&hosts, e);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!p || bytesize == 0 || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    if (vec_overlaps(&hosts, (uintptr_t)p, bytesize)) {
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else if (!charge(CU_MEM_LOCATION_TYPE_HOST, 0, bytesize)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct host_entry e = {(uintptr_t)p, bytesize, true, sim_current_device()};
        if (vec_insert(&hosts, &e) != 0) {
            uncharge(CU_MEM_LOCATION_TYPE_HOST, 0, bytesize);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostUnregister(void *p)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    pthread_mutex_lock(&mem_mu);
    struct host_entry *e = vec_find(&hosts, (uintptr_t)p);
    if (!e || e->va != (uintptr_t)p || !e->registered) {
        r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    } else {
        uncharge(CU_MEM_LOCATION_TYPE_HOST, 0, e->size);
        vec_erase(&hosts, e);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!pdptr || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    bool known = vec_find(&hosts, (uintptr_t)p) != NULL;
    pthread_mutex_unlock(&mem_mu);
    if (!known)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)p; /* unified addressing */
    return CUDA_SUCCESS;
}
