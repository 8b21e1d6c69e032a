/* hostmem.c — memory both the CPU and kernels reach: pinned host memory
 * (cudaMallocHost, cudaHostAlloc, cuMemAllocHost, cuMemHostAlloc),
 * registered host memory (cudaHostRegister, cuMemHostRegister) and managed
 * memory (cudaMallocManaged, cuMemAllocManaged). The program's CPU writes it with
 * no call the library sees, so a pointer table kept there is invisible to
 * every scan: a launch whose parameters point into such memory is opaque
 * (launch.c asks sh_hostmem_hit), and so counts as using every region.
 * sh_host_readable tells host memory from device memory for the copies
 * whose bytes the library reads.
 *
 * The calls that make and free such memory are hostcalls.c's. A runtime
 * call that reaches the driver's through those hooks records the same
 * range twice: ranges are added and removed by start, idempotently.
 *
 * Shared state: the ranges, sorted by start, under an rwlock; their count
 * is an atomic, so a program that pins nothing pays one load per scan.
 */
#include "interpose/interpose.h"

#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct range {
    uintptr_t lo, hi;
};

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct range *ranges;
static size_t nranges, cap;
static size_t count; /* nranges, read without the lock */
static uint64_t gen; /* ranges added so far (atomic) */
/* Atomics: every range ever added lies between them. */
static uintptr_t min_lo = UINTPTR_MAX, max_hi;
/* Atomic: a range could not be recorded (out of memory); from then on
 * everything between min_lo and max_hi counts: more launches are opaque,
 * none fewer. */
static int spilled;

/* The index of the first range starting at or after p; lock held. */
static size_t first_from(uintptr_t p)
{
    size_t lo = 0, hi = nranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges[mid].lo < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Room for one more range; lock held. */
static int grow(void)
{
    if (nranges < cap)
        return 0;
    size_t c = cap ? 2 * cap : 64;
    struct range *n = realloc(ranges, c * sizeof *n);
    if (!n)
        return -1;
    ranges = n;
    cap = c;
    return 0;
}

void sh_hostmem_add(const void *p, size_t n)
{
    uintptr_t lo = (uintptr_t)p;
    if (!p || !n)
        return;
    pthread_rwlock_wrlock(&lock);
    if (lo < min_lo)
        __atomic_store_n(&min_lo, lo, __ATOMIC_RELAXED);
    if (lo + n > max_hi)
        __atomic_store_n(&max_hi, lo + n, __ATOMIC_RELAXED);
    size_t i = first_from(lo);
    if (i < nranges && ranges[i].lo == lo) {
        ranges[i].hi = lo + n; /* recorded by the runtime's call and the driver's */
        __atomic_add_fetch(&gen, 1, __ATOMIC_RELEASE);
    } else if (grow() == 0) {
        memmove(&ranges[i + 1], &ranges[i], (nranges - i) * sizeof *ranges);
        ranges[i] = (struct range){lo, lo + n};
        __atomic_store_n(&count, ++nranges, __ATOMIC_RELEASE);
        __atomic_add_fetch(&gen, 1, __ATOMIC_RELEASE);
    } else if (!__atomic_exchange_n(&spilled, 1, __ATOMIC_RELEASE)) {
        __atomic_add_fetch(&gen, 1, __ATOMIC_RELEASE);
        sh_log(SH_LOG_WARN,
               "out of memory recording pinned host memory at %p: from now on a launch "
               "pointing anywhere between the first and last such memory counts as opaque",
               p);
    } else {
        __atomic_add_fetch(&gen, 1, __ATOMIC_RELEASE); /* the bounds may have grown */
    }
    pthread_rwlock_unlock(&lock);
}

void sh_hostmem_del(const void *p)
{
    if (!__atomic_load_n(&count, __ATOMIC_ACQUIRE))
        return; /* every free of a program that pins nothing comes here */
    pthread_rwlock_wrlock(&lock);
    size_t i = first_from((uintptr_t)p);
    if (i < nranges && ranges[i].lo == (uintptr_t)p) {
        memmove(&ranges[i], &ranges[i + 1], (nranges - i - 1) * sizeof *ranges);
        __atomic_store_n(&count, --nranges, __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&lock);
}

/* Whether a value lies between the first and last range ever added. */
static int in_bounds(const uintptr_t *v, size_t n)
{
    uintptr_t lo = __atomic_load_n(&min_lo, __ATOMIC_RELAXED);
    uintptr_t hi = __atomic_load_n(&max_hi, __ATOMIC_RELAXED);
    for (size_t k = 0; k < n; k++)
        if (v[k] >= lo && v[k] < hi)
            return 1;
    return 0;
}

int sh_hostmem_hit(const uintptr_t *v, size_t n)
{
    if (n && __atomic_load_n(&spilled, __ATOMIC_ACQUIRE))
        return in_bounds(v, n);
    if (!n || !__atomic_load_n(&count, __ATOMIC_ACQUIRE))
        return 0;
    int hit = 0;
    pthread_rwlock_rdlock(&lock);
    for (size_t k = 0; k < n && !hit; k++) {
        size_t i = first_from(v[k] + 1); /* the first starting after v[k] */
        hit = i > 0 && v[k] < ranges[i - 1].hi;
    }
    pthread_rwlock_unlock(&lock);
    return hit;
}

uint64_t sh_hostmem_gen(void)
{
    return __atomic_load_n(&gen, __ATOMIC_ACQUIRE);
}

void sh_hostmem_bounds(uintptr_t *lo, uintptr_t *hi)
{
    *lo = __atomic_load_n(&min_lo, __ATOMIC_RELAXED);
    *hi = __atomic_load_n(&max_hi, __ATOMIC_RELAXED);
}

/* Not a region, and not memory the driver calls device memory (pageable
 * memory it does not know at all). */
int sh_host_readable(uintptr_t p)
{
    if (sh_dev_of(p))
        return 0;
    unsigned type = 0;
    CUresult r = sh_rt.drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    return r != CUDA_SUCCESS || type == CU_MEMORYTYPE_HOST;
}
