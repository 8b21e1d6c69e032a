/* fingerprint.c — the clean-region fingerprint on the device: the
 * library's kernel (clean/ptx.c) loaded with cuModuleLoadData through the
 * driver table and launched on a copy stream, one launch per range, each
 * XORing its blocks' digests into its own 16-byte slot, read back at once
 * and finished on the host (clean.h).
 *
 * The pool calls it inside remap windows, where nothing else runs (what it
 * trusts), and at an early eviction's start (a guess). It has a stream of
 * its own, so a call never waits behind the copies in flight. An early
 * eviction's start queues its fingerprints instead (sh_fingerprint_queue),
 * on the copy stream ahead of the region's copies, with their results read
 * back into pinned memory: the launching thread does not wait for the
 * kernel, the copies read the bytes after it did, and the window, which
 * waits for the copies, takes the results (sh_fingerprint_take). The module,
 * the key (in device memory, read by every thread block), the slots and
 * the stream are set up at the first call, so a program that never evicts
 * pays nothing; if that fails, every later call fails too and the pool
 * copies as it would without clean skip.
 *
 * The same module holds the pointer prefilter (sh_fingerprint_ptrs): one
 * launch per range over the bytes an eviction window is about to move,
 * each setting its 4-byte slot when it finds a word a pointer into the
 * pool could start with; read back at once, like the fingerprints.
 *
 * The library's own launch must not be taken for the program's: CUPTI
 * reports it like any other, and the callback leaves it alone while
 * sh_fingerprint_own() says so.
 *
 * Each managed device has its own (struct sh_fp, the pool's fp_ctx): the
 * module is loaded, and the key and slots live, in that device's context,
 * and the queued kernels run on its copy streams.
 *
 * Locking: a device's fp->mu serialises the set-up and every batch (the
 * slots are shared), and the queued slots' allocation; never held while
 * waiting for a queued ticket. own is per thread.
 */
#include "interpose/interpose.h"

#include "clean/clean.h"
#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS  256  /* ranges per round trip */
#define QSLOTS 1024 /* ranges queued, across the early evictions in flight */
/* The key and the slots in one allocation of whole pages, so that what the
 * driver counts is what the library reports (sh_fingerprint_device_bytes). */
#define DEVICE_BYTES SH_CLEAN_DEVICE_BYTES
_Static_assert(sizeof(struct sh_clean_key) + (SLOTS + QSLOTS) * 16 <= DEVICE_BYTES,
               "key and slots fit");

enum { UNTRIED = 0, READY = 1, BROKEN = -1 };

struct sh_fp {
    struct sh_driver_dev *dd; /* the device: its context, its copy streams */
    pthread_mutex_t mu;
    int state;
    CUfunction fn, ptrs; /* ptrs: NULL if it did not load (the CPU scans) */
    CUstream stream;
    CUdeviceptr key, out; /* the key, then SLOTS result slots, then QSLOTS */
    struct sh_clean_key host_key;
    uint64_t x[SLOTS][2];
    /* Queued: their results' pinned mirror (NULL until the first queue;
     * qbroken once it could not be had), and per first slot of a ticket
     * its ranges' count and the event after its read back; per slot its
     * range's length and whether it is taken. */
    uint64_t (*qx)[2];
    int qbroken;
    struct {
        CUevent ev;
        size_t n;
    } qt[QSLOTS];
    size_t qlen[QSLOTS];
    unsigned char qused[QSLOTS];
    size_t device_bytes;
    uint64_t key_bytes; /* the key's upload, not yet reported */
    __typeof__(cuModuleLoadData) *load;
    __typeof__(cuModuleGetFunction) *get;
    __typeof__(cuMemAlloc) *alloc;
    __typeof__(cuMemFree) *free;
    __typeof__(cuMemcpyHtoD) *htod;
    __typeof__(cuMemsetD8Async) *memset;
    __typeof__(cuMemcpyDtoHAsync) *dtoh;
    __typeof__(cuMemHostAlloc) *host_alloc;
};

