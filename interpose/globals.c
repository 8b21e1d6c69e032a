/* globals.c — module globals whose device address the program took:
 * cudaGetSymbolAddress, cuModuleGetGlobal (each version) and
 * cuLibraryGetGlobal, however the program found them (intercept.c and
 * dlsym.c hand out these exports).
 *
 * A kernel reads its module's globals without naming them in its
 * parameters, so a pointer table kept in one reaches regions no launch scan
 * sees. cudaMemcpyToSymbol says where it writes (sh_work_symbol_up); a
 * program that took the address may fill the global with an ordinary copy
 * instead, so intercept.c checks uploads against the ranges kept here.
 *
 * The table is bounded: when full, its ranges fold into one that covers
 * them all (more copies are checked, none fewer). Ranges are never removed:
 * a module unloaded is not followed (speed, not data).
 *
 * Shared state: the ranges under an rwlock; their bounds are atomics, so a
 * program that takes no global's address pays two loads per upload.
 */
#include "interpose/intercept.h"

#include <pthread.h>

#define EXPORT  __attribute__((visibility("default")))
#define GLOBALS 64

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static uintptr_t lo_at[GLOBALS], hi_at[GLOBALS]; /* [lo, hi) */
static int nglobals;
static uintptr_t min_lo = UINTPTR_MAX, max_hi; /* atomics */

/* The index of a range holding [lo, hi), or -1; lock held. */
static int holding(uintptr_t lo, uintptr_t hi)
{
    for (int i = 0; i < nglobals; i++)
        if (lo_at[i] <= lo && hi <= hi_at[i])
            return i;
    return -1;
}

static void fold(void)
{
    for (int i = 1; i < nglobals; i++) {
        lo_at[0] = lo_at[i] < lo_at[0] ? lo_at[i] : lo_at[0];
        hi_at[0] = hi_at[i] > hi_at[0] ? hi_at[i] : hi_at[0];
    }
    nglobals = 1;
}

void sh_globals_add(uintptr_t p, size_t n)
{
    if (!p || !n)
        return;
    uintptr_t hi = p + n;
    pthread_rwlock_rdlock(&lock);
    int known = holding(p, hi) >= 0; /* asked again each step, or by both APIs */
    pthread_rwlock_unlock(&lock);
    if (known)
        return;
    pthread_rwlock_wrlock(&lock);
    if (holding(p, hi) < 0) {
        if (nglobals == GLOBALS)
            fold();
        lo_at[nglobals] = p;
        hi_at[nglobals++] = hi;
        if (p < __atomic_load_n(&min_lo, __ATOMIC_RELAXED))
            __atomic_store_n(&min_lo, p, __ATOMIC_RELEASE);
        if (hi > __atomic_load_n(&max_hi, __ATOMIC_RELAXED))
            __atomic_store_n(&max_hi, hi, __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&lock);
}

int sh_globals_meet(uintptr_t p, size_t n)
{
    if (!n || p + n <= __atomic_load_n(&min_lo, __ATOMIC_ACQUIRE) ||
        p >= __atomic_load_n(&max_hi, __ATOMIC_ACQUIRE))
        return 0;
    int hit = 0;
    pthread_rwlock_rdlock(&lock);
    for (int i = 0; i < nglobals && !hit; i++)
        hit = p < hi_at[i] && lo_at[i] < p + n;
    pthread_rwlock_unlock(&lock);
    return hit;
}

/* ---- the hooks ---- */

/* cuda.h renames it to its newest version; every version is exported. */
#undef cuModuleGetGlobal

typedef CUresult (*get_v1_fn)(unsigned int *, unsigned int *, CUmodule, const char *);
typedef CUresult (*get_v2_fn)(CUdeviceptr *, size_t *, CUmodule, const char *);
typedef CUresult (*lib_get_fn)(CUdeviceptr *, size_t *, CUlibrary, const char *);
typedef cudaError_t (*addr_fn)(void **, const void *);
typedef cudaError_t (*size_fn)(size_t *, const void *);

/* Found at their first call: the runtime may ask before the driver loads. */
static void *_Atomic real[5];
#define REAL(i, rt, type, name) ((type)sh_icept_lazy(&real[i], rt, name))

/* A driver form's answer: d and n are what the real call wrote, the
 * caller's dptr and bytes (either may be NULL) get them. */
static CUresult got(CUresult r, CUdeviceptr d, size_t n, CUdeviceptr *dptr, size_t *bytes)
{
    if (r != CUDA_SUCCESS)
        return r;
    sh_globals_add(d, n);
    if (dptr)
        *dptr = d;
    if (bytes)
        *bytes = n;
    return r;
}

/* The CUDA 3.x form: 32-bit addresses, so below 4 GB, but kept all the same. */
EXPORT CUresult cuModuleGetGlobal(unsigned int *dptr, unsigned int *bytes, CUmodule hmod,
                                  const char *name);
CUresult cuModuleGetGlobal(unsigned int *dptr, unsigned int *bytes, CUmodule hmod, const char *name)
{
    get_v1_fn f = REAL(0, 0, get_v1_fn, "cuModuleGetGlobal");
    unsigned int d = 0, n = 0; /* the size is asked for even where the caller does not */
    CUresult r = f ? got(f(&d, &n, hmod, name), d, n, NULL, NULL) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && dptr)
        *dptr = d;
    if (r == CUDA_SUCCESS && bytes)
        *bytes = n;
    return r;
}

EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
                                     const char *name)
{
    get_v2_fn f = REAL(1, 0, get_v2_fn, "cuModuleGetGlobal_v2");
    CUdeviceptr d = 0;
    size_t n = 0;
    return f ? got(f(&d, &n, hmod, name), d, n, dptr, bytes) : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                                   const char *name)
{
    lib_get_fn f = REAL(2, 0, lib_get_fn, "cuLibraryGetGlobal");
    CUdeviceptr d = 0;
    size_t n = 0;
    return f ? got(f(&d, &n, library, name), d, n, dptr, bytes) : CUDA_ERROR_NOT_FOUND;
}

/* The runtime form gives no size: cudaGetSymbolSize does. */
EXPORT cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    addr_fn f = REAL(3, 1, addr_fn, "cudaGetSymbolAddress");
    if (!f)
        return cudaErrorSymbolNotFound;
    cudaError_t e = f(devPtr, symbol);
    if (e != cudaSuccess || !devPtr)
        return e;
    size_fn sz = REAL(4, 1, size_fn, "cudaGetSymbolSize");
    size_t n = 0;
    if (!sz || sz(&n, symbol) != cudaSuccess)
        n = 1; /* at least its first byte */
    sh_globals_add((uintptr_t)*devPtr, n);
    return e;
}
