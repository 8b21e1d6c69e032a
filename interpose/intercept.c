/* intercept.c — what the generated wrappers do (see intercept.h), and the
 * ways a program can reach the driver's functions past the exported
 * symbols: cuGetProcAddress and cudaGetDriverEntryPoint[ByVersion] (dlsym
 * is in dlsym.c). Each hands out the library's export of the same name in
 * place of a CUDA library's own function.
 *
 * Shared state: the real entry points (atomic pointers, resolved lazily
 * because the driver may be loaded after the library) and our own handle.
 * The depth counter is per thread.
 */
#include "interpose/intercept.h"

#include "sh_err.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

_Thread_local int sh_work_depth; /* inside an intercepted call */
static atomic_int told_refused;
_Atomic(void *) sh_icept_reals[SH_ICEPT_MAX];

/* ---- real functions ---- */

void *sh_icept_resolve(size_t i)
{
    if (i >= sh_icept_count || i >= SH_ICEPT_MAX)
        return NULL;
    void *f = atomic_load_explicit(&sh_icept_reals[i], memory_order_acquire);
    if (f)
        return f;
    const struct sh_icept_entry *e = &sh_icept_table[i];
    f = sh_icept_lookup(e->runtime, e->name);
    if (f == sh_icept_wrappers[i]) /* never ourselves */
        f = NULL;
    if (f)
        atomic_store_explicit(&sh_icept_reals[i], f, memory_order_release);
    return f;
}

/* ---- handing out wrappers ---- */

/* Our export named as f is, if f is a CUDA library's exported function and
 * we export that name; else f. */
void *sh_icept_wrap(void *f)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!f || !dladdr1(f, &info, (void **)&lm, RTLD_DL_LINKMAP) || !sh_dl_is_cuda(lm) ||
        !info.dli_sname || info.dli_saddr != f)
        return f;
    void *mine = dlopen(sh_dl_self()->l_name, RTLD_LAZY | RTLD_NOLOAD);
    void *g = mine ? sh_dl_lookup(mine, info.dli_sname) : NULL;
    if (mine)
        dlclose(mine);
    return g && sh_dl_object(g) == sh_dl_self() ? g : f;
}

typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);

static void *driver_fn(const char *name)
{
    return sh_icept_lookup(0, name);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    get_proc_v2_fn real = (get_proc_v2_fn)driver_fn("cuGetProcAddress_v2");
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = sh_icept_wrap(*pfn);
    return r;
}

/* The CUDA 11.3 entry point, which cuda.h now renames to the _v2 one. */
#undef cuGetProcAddress
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    get_proc_v1_fn real = (get_proc_v1_fn)driver_fn("cuGetProcAddress");
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = sh_icept_wrap(*pfn);
    return r;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* still what CUDA 12 programs call */
EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **pfn, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *status)
{
    __typeof__(cudaGetDriverEntryPoint) *real =
        (__typeof__(cudaGetDriverEntryPoint) *)sh_icept_lookup(1, "cudaGetDriverEntryPoint");
    if (!real)
        return cudaErrorSymbolNotFound;
    cudaError_t e = real(symbol, pfn, flags, status);
    if (e == cudaSuccess && pfn)
        *pfn = sh_icept_wrap(*pfn);
    return e;
}
#pragma GCC diagnostic pop

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **pfn,
                                                    unsigned int version, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status)
{
    __typeof__(cudaGetDriverEntryPointByVersion) *real =
        (__typeof__(cudaGetDriverEntryPointByVersion) *)sh_icept_lookup(
            1, "cudaGetDriverEntryPointByVersion");
    if (!real)
        return cudaErrorSymbolNotFound;
    cudaError_t e = real(symbol, pfn, version, flags, status);
    if (e == cudaSuccess && pfn)
        *pfn = sh_icept_wrap(*pfn);
    return e;
}

/* ---- the work of one call ---- */

int sh_work_open_capture(struct sh_work *w, CUstream stream, int per_thread)
{
    return sh_managed() && sh_work_open(w, stream, per_thread);
}

int sh_work_open(struct sh_work *w, CUstream stream, int per_thread)
{
    if (!sh_active() || !sh_managed())
        return 0;
    sh_work_depth++;
    memset(w, 0, offsetof(struct sh_work, ends));
    w->per_thread = per_thread;
    w->stream = per_thread ? sh_stream_ptsz(stream) : stream;
    return 1;
}

/* 1 when a hole the pool cannot map again (pool/repair.c) might be reached:
 * by any kernel (it may follow pointers anywhere), by opaque work, or by a
 * range that meets it. The program gets an ordinary error for that call
 * instead of a fault that would end its context. */
