/* drv_copy.c — copies and memsets: the cuMemcpy and cuMemset families,
 * peer copies, and the node parameters of copy and memset graph nodes.
 * Copies run on stream workers, like kernels, inside the fault guard.
 *
 * Shared state: the learned cost of moving a byte, per direction (atomics).
 */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

static void op_free(struct sim_op *op)
{
    free(op->waits);
    free(op);
}

/* ---- copies and memsets ---- */

struct copy_op {
    struct sim_op op;
    void *dst;
    const void *src;
    size_t n;
    double us;
    int to_device;
    uint64_t dst_serial, src_serial; /* the VMM mappings at each end when issued */
};

/* What moving a byte costs this process (page faults included), learned
 * from the copies so far, per direction: a restore writes pages mapped
 * afresh and faults more than an eviction. A copy's own work is part of
 * its modelled time, not added to it (sim_paced). */
static struct sim_pace move_pace[2]; /* [to_device] */

/* A copy engine's reads and writes race the kernels by the hardware's
 * design: the library copies regions that kernels may still touch and
 * detects it afterwards (a prefetch is redone, an early eviction
 * abandoned), and the tests check every byte. ThreadSanitizer would report
 * those races as the C memory model's, so it does not watch the simulated
 * DMA; every other access stays watched. */
#if defined(__SANITIZE_THREAD__)
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
static void dma(void *dst, const void *src, size_t n)
{
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    memmove(dst, src, n);
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
}
#else
static void dma(void *dst, const void *src, size_t n)
{
    memmove(dst, src, n);
}
#endif

/* A transfer over the bus reads and writes all the while it runs, as a
 * kernel does, and work issued before a remap must end before it: a
 * mapping at either end that is remapped between the copy's issue (or its
 * graph's launch) and its end faults (on a GPU it would fault, or move
 * bytes to or from memory no longer there). Here the bytes land at the
 * end, so that is when it is caught. */
static void copy_watch(struct sim_op *op)
{
    struct copy_op *c = (struct copy_op *)op;
    c->dst_serial = c->us > 0 ? sim_map_serial((uintptr_t)c->dst) : 0;
    c->src_serial = c->us > 0 ? sim_map_serial((uintptr_t)c->src) : 0;
}

/* The end of c that was remapped since copy_watch, or 0. */
static uintptr_t copy_remapped(const struct copy_op *c)
{
    if (c->dst_serial && sim_map_serial((uintptr_t)c->dst) != c->dst_serial)
        return (uintptr_t)c->dst;
    if (c->src_serial && sim_map_serial((uintptr_t)c->src) != c->src_serial)
        return (uintptr_t)c->src;
    return 0;
}

/* The bytes land at (about) the end of the transfer. */
static bool copy_land(void *arg)
{
    struct copy_op *c = arg;
    uintptr_t moved = copy_remapped(c);
    if (moved) {
        sim_fault(moved, "a copy whose memory was remapped before it ended");
        return false;
    }
    dma(c->dst, c->src, c->n);
    return true;
}

static void copy_run(struct sim_op *op)
{
    struct copy_op *c = (struct copy_op *)op;
    double took = sim_paced(&move_pace[c->to_device], c->us, c->n, copy_land, c);
    if (c->us > 0)
        atomic_fetch_add(c->to_device ? &sim_stats.us_h2d : &sim_stats.us_d2h,
                         (unsigned long long)(took + 0.5));
}

/* Counts a copy and returns the time it takes on the modelled link. */
static double account_copy(const void *dst, const void *src, size_t n)
{
    bool d_dev = sim_mem_kind((uintptr_t)dst) == SIM_MEM_DEVICE;
    bool s_dev = sim_mem_kind((uintptr_t)src) == SIM_MEM_DEVICE;
    if (d_dev == s_dev)
        return 0;
    if (d_dev) {
        atomic_fetch_add(&sim_stats.copies_h2d, 1);
        atomic_fetch_add(&sim_stats.bytes_h2d, n);
    } else {
        atomic_fetch_add(&sim_stats.copies_d2h, 1);
        atomic_fetch_add(&sim_stats.bytes_d2h, n);
    }
    return sim_cfg.pcie_bytes_per_us > 0 ? (double)n / sim_cfg.pcie_bytes_per_us : 0;
}

static CUresult submit_and_maybe_wait(struct sim_stream *s, struct sim_op *op, bool sync)
{
    uint64_t ticket;
    CUresult r = sim_stream_submit(s, op, &ticket);
    if (r == CUDA_SUCCESS && sync) {
        sim_stream_wait_ticket(s, ticket);
        r = sim_check();
    }
    return r;
}

/* A copy on any device's stream: copies, unlike kernels, may be issued to
 * a stream of another device than the current one, and reach every
 * device's memory without peer access (the copy is staged). */
