/* fingerprint.c — the clean-region fingerprint on the device: the
 * library's kernel (clean/ptx.c) loaded with cuModuleLoadData through the
 * driver table and launched on a copy stream, one launch per range, each
 * XORing its blocks' digests into its own 16-byte slot, read back at once
 * and finished on the host (clean.h).
 *
 * The pool calls it inside remap windows, where nothing else runs (what it
 * trusts), and at an early eviction's start (a guess). It has a stream of
 * its own, so a call never waits behind the copies in flight. The module,
 * the key (in device memory, read by every thread block), the slots and
 * the stream are set up at the first call, so a program that never evicts
 * pays nothing; if that fails, every later call fails too and the pool
 * copies as it would without clean skip.
 *
 * The library's own launch must not be taken for the program's: CUPTI
 * reports it like any other, and the callback leaves it alone while
 * sh_fingerprint_own() says so.
 *
 * Locking: fp.mu serialises the set-up and every batch (the slots are
 * shared). own is per thread.
 */
#include "interpose/interpose.h"

#include "clean/clean.h"
#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>
#include <string.h>

#define SLOTS 256 /* ranges per round trip */
/* The key and the slots in one allocation of whole pages, so that what the
 * driver counts is what the library reports (sh_fingerprint_device_bytes). */
#define DEVICE_BYTES ((size_t)64 << 10)
_Static_assert(sizeof(struct sh_clean_key) + SLOTS * 16 <= DEVICE_BYTES, "key and slots fit");

enum { UNTRIED = 0, READY = 1, BROKEN = -1 };

static struct {
    pthread_mutex_t mu;
    int state;
    CUfunction fn;
    CUstream stream;
    CUdeviceptr key, out; /* the key, then SLOTS result slots */
    struct sh_clean_key host_key;
    uint64_t x[SLOTS][2];
    size_t device_bytes;
    uint64_t key_bytes; /* the key's upload, not yet reported */
    __typeof__(cuModuleLoadData) *load;
    __typeof__(cuModuleGetFunction) *get;
    __typeof__(cuMemAlloc) *alloc;
    __typeof__(cuMemFree) *free;
    __typeof__(cuMemcpyHtoD) *htod;
    __typeof__(cuMemsetD8Async) *memset;
    __typeof__(cuMemcpyDtoHAsync) *dtoh;
} fp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int own;

int sh_fingerprint_own(void)
{
    return own;
}

size_t sh_fingerprint_device_bytes(void)
{
    return __atomic_load_n(&fp.device_bytes, __ATOMIC_RELAXED);
}

static int lookup(const struct sh_driver *d)
{
    fp.load = (__typeof__(fp.load))sh_driver_optional(d, "cuModuleLoadData", 12000);
    fp.get = (__typeof__(fp.get))sh_driver_optional(d, "cuModuleGetFunction", 12000);
    fp.alloc = (__typeof__(fp.alloc))sh_driver_optional(d, "cuMemAlloc", 12000);
    fp.free = (__typeof__(fp.free))sh_driver_optional(d, "cuMemFree", 12000);
    fp.htod = (__typeof__(fp.htod))sh_driver_optional(d, "cuMemcpyHtoD", 12000);
    fp.memset = (__typeof__(fp.memset))sh_driver_optional(d, "cuMemsetD8Async", 12000);
    fp.dtoh = (__typeof__(fp.dtoh))sh_driver_optional(d, "cuMemcpyDtoHAsync", 12000);
    return fp.load && fp.get && fp.alloc && fp.free && fp.htod && fp.memset && fp.dtoh;
}

