/* cudart.c — the intercepted runtime allocation calls and the PyTorch
 * pluggable-allocator entry points. Thin: they route to the pool and fall
 * back to the real function for everything the pool does not own.
 *
 * Shared state: none of its own (see runtime.c).
 */
#include "interpose/interpose.h"

#include "sh_err.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"
#include "stagehand.h"

#define EXPORT __attribute__((visibility("default")))

static cudaError_t passthrough(void)
{
    atomic_fetch_add(&sh_rt.passthrough, 1);
    return cudaSuccess;
}

/* d's engine makes room for size bytes (whole granules). */
static int make_room(struct sh_dev *d, size_t size)
{
    sh_engine_lock(&d->engine);
    int rc = sh_engine_make_room(&d->engine, (size + d->gran - 1) / d->gran * d->gran, NULL, 0);
    sh_engine_unlock(&d->engine);
    return rc;
}

static cudaError_t managed_alloc(struct sh_dev *d, void **ptr, size_t size, int path,
                                 cudaStream_t stream, const char *what)
{
    uintptr_t va = 0;
    size_t need = (size + d->gran - 1) / d->gran * d->gran;
    struct sh_region_info info;
    sh_engine_lock(&d->engine);
    int rc = sh_engine_make_room(&d->engine, need, NULL, 0);
    if (rc == SH_OK)
        rc = sh_pool_alloc(d->pool, size, path, sh_stream_key((CUstream)stream), &va);
    /* the policy knows the region before another caller looks for victims */
    if (rc == SH_OK && sh_pool_lookup(d->pool, va, &info) == SH_OK && info.va == va &&
        info.path != SH_PATH_SLAB)
        sh_sched_alloc(d, va, size, sh_stream_key((CUstream)stream)); /* a region, not a block */
    sh_engine_unlock(&d->engine);
    if (rc == SH_ENOMEM || rc == SH_ERANGE) {
        *ptr = NULL;
        return rc == SH_ERANGE ? sh_oom_too_big(d, size, what) : sh_oom(d, size, what);
    }
    if (rc != SH_OK)
        return cudaErrorUnknown; /* the caller falls back to the real call */
    *ptr = (void *)va;
    return cudaSuccess;
}

/* An allocation the pool does not manage. If the card is full, the pool
 * gives back room for it (that is what the auto reserve could not foresee)
 * and the call is made again, its first error cleared. */
static cudaError_t passthrough_malloc(void **ptr, size_t size)
{
    const struct sh_real *real = sh_real();
    passthrough();
    cudaError_t e = real->cudaMalloc(ptr, size);
    struct sh_dev *d = e == cudaErrorMemoryAllocation && ptr ? sh_managed_here() : NULL;
    if (!d)
        return e; /* room on a managed device helps no other one */
    if (make_room(d, size) != SH_OK)
        return e;
    if (real->cudaGetLastError)
        real->cudaGetLastError();
    return real->cudaMalloc(ptr, size);
}

EXPORT cudaError_t cudaMalloc(void **ptr, size_t size)
{
    const struct sh_real *real = sh_real();
    struct sh_dev *d = NULL;
    if (!ptr || size < sh_rt.cfg.regions.min_region.bytes || !(d = sh_managed_here()))
        return passthrough_malloc(ptr, size);
    cudaError_t e = managed_alloc(d, ptr, size, SH_PATH_MALLOC, NULL, "cudaMalloc");
    return e == cudaErrorUnknown ? (passthrough(), real->cudaMalloc(ptr, size)) : e;
}