static _Thread_local int own;

int sh_fingerprint_own(void)
{
    return own;
}

size_t sh_fingerprint_device_bytes(const struct sh_fp *fp)
{
    return fp ? __atomic_load_n(&fp->device_bytes, __ATOMIC_RELAXED) : 0;
}

struct sh_fp *sh_fingerprint_new(struct sh_driver_dev *dd)
{
    struct sh_fp *fp = calloc(1, sizeof *fp);
    if (!fp)
        return NULL;
    fp->dd = dd;
    pthread_mutex_init(&fp->mu, NULL);
    return fp;
}

static int lookup(struct sh_fp *fp, const struct sh_driver *d)
{
    fp->load = (__typeof__(fp->load))sh_driver_optional(d, "cuModuleLoadData", 12000);
    fp->get = (__typeof__(fp->get))sh_driver_optional(d, "cuModuleGetFunction", 12000);
    fp->alloc = (__typeof__(fp->alloc))sh_driver_optional(d, "cuMemAlloc", 12000);
    fp->free = (__typeof__(fp->free))sh_driver_optional(d, "cuMemFree", 12000);
    fp->htod = (__typeof__(fp->htod))sh_driver_optional(d, "cuMemcpyHtoD", 12000);
    fp->memset = (__typeof__(fp->memset))sh_driver_optional(d, "cuMemsetD8Async", 12000);
    fp->dtoh = (__typeof__(fp->dtoh))sh_driver_optional(d, "cuMemcpyDtoHAsync", 12000);
    fp->host_alloc = (__typeof__(fp->host_alloc))sh_driver_optional(d, "cuMemHostAlloc", 12000);
    return fp->load && fp->get && fp->alloc && fp->free && fp->htod && fp->memset && fp->dtoh;
}

/* The module, the key and the slots; fp->mu held, the device's context
 * current. */
static int set_up(struct sh_fp *fp, const struct sh_driver *d)
{
    CUmodule mod;
    int least = 0, greatest = 0;
    const char *why = NULL;
    if (!lookup(fp, d))
        why = "the driver lacks an entry point it needs";
    else if (sh_clean_key_random(&fp->host_key) != 0)
        why = "no random key could be drawn";
    else if (fp->load(&mod, sh_clean_ptx) != CUDA_SUCCESS ||
             fp->get(&fp->fn, mod, SH_CLEAN_KERNEL) != CUDA_SUCCESS)
        why = "its kernel did not load";
    else if (d->cuCtxGetStreamPriorityRange(&least, &greatest) != CUDA_SUCCESS ||
             d->cuStreamCreateWithPriority(&fp->stream, CU_STREAM_NON_BLOCKING, greatest) !=
                 CUDA_SUCCESS)
        why = "no stream for it";
    else if (fp->alloc(&fp->key, DEVICE_BYTES) != CUDA_SUCCESS)
        why = "no device memory for its key";
    else if (fp->htod(fp->key, &fp->host_key, sizeof fp->host_key) != CUDA_SUCCESS) {
        fp->free(fp->key); /* nothing may stay that the library does not count */
        why = "its key could not be copied";
    }
    if (why) {
        sh_log(SH_LOG_WARN, "clean regions cannot be told (%s): every eviction copies", why);
        return BROKEN;
    }
    if (fp->get(&fp->ptrs, mod, SH_PTRS_KERNEL) != CUDA_SUCCESS) {
        fp->ptrs = NULL;
        sh_log(SH_LOG_WARN, "the pointer prefilter kernel did not load: evicted bytes are "
                            "scanned for pointers on the CPU");
    }
    fp->out = fp->key + sizeof fp->host_key;
    __atomic_store_n(&fp->device_bytes, DEVICE_BYTES, __ATOMIC_RELAXED);
    fp->key_bytes = sizeof fp->host_key; /* crossed the bus once */
    return READY;
}

/* The library's own launch of f over `blocks` units of work (at most
 * SH_CLEAN_GRID_MAX thread blocks), which the launch tracking leaves alone. */