/* 1 when w might reach a hole of pool's (there is one). */
static int reaches_hole(const struct sh_work *w, struct sh_pool *pool)
{
    int hit = w->kind != SH_WORK_ACCESS || w->opaque;
    for (size_t i = 0; i + 1 < w->n && !hit; i += 2)
        hit = sh_pool_hole_in(pool, w->ends[i], w->ends[i + 1]);
    return hit;
}

int sh_work_refused_slow(const struct sh_work *w)
{
    if (w->kind == SH_WORK_CAPTURE)
        return 0;
    int hit = 0, n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int d = 0; d < n && !hit; d++) /* sh_pool_heal: 0 while there is no hole */
        hit = sh_pool_heal(sh_rt.devs[d]->pool) != 0 && reaches_hole(w, sh_rt.devs[d]->pool);
    if (!hit)
        return 0;
    sh_monitor_event(SH_TM_EV_ERROR, (uint64_t)-SH_ELOST, 0);
    if (!atomic_exchange(&told_refused, 1))
        sh_log(SH_LOG_ERROR, "device work refused (out of memory) while memory the driver "
                             "failed to map again cannot be mapped: its bytes are kept");
    return 1;
}

/* The gates of the devices w's ranges may reach; with none named, the
 * main device's, as every entry of the table has always waited out its
 * windows (test_intercept). */
static uint32_t access_gates(const struct sh_work *w)
{
    uint32_t devs = sh_gates_ranges(w->ends, w->n);
    return devs ? devs : 1;
}

int sh_work_issue(struct sh_work *w)
{
    if ((w->refused = sh_work_refused(w)))
        return 1;
    switch (w->kind) {
    case SH_WORK_LAUNCH:
        /* With nothing off the device CUPTI's callbacks may see it. Else
         * the wrapper makes it resident itself (the callback then stays
         * out), so that a remap failing for good under it, which leaves a
         * hole, refuses it here instead of letting it fault. */
        if (!w->opaque && sh_quiet() && (w->pass = sh_cupti_pass_begin()))
            return 0; /* (CUPTI is not told what the wrapper knows: "opaque") */
        sh_cupti_poll();
        sh_launch_begin(w->key, w->key_kind, w->params, w->stream);
        if (w->opaque)
            sh_launch_set_opaque();
        if (sh_work_refused(w)) {
            sh_launch_end();
            return (w->refused = 1);
        }
        return 0;
    case SH_WORK_GRAPH: /* the same, for the regions a graph's nodes use */
        if (sh_quiet() && (w->pass = sh_cupti_pass_begin()))
            return 0;
        sh_cupti_poll();
        sh_graph_launch_begin((CUgraphExec)(uintptr_t)w->key, w->stream);
        if (sh_work_refused(w)) {
            sh_launch_end();
            return (w->refused = 1);
        }
        return 0;
    default: /* a capture's start or end, or work reaching the ranges it names */
        w->gates = sh_gates_enter(w->kind == SH_WORK_CAPTURE || w->opaque ? SH_GATES_ALL
                                                                          : access_gates(w));
        return 0;
    }
}

void sh_work_end(struct sh_work *w, int result)
{
    switch (w->refused ? -1 : (int)w->kind) {
    case -1:
        break;
    case SH_WORK_LAUNCH:
    case SH_WORK_GRAPH:
        if (w->pass)
            sh_cupti_pass_end();
        else
            sh_launch_end();
        break;
    case SH_WORK_CAPTURE: {
        int ended = sh_graph_capture(w->begin, result);
        sh_gates_leave();
        if (ended) /* outside the gates: a window may open */
            sh_graph_captures_ended();
        break;
    }
    default:
        /* Still inside the gates: no window between the issue and the mark. */
        sh_launch_mark_work(w->stream, w->any_stream, w->ends, w->n, w->opaque, w->gates);
        sh_gates_leave();
    }
    sh_work_depth--;
}

/* ---- verbs ---- */

void sh_work_range(struct sh_work *w, uintptr_t p, size_t n)
{
    if (!p || !n)
        return;
    if (w->n + 2 > SH_WORK_ENDS) {
        w->opaque = 1; /* more than one call can name: counts as everything */
        return;
    }
    w->ends[w->n++] = p;
    w->ends[w->n++] = p + n - 1;
}

static void mark_up(uintptr_t dst, const void *src, size_t n)
{
    sh_launch_mark_upload((const void *)dst, src, n);
}

