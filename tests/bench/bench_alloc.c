/* bench_alloc.c — alloc+free cost per call through whatever cudart the
 * process sees. tests/bench/run.sh runs it directly on the simulated driver
 * and again under LD_PRELOAD=libstagehand.so, and prints the ratios.
 * Output: one "name ns" line per measurement.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Best of 5 rounds of n alloc+free pairs, in ns per pair. */
static double sync_pairs(size_t size, int n)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ns();
        for (int i = 0; i < n; i++) {
            void *p;
            if (cudaMalloc(&p, size) != cudaSuccess || cudaFree(p) != cudaSuccess) {
                fprintf(stderr, "bench_alloc: cudaMalloc/cudaFree(%zu) failed\n", size);
                exit(1);
            }
        }
        double t = (now_ns() - t0) / n;
        best = t < best ? t : best;
    }
    return best;
}

static double async_pairs(size_t size, int n, cudaStream_t s)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ns();
        for (int i = 0; i < n; i++) {
            void *p;
            if (cudaMallocAsync(&p, size, s) != cudaSuccess || cudaFreeAsync(p, s) != cudaSuccess) {
                fprintf(stderr, "bench_alloc: cudaMallocAsync/cudaFreeAsync(%zu) failed\n", size);
                exit(1);
            }
        }
        double t = (now_ns() - t0) / n;
        best = t < best ? t : best;
        cudaStreamSynchronize(s);
    }
    return best;
}

int main(void)
{
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) {
        fprintf(stderr, "bench_alloc: no CUDA device\n");
        return 1;
    }
    printf("malloc_free_8MiB %.1f\n", sync_pairs(8u << 20, 2000));
    printf("malloc_async_free_8MiB %.1f\n", async_pairs(8u << 20, 2000, s));
    printf("malloc_async_free_4KiB %.1f\n", async_pairs(4u << 10, 20000, s));
    cudaStreamDestroy(s);
    return 0;
}
