/* common.cuh — helpers shared by the real-GPU scenarios in tests/gpu.
 *
 * Every program prints exactly one closing line, "PASS name: ..." or
 * "FAIL name: ...", and exits 0 only after PASS. Figures for the results
 * file are printed as "RESULT name key=value ..." lines.
 *
 * The library's control API is reached with dlsym, so the same binary runs
 * with and without LD_PRELOAD=libstagehand.so. The device's real memory use
 * is read with the driver's cuMemGetInfo, which the library does not
 * intercept (its cudaMemGetInfo reports the budget view).
 */
#ifndef STAGEHAND_GPU_COMMON_CUH
#define STAGEHAND_GPU_COMMON_CUH

#include "stagehand.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

static const char *g_test = "gpu-test";

static inline void set_test_name(const char *name)
{
    g_test = name;
}

__attribute__((format(printf, 1, 2), noreturn)) static inline void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    printf("FAIL %s: ", g_test);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    exit(1);
}

__attribute__((format(printf, 1, 2))) static inline void pass(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("PASS %s: ", g_test);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

__attribute__((format(printf, 1, 2))) static inline void info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  %s: ", g_test);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fail("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));              \
    } while (0)

#define CKD(call)                                                                                  \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *s_ = NULL;                                                                 \
            cuGetErrorName(r_, &s_);                                                               \
            fail("%s:%d: %s: %s (%d)", __FILE__, __LINE__, #call, s_ ? s_ : "?", (int)r_);         \
        }                                                                                          \
    } while (0)

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* An integer from the environment, or def when unset or empty. */
static inline long long env_ll(const char *name, long long def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!end || *end || x < 0)
        fail("%s=%s: expected a non-negative integer", name, v);
    return x;
}

/* The budget the library was given, in MB, as the environment says
 * (plain MB or a number with a G/GB suffix); 0 when not set. */
static inline long long budget_mb_from_env(void)
{
    const char *v = getenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB");
    if (!v || !*v)
        return 0;
    char *end = NULL;
    double x = strtod(v, &end);
    if (!end || x <= 0)
        return 0;
    while (*end == ' ')
        end++;
    if (*end == 'G' || *end == 'g')
        x *= 1024;
    else if (*end == 'T' || *end == 't')
        x *= 1024 * 1024;
    else if (*end == '%')
        return 0; /* a share of the card: the library's stats say how much */
    return (long long)x;
}

/* ---- the library's control API, when it is preloaded ---- */

struct sh_api {
    int (*get_stats)(stagehand_stats_t *, size_t);
    void *(*malloc_fn)(ssize_t, int, void *);
    void (*free_fn)(void *, ssize_t, int, void *);
};