/* 1 when device memory at p is known to hold region pointers: a region
 * marked so, or a table an upload filled. */
static int holds_pointers(uintptr_t p)
{
    uintptr_t base;
    int ptrs = 0;
    struct sh_dev *d = sh_dev_of(p);
    if (d)
        sh_pool_bases_ptrs(d->pool, &p, 1, &base, &ptrs);
    return ptrs || sh_launch_in_tables(&p, 1);
}

/* A device-to-device copy into a global: its bytes are not on the host to
 * scan, but where they come from may be known to hold pointers. */
static void dev_into_global(uintptr_t dst, uintptr_t src, size_t n)
{
    if (n && src && sh_globals_meet(dst, n) && holds_pointers(src))
        sh_launch_hide_pointers();
}

/* Device to device (or peer): both ranges, and a table into a global. */
void sh_work_dcopy(struct sh_work *w, uintptr_t dst, uintptr_t src, size_t n)
{
    sh_work_range(w, dst, n);
    sh_work_range(w, src, n);
    dev_into_global(dst, src, n);
}

void sh_work_up(struct sh_work *w, uintptr_t dst, const void *src, size_t n)
{
    sh_work_range(w, dst, n);
    mark_up(dst, src, n);
}

void sh_work_copy(struct sh_work *w, uintptr_t dst, uintptr_t src, size_t n)
{
    sh_work_range(w, dst, n);
    sh_work_range(w, src, n);
    if (n && src && sh_host_readable(src))
        mark_up(dst, (const void *)src, n);
    else
        dev_into_global(dst, src, n);
}

/* 1 when a copy of kind `kind` (cudaMemcpyKind) from src reads host memory. */
static int from_host(int kind, uintptr_t src)
{
    return kind == cudaMemcpyHostToDevice || (kind == cudaMemcpyDefault && sh_host_readable(src));
}

/* One side of a pitched copy: its first byte, its pitch, its rows per slice. */
struct span {
    uintptr_t at;
    size_t pitch, rows;
};

/* A pitched upload: depth slices of height rows of width bytes. */
static void up_block(struct span d, struct span s, size_t width, size_t height, size_t slices)
{
    sh_launch_mark_upload_slices(d.at, d.pitch, d.rows, (const void *)s.at, s.pitch, s.rows, width,
                                 height, slices);
}

/* A pitched device-to-device copy into a global, from src (its start
 * tells whether it holds pointers). */
static void dev_block_into_global(struct span d, uintptr_t src, size_t width, size_t height,
                                  size_t slices)
{
    if (width && height && slices)
        dev_into_global(d.at, src, d.pitch * (d.rows * (slices - 1) + height - 1) + width);
}

void sh_work_rcopy2d(struct sh_work *w, uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch,
                     size_t width, size_t height, int kind)
{
    sh_work_pitch(w, dst, dpitch, width, height);
    sh_work_pitch(w, src, spitch, width, height);
    if (width && height && src && from_host(kind, src))
        up_block((struct span){dst, dpitch, 0}, (struct span){src, spitch, 0}, width, height, 1);
    else
        dev_block_into_global((struct span){dst, dpitch, 0}, src, width, height, 1);
}

void sh_work_rcopy(struct sh_work *w, uintptr_t dst, uintptr_t src, size_t n, int kind)
{
    switch (kind) {
    case cudaMemcpyHostToHost:
        return;
    case cudaMemcpyHostToDevice:
        sh_work_up(w, dst, (const void *)src, n);
        return;
    case cudaMemcpyDeviceToHost:
        sh_work_range(w, src, n);
        return;
    case cudaMemcpyDeviceToDevice:
        sh_work_range(w, dst, n);
        sh_work_range(w, src, n);
        dev_into_global(dst, src, n);
        return;
    default:
        sh_work_copy(w, dst, src, n);
    }
}

void sh_work_pitch(struct sh_work *w, uintptr_t p, size_t pitch, size_t width, size_t height)
{
    if (width && height)
        sh_work_range(w, p, pitch * (height - 1) + width);
}

/* One side of a copy descriptor: origin (x bytes, y rows, z slices) in a
 * pitched block of rows rows per slice. */
static void side(struct sh_work *w, uintptr_t base, size_t x, size_t y, size_t z, size_t pitch,
                 size_t rows, size_t width, size_t height, size_t depth_)
{
    if (!base || !width || !height || !depth_)
        return;
    size_t at = z * pitch * rows + y * pitch + x;
    sh_work_pitch(w, base + at, pitch, width, rows * (depth_ - 1) + height);
}