/* The program freed what it does not hold: its error, said as such. */
static cudaError_t bad_free(const char *what, void *ptr)
{
    sh_log(SH_LOG_ERROR, "%s(%p): not a live allocation (freed twice?)", what, ptr);
    return cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaFree(void *ptr)
{
    const struct sh_real *real = sh_real();
    struct sh_region_info info;
    struct sh_dev *d = ptr && sh_managed() ? sh_dev_of((uintptr_t)ptr) : NULL;
    /* A small block lies anywhere in its slab; a region is freed by its start. */
    if (!d || sh_pool_lookup(d->pool, (uintptr_t)ptr, &info) != SH_OK ||
        (info.va != (uintptr_t)ptr && info.path != SH_PATH_SLAB) || info.path == SH_PATH_VMM) {
        cudaError_t e = real->cudaFree(ptr);
        if (e == cudaSuccess)
            sh_hostmem_del(ptr); /* managed memory (hostcalls.c) */
        return e;
    }
    if (info.state == SH_RS_FREED)
        return bad_free("cudaFree", ptr);
    /* cudaFree synchronises the device; so do we, so the memory is idle. */
    CUresult r = sh_driver_sync_dev(&d->drvdev);
    if (r != CUDA_SUCCESS)
        return (cudaError_t)r;
    if (info.path != SH_PATH_SLAB)
        sh_sched_free(d, (uintptr_t)ptr);
    return sh_pool_free(d->pool, (uintptr_t)ptr, UINT64_MAX, 0) == SH_OK
               ? cudaSuccess
               : bad_free("cudaFree", ptr);
}

/* Inside a stream capture an allocation is a graph memory node: its address
 * belongs to the graph until the graph is destroyed, which only CUDA's own
 * allocator can give. So the real call makes it (or refuses it). */
static int in_capture(cudaStream_t stream)
{
    return sh_stream_capturing((CUstream)stream);
}

/* cudaMallocAsync allocates on the stream's device, not the current one. */
static struct sh_dev *managed_stream(cudaStream_t stream)
{
    return sh_managed() ? sh_dev_open(sh_stream_device((CUstream)stream)) : NULL;
}

EXPORT cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    const struct sh_real *real = sh_real();
    struct sh_dev *d = NULL;
    if (!ptr || size == 0 || !(d = managed_stream(stream)) || in_capture(stream)) {
        passthrough();
        return real->cudaMallocAsync(ptr, size, stream);
    }
    cudaError_t e = managed_alloc(d, ptr, size, SH_PATH_ASYNC, stream, "cudaMallocAsync");
    return e == cudaErrorUnknown ? (passthrough(), real->cudaMallocAsync(ptr, size, stream)) : e;
}

/* Stream-ordered free: the memory is reused by another stream only after
 * the fence recorded here has passed. */
static int managed_free_async(void *ptr, cudaStream_t stream, const char *what)
{
    struct sh_region_info info;
    struct sh_dev *d = sh_dev_of((uintptr_t)ptr);
    if (!d || sh_pool_lookup(d->pool, (uintptr_t)ptr, &info) != SH_OK || info.path == SH_PATH_VMM)
        return SH_ENOTFOUND; /* the program's own mapping: the driver answers */
    if (in_capture(stream)) {
        /* A free node frees only a graph allocation, and this memory may
         * be the graph's input on every replay: it stays allocated. */
        sh_log(SH_LOG_ERROR,
               "%s(%p): freed inside a stream capture (or on the legacy stream while another "
               "stream captures), but it was allocated outside the graph; CUDA allows only "
               "graph allocations here, so it stays allocated",
               what, ptr);
        return SH_EINVAL;
    }
    if (info.state == SH_RS_FREED) {
        bad_free(what, ptr);
        return SH_EINVAL;
    }
    if (info.va == (uintptr_t)ptr && info.path != SH_PATH_SLAB)
        sh_sched_free(d, (uintptr_t)ptr);
    uint64_t fence = sh_driver_fence_record(&d->drvdev, (CUstream)stream);
    if (!fence)
        sh_driver_sync_dev(&d->drvdev); /* no event: fall back to a full wait */
    int rc = sh_pool_free(d->pool, (uintptr_t)ptr, sh_stream_key((CUstream)stream), fence);
    if (rc != SH_OK)
        bad_free(what, ptr); /* a small block freed twice */
    if (rc != SH_OK && fence) {
        struct sh_fence_ops f;
        sh_driver_fence_ops(&d->drvdev, &f);
        f.drop(f.ctx, fence);
    }
    return rc;
}

EXPORT cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    if (!ptr || !sh_managed())
        return sh_real()->cudaFreeAsync(ptr, stream);
    int rc = managed_free_async(ptr, stream, "cudaFreeAsync");
    if (rc == SH_ENOTFOUND)
        return sh_real()->cudaFreeAsync(ptr, stream);
    return rc == SH_OK ? cudaSuccess : cudaErrorInvalidValue;
}

/* The budget view: free is what is left of the budget after everything the
 * process holds on the device, counting memory we keep cached (and give
 * back on demand) as free; total is the budget, or more once the program
 * holds more than it (evicted regions included), so that CUDA's invariants
 * hold: free <= total, and free + what the process holds <= total (PyTorch
 * asserts the second with cuDNN's benchmark mode on). */
EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    cudaError_t e = sh_real()->cudaMemGetInfo(free_bytes, total);
    struct sh_dev *d = e == cudaSuccess && free_bytes && total ? sh_managed_here() : NULL;
    if (!d)
        return e;
    struct sh_pool_stats st;
    sh_pool_stats(d->pool, &st);
    size_t used = *total - *free_bytes, budget = d->engine.cfg.budget;
    size_t cached = st.device_bytes > st.live_bytes ? st.device_bytes - st.live_bytes : 0;
    size_t outside = used > st.device_bytes ? used - st.device_bytes : 0;
    size_t held = st.live_bytes + outside;
    used = used > cached ? used - cached : 0;
    *free_bytes = budget > used ? budget - used : 0;
    *total = held + *free_bytes > budget ? held + *free_bytes : budget;
    return cudaSuccess;
}

/* Runs fn for device `device`, made current meanwhile (the caller's
 * current device is restored); what says who asks, for the message when
 * that device cannot be made current. */
static cudaError_t on_device(int device, const char *what, cudaError_t (*fn)(void *), void *arg)
{
    const struct sh_real *real = sh_real();
    int was = -1;
    if (!real->cudaGetDevice || !real->cudaSetDevice || real->cudaGetDevice(&was) != cudaSuccess)
        return fn(arg);
    if (was != device) {
        /* The failure is said here and returned: the program's next call
         * must not find it as its own (unless one of its own was pending). */
        int clean = real->cudaPeekAtLastError && real->cudaPeekAtLastError() == cudaSuccess;
        cudaError_t e = real->cudaSetDevice(device);
        if (e != cudaSuccess) {
            sh_log(SH_LOG_ERROR,
                   "%s: device %d cannot be made current (CUDA error %d): nothing "
                   "allocated or freed",
                   what, device, (int)e);
            if (clean && real->cudaGetLastError)
                real->cudaGetLastError();
            return e;
        }
    }
    cudaError_t e = fn(arg);
    if (was != device)
        real->cudaSetDevice(was);
    return e;
}

struct async_call {
    void *ptr;
    size_t size;
    cudaStream_t stream;
};

static cudaError_t real_malloc_async(void *arg)
{
    struct async_call *c = arg;
    const struct sh_real *real = sh_real();
    passthrough();
    return real->cudaMallocAsync ? real->cudaMallocAsync(&c->ptr, c->size, c->stream)
                                 : cudaErrorInitializationError;
}

static cudaError_t real_free_async(void *arg)
{
    struct async_call *c = arg;
    const struct sh_real *real = sh_real();
    return real->cudaFreeAsync ? real->cudaFreeAsync(c->ptr, c->stream)
                               : cudaErrorInitializationError;
}

static cudaError_t start(void *arg)
{
    (void)arg;
    return sh_managed() ? cudaSuccess : cudaErrorInitializationError;
}

/* PyTorch's pluggable allocator names the device: memory for the managed
 * one is managed, whichever device is current; memory for another comes
 * from CUDA's allocator on that device. The first call picks the device
 * it names to manage, unless [general] device did. */
EXPORT void *stagehand_malloc(ssize_t size, int device, void *stream)
{
    if (size <= 0)
        return NULL;
    if (!sh_active() && sh_rt.cfg.general.device < 0) {
        cudaError_t e = on_device(device, "stagehand_malloc", start, NULL);
        if (e != cudaSuccess && e != cudaErrorInitializationError)
            return NULL; /* said why */
    }
    struct async_call c = {NULL, (size_t)size, stream};
    struct sh_dev *d = sh_managed() ? sh_dev_open(device) : NULL;
    if (d && !in_capture(stream)) {
        cudaError_t e =
            managed_alloc(d, &c.ptr, (size_t)size, SH_PATH_PLUGGABLE, stream, "stagehand_malloc");
        if (e != cudaErrorUnknown)
            return e == cudaSuccess ? c.ptr : NULL;
    }
    return on_device(device, "stagehand_malloc", real_malloc_async, &c) == cudaSuccess ? c.ptr
                                                                                       : NULL;
}

/* The entry points of a program built with --default-stream per-thread,
 * where stream 0 is the calling thread's own stream. */
EXPORT cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream);
EXPORT cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream);

cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream)
{
    return cudaMallocAsync(ptr, size, (cudaStream_t)sh_stream_ptsz((CUstream)stream));
}

cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream)
{
    return cudaFreeAsync(ptr, (cudaStream_t)sh_stream_ptsz((CUstream)stream));
}

EXPORT void stagehand_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size;
    if (!ptr)
        return;
    struct async_call c = {ptr, 0, stream};
    if (!sh_managed() || managed_free_async(ptr, stream, "stagehand_free") == SH_ENOTFOUND)
        on_device(device, "stagehand_free", real_free_async, &c);
}
