/* test_e2e_trace.c — a trace the library writes names each launch's stream
 * as it names the allocations' (docs/TRACE.md: `a` and `l` records).
 *
 * A child with STAGEHAND_TRACE set allocates one region with cudaMalloc
 * (the legacy stream) and one with cudaMallocAsync on a stream of its own,
 * then launches a kernel over both on that stream, on the legacy stream, on
 * its per-thread stream, and again on its own stream through the driver's
 * cuLaunchKernel. The parent reads the trace: the launches' streams must
 * be, in order, the async allocation's stream, 0, a third stream, and the
 * first again. Before, every launch was written on stream 0. The child
 * runs once with CUPTI tracking and once with hooks, whose launch paths
 * differ.
 *
 * The program re-executes itself to set the card and the configuration
 * before anything (the library reads them as it loads).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION_BYTES ((size_t)4 << 20)
#define LAUNCHES     4

static char **saved_argv;

static void k_touch(void **a)
{
    *(volatile uint32_t *)*(void **)a[0] += 1;
    *(volatile uint32_t *)*(void **)a[1] += 1;
}

static int launch(void *a, void *b, cudaStream_t s)
{
    void *args[] = {&a, &b};
    dim3 one = {1, 1, 1};
    return cudaLaunchKernel((const void *)k_touch, one, one, args, 0, s) != cudaSuccess;
}

static int child_main(void)
{
    size_t sizes[] = {sizeof(void *), sizeof(void *)};
    if (simcuda_register_kernel(k_touch, "touch", 2, sizes, 0))
        return 2;
    cudaStream_t s;
    void *a = NULL, *b = NULL;
    if (cudaStreamCreate(&s) != cudaSuccess || cudaMalloc(&a, REGION_BYTES) != cudaSuccess ||
        cudaMallocAsync(&b, REGION_BYTES, s) != cudaSuccess)
        return 3;
    CUfunction f = simcuda_function(k_touch);
    void *args[] = {&a, &b};
    if (launch(a, b, s) || launch(a, b, 0) || launch(a, b, cudaStreamPerThread) || !f ||
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, args, NULL) != CUDA_SUCCESS)
        return 4;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaFreeAsync(b, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess || cudaFree(a) != cudaSuccess)
        return 5;
    return 0;
}

/* The streams of the trace's async allocation and of its launches. */
struct seen {
    uint64_t alloc_stream;
    int allocs;
    uint64_t launch_stream[LAUNCHES + 1];
    int launches;
};

static void read_trace(const char *path, struct seen *out)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    memset(out, 0, sizeof *out);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *end, *p = line + 2;
        if (line[0] == 'a' && line[1] == ' ') { /* a T ID BYTES STREAM CLASS */
            for (int i = 0; i < 3; i++)
                strtoull(p, &p, 0);
            uint64_t stream = strtoull(p, &end, 0);
            assert_true(end != p);
            out->allocs++;
            if (stream != 0)
                out->alloc_stream = stream;
        } else if (line[0] == 'l' && line[1] == ' ') { /* l T DUR STREAM ... */
            strtoull(p, &p, 0);
            while (*p == ' ')
                p++;
            p += strcspn(p, " "); /* DUR: a number or '-' */
            uint64_t stream = strtoull(p, &end, 0);
            assert_true(end != p);
            if (out->launches <= LAUNCHES)
                out->launch_stream[out->launches] = stream;
            out->launches++;
        }
    }
    fclose(f);
}

static void run_traced(const char *mode)
{
    if (!dlsym(RTLD_DEFAULT, "stagehand_get_stats") || getenv("STAGEHAND_DISABLE"))
        skip();
    char path[] = "/tmp/stagehand-e2e-trace-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char trace_env[64], mode_env[64];
    snprintf(trace_env, sizeof trace_env, "STAGEHAND_TRACE=%s", path);
    snprintf(mode_env, sizeof mode_env, "STAGEHAND_TRACKING_MODE=%s", mode);
    const char *env[] = {"E2E_TRACE_CHILD=1", trace_env, mode_env, NULL};
    int rc = e2e_rerun(saved_argv, env);
    struct seen s;
    read_trace(path, &s);
    unlink(path);
    assert_int_equal(rc, 0);
    assert_int_equal(s.allocs, 2);
    assert_int_equal(s.launches, LAUNCHES);
    assert_true(s.alloc_stream != 0);
    assert_true(s.launch_stream[0] == s.alloc_stream); /* its own stream */
    assert_true(s.launch_stream[1] == 0);              /* the legacy stream */
    assert_true(s.launch_stream[2] != 0 && s.launch_stream[2] != s.alloc_stream); /* per-thread */
    assert_true(s.launch_stream[3] == s.alloc_stream); /* the driver's call */
}

static void test_trace_streams_cupti(void **state)
{
    (void)state;
    run_traced("cupti");
}

static void test_trace_streams_hooks(void **state)
{
    (void)state;
    run_traced("hooks");
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_TRACE_CONFIGURED")) {
        setenv("E2E_TRACE_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_CONFIG", "/dev/null", 1); /* the built-in defaults */
        setenv("STAGEHAND_POOL_PREPIN_MB", "0", 1);
        e2e_reexec(argv);
        return 1;
    }
    if (getenv("E2E_TRACE_CHILD"))
        return child_main();
    saved_argv = argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_streams_cupti),
        cmocka_unit_test(test_trace_streams_hooks),
    };
    return cmocka_run_group_tests_name("e2e_trace", tests, NULL, NULL);
}