#define DEVICE_SIDE(t) ((t) == CU_MEMORYTYPE_DEVICE || (t) == CU_MEMORYTYPE_UNIFIED)

/* The host address a descriptor's side reads, 0 when it is not host memory. */
static uintptr_t host_of(CUmemorytype t, const void *host, CUdeviceptr dev)
{
    if (t == CU_MEMORYTYPE_HOST)
        return (uintptr_t)host;
    return t == CU_MEMORYTYPE_UNIFIED && dev && sh_host_readable(dev) ? dev : 0;
}

void sh_work_copy2d(struct sh_work *w, const CUDA_MEMCPY2D *p)
{
    if (!p)
        return;
    if (DEVICE_SIDE(p->srcMemoryType))
        side(w, p->srcDevice, p->srcXInBytes, p->srcY, 0, p->srcPitch, 0, p->WidthInBytes,
             p->Height, 1);
    if (DEVICE_SIDE(p->dstMemoryType))
        side(w, p->dstDevice, p->dstXInBytes, p->dstY, 0, p->dstPitch, 0, p->WidthInBytes,
             p->Height, 1);
    uintptr_t h = host_of(p->srcMemoryType, p->srcHost, p->srcDevice);
    struct span d = {p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes, p->dstPitch, 0};
    if (h && DEVICE_SIDE(p->dstMemoryType))
        up_block(d, (struct span){h + p->srcY * p->srcPitch + p->srcXInBytes, p->srcPitch, 0},
                 p->WidthInBytes, p->Height, 1);
    else if (DEVICE_SIDE(p->srcMemoryType) && DEVICE_SIDE(p->dstMemoryType))
        dev_block_into_global(d, p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes,
                              p->WidthInBytes, p->Height, 1);
}