static CUresult copy_submit(void *dst, const void *src, size_t n, CUstream hs, bool sync)
{
    struct sim_stream *s = sim_stream_get(hs);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    struct copy_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (struct copy_op){.op = {.run = copy_run,
                                  .fini = op_free,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEMCPY,
                                  .relocate = copy_watch},
                           .dst = dst,
                           .src = src,
                           .n = n};
    op->us = account_copy(dst, src, n);
    op->to_device = sim_mem_kind((uintptr_t)dst) == SIM_MEM_DEVICE;
    copy_watch(&op->op);
    return submit_and_maybe_wait(s, &op->op, sync);
}

CUresult sim_copy(const char *api, void *dst, const void *src, size_t n, CUstream hs, bool sync)
{
    CUresult r = sim_enter(api, true);
    return r ? r : copy_submit(dst, src, n, hs, sync);
}

/* cuMemcpyPeer(Async): the contexts must be contexts; the synchronous form
 * is serialised with all work of both devices (cudaMemcpyPeer's words). */
static CUresult peer_copy(const char *api, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                          CUcontext src_ctx, size_t n, CUstream hs, bool sync)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    int dd = sim_ctx_device(dst_ctx), sd = sim_ctx_device(src_ctx);
    if (dd < 0 || sd < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (sync) {
        sim_device_synchronize(dd);
        sim_device_synchronize(sd);
    }
    return copy_submit((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, hs, sync);
}

SIM_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                 CUcontext src_ctx, size_t n)
{
    return peer_copy(__func__, dst, dst_ctx, src, src_ctx, n, NULL, true);
}

SIM_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                      CUcontext src_ctx, size_t n, CUstream s)
{
    return peer_copy(__func__, dst, dst_ctx, src, src_ctx, n, s, false);
}

struct fill_op {
    struct sim_op op;
    void *dst;
    unsigned value;
    size_t elem, count;
};

static void fill_run(struct sim_op *op)
{
    struct fill_op *f = (struct fill_op *)op;
    if (f->elem == 1) {
        memset(f->dst, (int)f->value, f->count);
        return;
    }
    for (size_t i = 0; i < f->count; i++) {
        if (f->elem == 2)
            ((uint16_t *)f->dst)[i] = (uint16_t)f->value;
        else
            ((uint32_t *)f->dst)[i] = f->value;
    }
}

CUresult sim_fill(const char *api, void *dst, unsigned value, size_t elem, size_t count,
                  CUstream hs, bool sync)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(hs);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (count == 0)
        return CUDA_SUCCESS;
    if (!dst || ((uintptr_t)dst & (elem - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    struct fill_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (struct fill_op){.op = {.run = fill_run,
                                  .fini = op_free,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEMSET},
                           .dst = dst,
                           .value = value,
                           .elem = elem,
                           .count = count};
    return submit_and_maybe_wait(s, &op->op, sync);
}

#define P(x)  ((void *)(uintptr_t)(x))
#define CP(x) ((const void *)(uintptr_t)(x))

SIM_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return sim_copy(__func__, P(dst), CP(src), n, NULL, true);
}
SIM_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(__func__, P(dst), CP(src), n, s, false);
}
SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return sim_copy(__func__, P(dst), src, n, NULL, true);
}
SIM_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return sim_copy(__func__, dst, CP(src), n, NULL, true);
}
SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return sim_copy(__func__, P(dst), CP(src), n, NULL, true);
}
SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return sim_copy(__func__, P(dst), src, n, s, false);
}
SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(__func__, dst, CP(src), n, s, false);
}
SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(__func__, P(dst), CP(src), n, s, false);
}
static const void *endpoint(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x);

/* cuMemcpy2D(Async): one copy per row, in order on the stream; the
 * synchronous form returns when the last has landed. No arrays. */
static CUresult copy2d(const char *api, const CUDA_MEMCPY2D *p, CUstream hs, bool sync)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    if (!p || (p->Height > 1 && (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes)))
        return CUDA_ERROR_INVALID_VALUE;
    if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY)
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *src = endpoint(p->srcMemoryType, p->srcHost, p->srcDevice,
                               p->srcXInBytes + p->srcY * p->srcPitch);
    char *dst = (char *)(uintptr_t)endpoint(p->dstMemoryType, p->dstHost, p->dstDevice,
                                            p->dstXInBytes + p->dstY * p->dstPitch);
    if (!src || !dst)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t y = 0; y < p->Height && r == CUDA_SUCCESS; y++)
        r = copy_submit(dst + y * p->dstPitch, src + y * p->srcPitch, p->WidthInBytes, hs,
                        sync && y + 1 == p->Height);
    return r;
}