static inline sh_api sh_lookup(void)
{
    sh_api a;
    a.get_stats = (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    a.malloc_fn = (void *(*)(ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_malloc");
    a.free_fn = (void (*)(void *, ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_free");
    return a;
}

static inline stagehand_stats_t sh_stats(void)
{
    static sh_api a = sh_lookup();
    stagehand_stats_t st;
    memset(&st, 0, sizeof st);
    if (a.get_stats)
        a.get_stats(&st, sizeof st);
    return st;
}

/* 1 when the library is preloaded and managing allocations. Call it after
 * the first CUDA allocation: asking earlier starts the library. */
static inline int sh_managed(void)
{
    return sh_stats().active != 0;
}

static inline const char *tracking_name(uint64_t mode)
{
    return mode == 1 ? "cupti" : mode == 2 ? "hooks" : "none";
}

static inline void print_sh_stats(const char *tag, const stagehand_stats_t &st)
{
    printf("RESULT %s %s active=%llu budget_mb=%llu evictions=%llu restores=%llu d2h_mb=%llu "
           "h2d_mb=%llu host_mb=%llu pinned_mb=%llu launches=%llu tracking=%s remap_windows=%llu "
           "checksum_mismatches=%llu oom=%llu\n",
           g_test, tag, (unsigned long long)st.active, (unsigned long long)(st.budget_bytes >> 20),
           (unsigned long long)st.evictions, (unsigned long long)st.restores,
           (unsigned long long)(st.d2h_bytes >> 20), (unsigned long long)(st.h2d_bytes >> 20),
           (unsigned long long)(st.host_bytes >> 20), (unsigned long long)(st.pinned_bytes >> 20),
           (unsigned long long)st.launches, tracking_name(st.tracking_mode),
           (unsigned long long)st.remap_windows, (unsigned long long)st.checksum_mismatches,
           (unsigned long long)st.oom);
    fflush(stdout);
}

/* ---- the device's real memory use ---- */

/* Bytes in use on the device as the driver sees it (all processes). The
 * calling thread needs the primary context current. */
static inline size_t device_used(void)
{
    size_t free_b = 0, total = 0;
    if (cuMemGetInfo(&free_b, &total) != CUDA_SUCCESS)
        return 0;
    return total - free_b;
}

/* Samples device_used() and the library's device_bytes on a helper thread
 * until stopped; keeps the maxima. */
class used_sampler
{
  public:
    explicit used_sampler(unsigned period_us = 500) : period_us_(period_us) {}
    void start(void)
    {
        CK(cudaGetDevice(&dev_));
        stop_.store(false);
        if (pthread_create(&thread_, NULL, main_fn, this) != 0)
            fail("pthread_create failed");
    }
    void stop(void)
    {
        stop_.store(true);
        pthread_join(thread_, NULL);
        sample();
    }
    size_t peak_used(void) const
    {
        return peak_used_.load();
    }
    size_t peak_sh_device(void) const
    {
        return peak_sh_.load();
    }

  private:
    static void *main_fn(void *arg)
    {
        used_sampler *s = (used_sampler *)arg;
        cudaSetDevice(s->dev_); /* makes the primary context current here */
        while (!s->stop_.load()) {
            s->sample();
            usleep(s->period_us_);
        }
        return NULL;
    }
    void sample(void)
    {
        size_t u = device_used();
        size_t p = peak_used_.load();
        while (u > p && !peak_used_.compare_exchange_weak(p, u)) {
        }
        size_t d = (size_t)sh_stats().device_bytes;
        p = peak_sh_.load();
        while (d > p && !peak_sh_.compare_exchange_weak(p, d)) {
        }
    }
    unsigned period_us_;
    int dev_ = 0;
    pthread_t thread_;
    std::atomic<bool> stop_{false};
    std::atomic<size_t> peak_used_{0}, peak_sh_{0};
};

/* ---- the data pattern every scenario writes and checks ---- */

__host__ __device__ static inline uint32_t pattern(uint32_t seed, size_t i, uint32_t bumps)
{
    return seed * 2654435761u + (uint32_t)i + bumps;
}

/* fill(p, n, seed): p[i] = pattern(seed, i, 0) */
__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = pattern(seed, i, 0);
}

/* bump(p, n): p[i] += 1 */
__global__ void k_bump(uint32_t *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] += 1;
}

/* count_bad(p, n, seed, bumps, bad): *bad += words that differ */
__global__ void k_count_bad(const uint32_t *p, size_t n, uint32_t seed, uint32_t bumps,
                            unsigned long long *bad)
{
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        mine += p[i] != pattern(seed, i, bumps);
    if (mine)
        atomicAdd(bad, mine);
}

static const unsigned kGrid = 528, kBlock = 256; /* 4 blocks per SM on an H100 */

/* Words of a host copy that differ from the pattern. */
static inline size_t host_mismatches(const uint32_t *h, size_t n, uint32_t seed, uint32_t bumps)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != pattern(seed, i, bumps);
    return bad;
}

/* 64-bit FNV-1a over words, to compare runs with and without the library. */
static inline uint64_t fnv1a(uint64_t h, const uint32_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#endif