/* Where a 3D descriptor's side starts: origin (x bytes, y rows, z slices). */
#define AT3D(base, p, s)                                                                           \
    ((base) + ((p)->s##Z * (p)->s##Height + (p)->s##Y) * (p)->s##Pitch + (p)->s##XInBytes)

#define COPY3D(w, p)                                                                               \
    do {                                                                                           \
        if (DEVICE_SIDE((p)->srcMemoryType))                                                       \
            side(w, (p)->srcDevice, (p)->srcXInBytes, (p)->srcY, (p)->srcZ, (p)->srcPitch,         \
                 (p)->srcHeight, (p)->WidthInBytes, (p)->Height, (p)->Depth);                      \
        if (DEVICE_SIDE((p)->dstMemoryType))                                                       \
            side(w, (p)->dstDevice, (p)->dstXInBytes, (p)->dstY, (p)->dstZ, (p)->dstPitch,         \
                 (p)->dstHeight, (p)->WidthInBytes, (p)->Height, (p)->Depth);                      \
        uintptr_t h_ = host_of((p)->srcMemoryType, (p)->srcHost, (p)->srcDevice);                  \
        struct span d_ = {AT3D((p)->dstDevice, p, dst), (p)->dstPitch, (p)->dstHeight};            \
        if (h_ && DEVICE_SIDE((p)->dstMemoryType))                                                 \
            up_block(d_, (struct span){AT3D(h_, p, src), (p)->srcPitch, (p)->srcHeight},           \
                     (p)->WidthInBytes, (p)->Height, (p)->Depth);                                  \
        else if (DEVICE_SIDE((p)->srcMemoryType) && DEVICE_SIDE((p)->dstMemoryType))               \
            dev_block_into_global(d_, AT3D((p)->srcDevice, p, src), (p)->WidthInBytes,             \
                                  (p)->Height, (p)->Depth);                                        \
    } while (0)

void sh_work_copy3d(struct sh_work *w, const CUDA_MEMCPY3D *p)
{
    if (p)
        COPY3D(w, p);
}

void sh_work_copy3dpeer(struct sh_work *w, const CUDA_MEMCPY3D_PEER *p)
{
    if (p)
        COPY3D(w, p);
}

#define RCOPY3D(w, p)                                                                              \
    do {                                                                                           \
        size_t row_ = sh_copy3d_row_bytes((p)->extent.width, (p)->srcArray || (p)->dstArray);      \
        if (!(p)->srcArray)                                                                        \
            side(w, (uintptr_t)(p)->srcPtr.ptr, (p)->srcPos.x, (p)->srcPos.y, (p)->srcPos.z,       \
                 (p)->srcPtr.pitch, (p)->srcPtr.ysize, row_, (p)->extent.height,                   \
                 (p)->extent.depth);                                                               \
        if (!(p)->dstArray)                                                                        \
            side(w, (uintptr_t)(p)->dstPtr.ptr, (p)->dstPos.x, (p)->dstPos.y, (p)->dstPos.z,       \
                 (p)->dstPtr.pitch, (p)->dstPtr.ysize, row_, (p)->extent.height,                   \
                 (p)->extent.depth);                                                               \
    } while (0)

/* Where a runtime 3D copy's side starts. */
static uintptr_t rat3d(struct cudaPitchedPtr pp, struct cudaPos pos)
{
    return (uintptr_t)pp.ptr + (pos.z * pp.ysize + pos.y) * pp.pitch + pos.x;
}

void sh_work_rcopy3d(struct sh_work *w, const struct cudaMemcpy3DParms *p)
{
    if (!p)
        return;
    RCOPY3D(w, p);
    uintptr_t src = (uintptr_t)p->srcPtr.ptr;
    struct span d = {rat3d(p->dstPtr, p->dstPos), p->dstPtr.pitch, p->dstPtr.ysize};
    if (p->srcArray || p->dstArray || !src)
        return;
    if (from_host(p->kind, src))
        up_block(d, (struct span){rat3d(p->srcPtr, p->srcPos), p->srcPtr.pitch, p->srcPtr.ysize},
                 p->extent.width, p->extent.height, p->extent.depth);
    else
        dev_block_into_global(d, rat3d(p->srcPtr, p->srcPos), p->extent.width, p->extent.height,
                              p->extent.depth);
}

void sh_work_rcopy3dpeer(struct sh_work *w, const struct cudaMemcpy3DPeerParms *p)
{
    if (p)
        RCOPY3D(w, p);
}

void sh_work_batch(struct sh_work *w, const void *dsts, const void *srcs, const size_t *sizes,
                   size_t count)
{
    const uintptr_t *d = dsts, *s = srcs;
    for (size_t i = 0; d && s && sizes && i < count && !w->opaque; i++) {
        sh_work_range(w, d[i], sizes[i]);
        sh_work_range(w, s[i], sizes[i]);
        if (sizes[i] && s[i] && sh_host_readable(s[i]))
            mark_up(d[i], (const void *)s[i], sizes[i]);
        else
            dev_into_global(d[i], s[i], sizes[i]);
    }
}

void sh_work_memops(struct sh_work *w, const CUstreamBatchMemOpParams *ops, unsigned count)
{
    for (unsigned i = 0; ops && i < count; i++) {
        const CUstreamBatchMemOpParams *o = &ops[i];
        switch (o->operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            sh_work_range(w, o->waitValue.address,
                          o->operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8);
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            sh_work_range(w, o->writeValue.address,
                          o->operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8);
            break;
        case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        case CU_STREAM_MEM_OP_BARRIER:
            break;
        default:
            w->opaque = 1; /* an operation this build does not know */
        }
    }
}

void sh_work_symbol_up(struct sh_work *w, const void *src, size_t n, int kind)
{
    uintptr_t s = (uintptr_t)src;
    if (kind == cudaMemcpyHostToDevice || (kind == cudaMemcpyDefault && sh_host_readable(s))) {
        if (n && src && sh_launch_find_pointers(src, n, 0))
            sh_launch_hide_pointers();
        return;
    }
    sh_work_range(w, s, n);
    if (n && s && holds_pointers(s)) /* from the device: where they come from */
        sh_launch_hide_pointers();
}

void sh_work_launch(struct sh_work *w, const void *key, int kind, void **params)
{
    w->kind = SH_WORK_LAUNCH;
    w->key = key;
    w->key_kind = kind;
    w->params = params;
}

void sh_work_extra_params(struct sh_work *w, void **params, void **extra)
{
    if (!params && extra)
        w->opaque = 1; /* a packed parameter buffer: the scan cannot read it */
}

void sh_work_graph(struct sh_work *w, CUgraphExec exec)
{
    w->kind = SH_WORK_GRAPH;
    w->key = (const void *)exec;
}

void sh_work_capture(struct sh_work *w, int begin)
{
    w->kind = SH_WORK_CAPTURE;
    w->begin = begin;
}

void sh_work_stream(struct sh_work *w, CUstream s)
{
    w->stream = w->per_thread ? sh_stream_ptsz(s) : s;
}

void sh_work_any_stream(struct sh_work *w)
{
    w->any_stream = 1;
}

void sh_work_opaque(struct sh_work *w)
{
    w->opaque = 1;
}
