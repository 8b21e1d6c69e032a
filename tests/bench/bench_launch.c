/* bench_launch.c — what one kernel launch costs, counted by callgrind.
 *
 * Usage: bench_launch REGIONS LAUNCHES
 * Allocates REGIONS buffers with cudaMalloc, then issues LAUNCHES launches of
 * one kernel with four pointer arguments and a step number: a loop of 64
 * distinct launches over a working set of 32 buffers, repeated, as a
 * training step repeats. Only the launch loop (and the
 * synchronisation that ends it) is instrumented: tests/bench/launch.sh runs
 * it under `valgrind --tool=callgrind --instr-atstart=no`, directly on the
 * simulated driver and under LD_PRELOAD=libstagehand.so, and divides.
 * BENCH_SECOND_DEVICE=1 then allocates one buffer on device 1, which
 * [general] devices = all then manages too (SIMCUDA_DEVICES=2): the
 * launches, on device 0, are those of a process with two devices managed.
 */
#include <cuda_runtime_api.h>
#include <simcuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <valgrind/callgrind.h>

#define LOOP        64
#define ARGS        4
#define WORKING_SET 32
#define WARMUP      (8 * LOOP)

static void kernel4(void **args)
{
    (void)args; /* the launch is what is measured, not the kernel */
}

static void die(const char *what)
{
    fprintf(stderr, "bench_launch: %s failed\n", what);
    exit(1);
}

int main(int argc, char **argv)
{
    long nregions = argc > 2 ? strtol(argv[1], NULL, 10) : 0;
    long launches = argc > 2 ? strtol(argv[2], NULL, 10) : 0;
    size_t bytes = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : (size_t)1 << 20;
    if (nregions < WORKING_SET || launches < 1) {
        fprintf(stderr, "usage: bench_launch REGIONS(>=%d) LAUNCHES [BYTES]\n", WORKING_SET);
        return 2;
    }
    const size_t sizes[ARGS + 1] = {8, 8, 8, 8, 8};
    if (simcuda_register_kernel(kernel4, "kernel4", ARGS + 1, sizes, 0) != 0)
        die("simcuda_register_kernel");
    void **buf = calloc((size_t)nregions, sizeof *buf), *other = NULL;
    if (!buf)
        die("calloc");
    /* Filled as a model's tensors are (0x3c3c3c3c: about 0.0115 as a float):
     * no value in them looks like a pointer, as the memory the simulated
     * driver hands out fresh may. */
    for (long i = 0; i < nregions; i++)
        if (cudaMalloc(&buf[i], bytes) != cudaSuccess ||
            cudaMemset(buf[i], 0x3c, bytes) != cudaSuccess)
            die("cudaMalloc");
    if (getenv("BENCH_SECOND_DEVICE") &&
        (cudaSetDevice(1) != cudaSuccess || cudaMalloc(&other, bytes) != cudaSuccess ||
         cudaSetDevice(0) != cudaSuccess))
        die("a buffer on device 1");
    /* The working set is spread over the whole set, as a model's layers are. */
    long stride = nregions / WORKING_SET;
    for (long n = 0; n < WARMUP + launches; n++) {
        if (n == WARMUP) {
            if (cudaDeviceSynchronize() != cudaSuccess)
                die("cudaDeviceSynchronize");
            CALLGRIND_START_INSTRUMENTATION;
        }
        long step = n % LOOP;
        void *p[ARGS];
        void *args[ARGS + 1];
        for (int a = 0; a < ARGS; a++) {
            p[a] = buf[((step * (2 * a + 1) + a) % WORKING_SET) * stride];
            args[a] = &p[a];
        }
        args[ARGS] = &step;
        const dim3 one = {1, 1, 1};
        if (cudaLaunchKernel((const void *)kernel4, one, one, args, 0, 0) != cudaSuccess)
            die("cudaLaunchKernel");
    }
    if (cudaDeviceSynchronize() != cudaSuccess)
        die("cudaDeviceSynchronize");
    CALLGRIND_STOP_INSTRUMENTATION;
    for (long i = 0; i < nregions; i++)
        cudaFree(buf[i]);
    cudaFree(other);
    free(buf);
    return 0;
}
