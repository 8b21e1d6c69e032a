/* twogpu.h — what the two-GPU end-to-end programs (test_e2e_peers,
 * test_e2e_devices) share: their kernels on the simulated GPU, a launch of
 * each, the library's control API looked up at run time (absent when not
 * preloaded), and checks of where a region is and what it holds. Regions
 * are REGION_MB each; a kernel's words are WORDS.
 */
#ifndef SH_E2E_TWOGPU_H
#define SH_E2E_TWOGPU_H

#include "simcuda.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define MiB       (1ull << 20)
#define REGION_MB 8
#define WORDS     ((REGION_MB * MiB) / 4)
#define SLOW_US   200000 /* far longer than the allocations that follow */

static const dim3 one = {1, 1, 1};

/* ---- kernels ---- */

/* fill(p, n, v): p[i] = v + i */
static inline void k_fill(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t v = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = v + (uint32_t)i;
}

static inline void k_fill_slow(void **a)
{
    k_fill(a);
}

/* bump(p, n): p[i] = p[i] * 3 + 1 */
static inline void k_bump(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    for (size_t i = 0; i < n; i++)
        p[i] = p[i] * 3 + 1;
}

/* The kernels above, made known to the simulated GPU. */
static inline int register_twogpu_kernels(void)
{
    size_t fill[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    size_t bump[] = {sizeof(void *), sizeof(size_t)};
    if (simcuda_register_kernel(k_fill, "fill", 3, fill, 0) != 0 ||
        simcuda_register_kernel(k_fill_slow, "fill_slow", 3, fill, SLOW_US) != 0)
        return -1;
    return simcuda_register_kernel(k_bump, "bump", 2, bump, 0);
}

static inline cudaError_t fill_on(simcuda_kernel_fn k, void *p, uint32_t v, cudaStream_t s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &v};
    return cudaLaunchKernel((const void *)k, one, one, args, 0, s);
}

/* A kernel of two parameters (a region and WORDS) on stream s. */
static inline cudaError_t launch2_on(simcuda_kernel_fn k, void *p, cudaStream_t s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n};
    return cudaLaunchKernel((const void *)k, one, one, args, 0, s);
}

/* ---- the library's control API, looked up (absent when not preloaded) ---- */

static inline int residency(const void *p)
{
    int (*get)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    assert_non_null(get);
    return get(p);
}

static inline void *pmalloc(size_t size, int device)
{
    void *(*f)(ssize_t, int, void *) =
        (void *(*)(ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_malloc");
    assert_non_null(f);
    return f((ssize_t)size, device, NULL);
}

static inline void pfree(void *p, size_t size, int device)
{
    void (*f)(void *, ssize_t, int, void *) =
        (void (*)(void *, ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_free");
    assert_non_null(f);
    f(p, (ssize_t)size, device, NULL);
}

/* ---- where a region is, what it holds ---- */

static inline int current(void)
{
    int d = -1;
    assert_int_equal(cudaGetDevice(&d), cudaSuccess);
    return d;
}

static inline int device_of(const void *p)
{
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    assert_int_equal(cudaPointerGetAttributes(&a, p), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeDevice);
    return a.device;
}

/* The words of a region, each checked against want(v, i). */
static inline void check(const void *d, uint32_t v, int bumped)
{
    uint32_t *h = malloc(WORDS * 4);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, WORDS * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++) {
        uint32_t want = v + (uint32_t)i;
        bad += h[i] != (bumped ? want * 3 + 1 : want);
    }
    free(h);
    assert_int_equal(bad, 0);
}

#endif