/* The module, the key and the slots; fp.mu held, the managed context current. */
static int set_up(const struct sh_driver *d)
{
    CUmodule mod;
    int least = 0, greatest = 0;
    const char *why = NULL;
    if (!lookup(d))
        why = "the driver lacks an entry point it needs";
    else if (sh_clean_key_random(&fp.host_key) != 0)
        why = "no random key could be drawn";
    else if (fp.load(&mod, sh_clean_ptx) != CUDA_SUCCESS ||
             fp.get(&fp.fn, mod, SH_CLEAN_KERNEL) != CUDA_SUCCESS)
        why = "its kernel did not load";
    else if (d->cuCtxGetStreamPriorityRange(&least, &greatest) != CUDA_SUCCESS ||
             d->cuStreamCreateWithPriority(&fp.stream, CU_STREAM_NON_BLOCKING, greatest) !=
                 CUDA_SUCCESS)
        why = "no stream for it";
    else if (fp.alloc(&fp.key, DEVICE_BYTES) != CUDA_SUCCESS)
        why = "no device memory for its key";
    else if (fp.htod(fp.key, &fp.host_key, sizeof fp.host_key) != CUDA_SUCCESS) {
        fp.free(fp.key); /* nothing may stay that the library does not count */
        why = "its key could not be copied";
    }
    if (why) {
        sh_log(SH_LOG_WARN, "clean regions cannot be told (%s): every eviction copies", why);
        return BROKEN;
    }
    fp.out = fp.key + sizeof fp.host_key;
    __atomic_store_n(&fp.device_bytes, DEVICE_BYTES, __ATOMIC_RELAXED);
    fp.key_bytes = sizeof fp.host_key; /* crossed the bus once */
    return READY;
}

static CUresult launch(CUstream s, uintptr_t addr, size_t len, unsigned slot)
{
    CUdeviceptr src = (CUdeviceptr)addr, key = fp.key, out = fp.out + 16 * slot;
    uint64_t n = len;
    void *args[] = {&src, &n, &key, &out};
    uint64_t blocks = (n + SH_CLEAN_BLOCK - 1) / SH_CLEAN_BLOCK;
    unsigned grid = blocks < SH_CLEAN_GRID_MAX ? (unsigned)blocks : SH_CLEAN_GRID_MAX;
    own = 1;
    CUresult r = sh_rt.drv.cuLaunchKernel(fp.fn, grid ? grid : 1, 1, 1, SH_CLEAN_THREADS, 1, 1, 0,
                                          s, args, NULL);
    own = 0;
    return r;
}

/* Up to SLOTS ranges: zeroed slots, one launch each, one read back. */
static int round_trip(const uintptr_t *addr, const size_t *len, size_t n, struct sh_clean_fp *out,
                      uint64_t bus[2])
{
    CUstream s = fp.stream;
    CUresult r = fp.memset(fp.out, 0, 16 * n, s);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
        if (len[i])
            r = launch(s, addr[i], len[i], (unsigned)i);
    if (r == CUDA_SUCCESS && (r = fp.dtoh(fp.x, fp.out, 16 * n, s)) == CUDA_SUCCESS)
        bus[SH_D2H] += 16 * n;
    if (r == CUDA_SUCCESS)
        r = sh_rt.drv.cuStreamSynchronize(s);
    if (r != CUDA_SUCCESS) {
        sh_log(SH_LOG_WARN, "fingerprint kernel failed (%s): those regions are copied",
               sh_driver_error(&sh_rt.drv, r));
        return SH_EDRIVER;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = sh_clean_finish(&fp.host_key, len[i], fp.x[i]);
    return 0;
}

int sh_fingerprint(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                   struct sh_clean_fp *out, uint64_t bus[2])
{
    (void)ctx;
    const struct sh_driver *d = &sh_rt.drv;
    if (d->cuCtxPushCurrent(d->ctx) != CUDA_SUCCESS)
        return SH_EDRIVER;
    pthread_mutex_lock(&fp.mu);
    if (fp.state == UNTRIED)
        fp.state = set_up(d);
    int rc = fp.state == READY ? 0 : SH_EDRIVER;
    bus[SH_H2D] += fp.key_bytes;
    fp.key_bytes = 0;
    for (size_t done = 0; done < n && rc == 0; done += SLOTS)
        rc = round_trip(addr + done, len + done, n - done < SLOTS ? n - done : SLOTS, out + done,
                        bus);
    pthread_mutex_unlock(&fp.mu);
    CUcontext popped;
    d->cuCtxPopCurrent(&popped);
    return rc;
}