static CUresult own_launch(CUfunction f, uint64_t blocks, CUstream s, void **args)
{
    unsigned grid = blocks < SH_CLEAN_GRID_MAX ? (unsigned)blocks : SH_CLEAN_GRID_MAX;
    own = 1;
    CUresult r = sh_rt.drv.cuLaunchKernel(f, grid ? grid : 1, 1, 1, SH_CLEAN_THREADS, 1, 1, 0, s,
                                          args, NULL);
    own = 0;
    return r;
}

/* After the launches r says were issued: the slots' first `bytes` read
 * back into fp->x, and waited for. */
static CUresult read_back(struct sh_fp *fp, CUstream s, CUresult r, size_t bytes, uint64_t bus[2])
{
    if (r == CUDA_SUCCESS && (r = fp->dtoh(fp->x, fp->out, bytes, s)) == CUDA_SUCCESS)
        bus[SH_D2H] += bytes;
    return r == CUDA_SUCCESS ? sh_rt.drv.cuStreamSynchronize(s) : r;
}

static CUresult launch(struct sh_fp *fp, CUstream s, uintptr_t addr, size_t len, unsigned slot)
{
    CUdeviceptr src = (CUdeviceptr)addr, key = fp->key, out = fp->out + 16 * slot;
    uint64_t n = len;
    void *args[] = {&src, &n, &key, &out};
    return own_launch(fp->fn, (n + SH_CLEAN_BLOCK - 1) / SH_CLEAN_BLOCK, s, args);
}