SIM_EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *p)
{
    return copy2d(__func__, p, NULL, true);
}

SIM_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *p, CUstream s)
{
    return copy2d(__func__, p, s, false);
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
    return sim_fill(__func__, P(dst), v, 1, n, NULL, true);
}
SIM_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n)
{
    return sim_fill(__func__, P(dst), v, 2, n, NULL, true);
}
SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
    return sim_fill(__func__, P(dst), v, 4, n, NULL, true);
}
SIM_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
    return sim_fill(__func__, P(dst), v, 1, n, s, false);
}
SIM_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s)
{
    return sim_fill(__func__, P(dst), v, 2, n, s, false);
}
SIM_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
    return sim_fill(__func__, P(dst), v, 4, n, s, false);
}

/* ---- graph node parameters: what a node does, and a new node to replace
 * it in an executable graph. Copies and memsets are one-dimensional here:
 * 2D/3D shapes and arrays are refused with CUDA_ERROR_NOT_SUPPORTED. ---- */

bool sim_fill_info(const struct sim_op *op, CUDA_MEMSET_NODE_PARAMS *p)
{
    if (op->run != fill_run)
        return false;
    const struct fill_op *f = (const struct fill_op *)op;
    *p = (CUDA_MEMSET_NODE_PARAMS){.dst = (CUdeviceptr)(uintptr_t)f->dst,
                                   .value = f->value,
                                   .elementSize = (unsigned)f->elem,
                                   .width = f->count,
                                   .height = 1};
    return true;
}

static void side(const void *ptr, CUmemorytype *type, const void **host, CUdeviceptr *dev)
{
    bool d = sim_mem_kind((uintptr_t)ptr) == SIM_MEM_DEVICE;
    *type = d ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    *host = d ? NULL : ptr;
    *dev = d ? (CUdeviceptr)(uintptr_t)ptr : 0;
}

bool sim_copy_info(const struct sim_op *op, CUDA_MEMCPY3D *p)
{
    if (op->run != copy_run)
        return false;
    const struct copy_op *c = (const struct copy_op *)op;
    const void *dst_host;
    memset(p, 0, sizeof *p);
    side(c->src, &p->srcMemoryType, &p->srcHost, &p->srcDevice);
    side(c->dst, &p->dstMemoryType, &dst_host, &p->dstDevice);
    p->dstHost = (void *)(uintptr_t)dst_host;
    p->WidthInBytes = c->n;
    p->Height = p->Depth = 1;
    return true;
}

struct sim_op *sim_fill_op(const CUDA_MEMSET_NODE_PARAMS *p, CUresult *r)
{
    *r = CUDA_ERROR_INVALID_VALUE;
    if (!p || !p->dst || p->width == 0 || p->height == 0 ||
        (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) ||
        p->dst & (p->elementSize - 1))
        return NULL;
    if (p->height > 1 && p->pitch != p->width * p->elementSize) {
        *r = CUDA_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    struct fill_op *op = calloc(1, sizeof *op);
    if (!op) {
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    *op = (struct fill_op){.op = {.run = fill_run,
                                  .fini = op_free,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEMSET},
                           .dst = (void *)(uintptr_t)p->dst,
                           .value = p->value,
                           .elem = p->elementSize,
                           .count = p->width * p->height};
    *r = CUDA_SUCCESS;
    return &op->op;
}

/* The address one side of a 1D CUDA_MEMCPY3D names, or NULL. */
static const void *endpoint(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x)
{
    switch (type) {
    case CU_MEMORYTYPE_HOST:
        return host ? (const char *)host + x : NULL;
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED:
        return dev ? (const char *)(uintptr_t)dev + x : NULL;
    default:
        return NULL;
    }
}

struct sim_op *sim_copy_op(const CUDA_MEMCPY3D *p, CUresult *r)
{
    *r = CUDA_ERROR_INVALID_VALUE;
    if (!p || p->WidthInBytes == 0)
        return NULL;
    if (p->Height > 1 || p->Depth > 1 || p->srcY || p->srcZ || p->dstY || p->dstZ ||
        p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
        *r = CUDA_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    const void *src = endpoint(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes);
    const void *dst = endpoint(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes);
    if (!src || !dst)
        return NULL;
    struct copy_op *op = calloc(1, sizeof *op);
    if (!op) {
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    *op = (struct copy_op){.op = {.run = copy_run,
                                  .fini = op_free,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEMCPY,
                                  .relocate = copy_watch},
                           .dst = (void *)(uintptr_t)dst,
                           .src = src,
                           .n = p->WidthInBytes};
    op->us = account_copy(op->dst, src, op->n);
    *r = CUDA_SUCCESS;
    return &op->op;
}