/* Up to SLOTS ranges: zeroed slots, one launch each, one read back. */
static int round_trip(struct sh_fp *fp, const uintptr_t *addr, const size_t *len, size_t n,
                      struct sh_clean_fp *out, uint64_t bus[2])
{
    CUstream s = fp->stream;
    CUresult r = fp->memset(fp->out, 0, 16 * n, s);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
        if (len[i])
            r = launch(fp, s, addr[i], len[i], (unsigned)i);
    if ((r = read_back(fp, s, r, 16 * n, bus)) != CUDA_SUCCESS) {
        sh_log(SH_LOG_WARN, "fingerprint kernel failed (%s): those regions are copied",
               sh_driver_error(&sh_rt.drv, r));
        return SH_EDRIVER;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = sh_clean_finish(&fp->host_key, len[i], fp->x[i]);
    return 0;
}

/* The managed context current and fp->mu held, the module set up: 0 if it
 * is ready (and bus counts the key's upload, once), else an error; leave()
 * after either. */
static int enter(struct sh_fp *fp, const struct sh_driver *d, uint64_t bus[2])
{
    if (d->cuCtxPushCurrent(fp->dd->ctx) != CUDA_SUCCESS)
        return SH_EDRIVER;
    pthread_mutex_lock(&fp->mu);
    if (fp->state == UNTRIED)
        fp->state = set_up(fp, d);
    if (fp->state != READY)
        return SH_EBUSY;
    bus[SH_H2D] += fp->key_bytes;
    fp->key_bytes = 0;
    return 0;
}

static void leave(struct sh_fp *fp, const struct sh_driver *d, int entered)
{
    if (entered == SH_EDRIVER)
        return; /* no context was pushed */
    pthread_mutex_unlock(&fp->mu);
    CUcontext popped;
    d->cuCtxPopCurrent(&popped);
}

int sh_fingerprint(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                   struct sh_clean_fp *out, uint64_t bus[2])
{
    struct sh_fp *fp = ctx;
    const struct sh_driver *d = &sh_rt.drv;
    int entered = enter(fp, d, bus), rc = entered ? SH_EDRIVER : 0;
    for (size_t done = 0; done < n && rc == 0; done += SLOTS)
        rc = round_trip(fp, addr + done, len + done, n - done < SLOTS ? n - done : SLOTS,
                        out + done, bus);
    leave(fp, d, entered);
    return rc;
}

/* ---- the pointer prefilter ---- */

static CUresult launch_ptrs(struct sh_fp *fp, CUstream s, uintptr_t addr, size_t len, uint32_t top,
                            uint32_t span, unsigned slot)
{
    CUdeviceptr words = (CUdeviceptr)addr, found = fp->out + 4 * slot;
    uint64_t n = len / 4;
    void *args[] = {&words, &n, &top, &span, &found};
    return own_launch(fp->ptrs, (n + SH_CLEAN_THREADS - 1) / SH_CLEAN_THREADS, s, args);
}

/* Up to 4 * SLOTS ranges: a 4-byte slot each, one read back. */
static int ptrs_round(struct sh_fp *fp, const uintptr_t *addr, const size_t *len, size_t n,
                      uint32_t top, uint32_t span, unsigned char *found, uint64_t bus[2])
{
    CUstream s = fp->stream;
    CUresult r = fp->memset(fp->out, 0, 4 * n, s);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
        if (len[i] >= 8)
            r = launch_ptrs(fp, s, addr[i], len[i], top, span, (unsigned)i);
    if ((r = read_back(fp, s, r, 4 * n, bus)) != CUDA_SUCCESS) {
        sh_log(SH_LOG_WARN,
               "pointer prefilter kernel failed (%s): those bytes are scanned on "
               "the CPU",
               sh_driver_error(&sh_rt.drv, r));
        return SH_EDRIVER;
    }
    const uint32_t *slot = (const uint32_t *)fp->x;
    for (size_t i = 0; i < n; i++)
        found[i] = slot[i] != 0;
    return 0;
}

int sh_fingerprint_ptrs(void *ctx, const uintptr_t *addr, const size_t *len, size_t n, uintptr_t lo,
                        uintptr_t hi, unsigned char *found, uint64_t bus[2])
{
    struct sh_fp *fp = ctx;
    if (hi <= lo)
        return SH_EINVAL;
    /* A pointer into [lo, hi) has its high half in [top, top + span]. */
    uint32_t top = (uint32_t)((uint64_t)lo >> 32);
    uint32_t span = (uint32_t)((uint64_t)(hi - 1) >> 32) - top;
    const struct sh_driver *d = &sh_rt.drv;
    int entered = enter(fp, d, bus), rc = entered || !fp->ptrs ? SH_EDRIVER : 0;
    const size_t per = 4 * SLOTS; /* 4-byte results in the 16-byte slots' room */
    for (size_t done = 0; done < n && rc == 0; done += per)
        rc = ptrs_round(fp, addr + done, len + done, n - done < per ? n - done : per, top, span,
                        found + done, bus);
    leave(fp, d, entered);
    return rc;
}

/* ---- queued ahead of copies ---- */

/* The pinned mirror for queued results; fp->mu held. */
static int queue_ready(struct sh_fp *fp)
{
    if (!fp->qx && !fp->qbroken) {
        void *p = NULL;
        fp->qbroken =
            !fp->host_alloc || fp->host_alloc(&p, QSLOTS * sizeof *fp->qx, 0) != CUDA_SUCCESS || !p;
        fp->qx = fp->qbroken ? NULL : p; /* kept for the process: 16 KB */
    }
    return fp->qx != NULL;
}

/* The first of n free slots in a row, taken; -1 if there are none. fp->mu held. */
static long take_slots(struct sh_fp *fp, size_t n)
{
    for (size_t at = 0, run = 0; at < QSLOTS; at++) {
        run = fp->qused[at] ? 0 : run + 1;
        if (run == n) {
            memset(fp->qused + at + 1 - n, 1, n);
            return (long)(at + 1 - n);
        }
    }
    return -1;
}

/* Zeroed slots, one launch per range and the read back, on stream s; the
 * event after them in fp->qt[first]. fp->mu held. */
static CUresult queue_on(struct sh_fp *fp, CUstream s, size_t first, const uintptr_t *addr,
                         const size_t *len, size_t n)
{
    CUdeviceptr out = fp->out + 16 * (SLOTS + first);
    CUresult r = fp->memset(out, 0, 16 * n, s);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        fp->qlen[first + i] = len[i];
        if (len[i])
            r = launch(fp, s, addr[i], len[i], (unsigned)(SLOTS + first + i));
    }
    if (r == CUDA_SUCCESS)
        r = fp->dtoh(fp->qx + first, out, 16 * n, s);
    fp->qt[first].n = n;
    fp->qt[first].ev = NULL;
    if (r == CUDA_SUCCESS)
        fp->qt[first].ev = (CUevent)(uintptr_t)sh_driver_fence_record(fp->dd, s);
    if (r == CUDA_SUCCESS && !fp->qt[first].ev)
        r = sh_rt.drv.cuStreamSynchronize(s); /* no event: done once this returns */
    return r;
}

int sh_fingerprint_queue(void *ctx, const uintptr_t *addr, const size_t *len, size_t n, int dir,
                         uint64_t *ticket, uint64_t bus[2])
{
    struct sh_fp *fp = ctx;
    const struct sh_driver *d = &sh_rt.drv;
    CUstream s = sh_driver_copy_stream(fp->dd, dir);
    if (!s || n == 0 || n > QSLOTS)
        return SH_EINVAL;
    if (d->cuCtxPushCurrent(fp->dd->ctx) != CUDA_SUCCESS)
        return SH_EDRIVER;
    pthread_mutex_lock(&fp->mu);
    if (fp->state == UNTRIED)
        fp->state = set_up(fp, d);
    long first = fp->state == READY && queue_ready(fp) ? take_slots(fp, n) : -1;
    int rc = first < 0 ? SH_ENOMEM : 0;
    if (rc == 0) {
        bus[SH_H2D] += fp->key_bytes;
        fp->key_bytes = 0;
        CUresult r = queue_on(fp, s, (size_t)first, addr, len, n);
        if (r != CUDA_SUCCESS) {
            /* Kernels queued before the failure may still write the slots. */
            sh_rt.drv.cuStreamSynchronize(s);
            memset(fp->qused + first, 0, n);
            sh_log(SH_LOG_DEBUG, "queued fingerprint failed (%s): taken at once instead",
                   sh_driver_error(d, r));
            rc = SH_EDRIVER;
        } else {
            bus[SH_D2H] += 16 * n;
            *ticket = (uint64_t)first + 1;
        }
    }
    pthread_mutex_unlock(&fp->mu);
    CUcontext popped;
    d->cuCtxPopCurrent(&popped);
    return rc;
}

int sh_fingerprint_take(void *ctx, uint64_t ticket, size_t n, struct sh_clean_fp *out)
{
    struct sh_fp *fp = ctx;
    const struct sh_driver *d = &sh_rt.drv;
    size_t first = (size_t)ticket - 1;
    if (ticket == 0 || first >= QSLOTS || n == 0 || first + n > QSLOTS)
        return SH_EINVAL;
    pthread_mutex_lock(&fp->mu);
    CUevent ev = fp->qt[first].n == n ? fp->qt[first].ev : NULL;
    int known = fp->qt[first].n == n && fp->qused[first];
    pthread_mutex_unlock(&fp->mu);
    if (!known)
        return SH_EINVAL;
    int rc = 0;
    if (ev && d->cuEventSynchronize(ev) != CUDA_SUCCESS) {
        rc = SH_EDRIVER;
        sh_driver_sync_dev(fp->dd); /* the slots are reused: whatever writes them must be done */
    }
    for (size_t i = 0; out && rc == 0 && i < n; i++)
        out[i] = sh_clean_finish(&fp->host_key, fp->qlen[first + i], fp->qx[first + i]);
    if (ev)
        sh_driver_fence_drop(fp->dd, (uint64_t)(uintptr_t)ev);
    pthread_mutex_lock(&fp->mu);
    fp->qt[first].n = 0;
    memset(fp->qused + first, 0, n);
    pthread_mutex_unlock(&fp->mu);
    return rc;
}
