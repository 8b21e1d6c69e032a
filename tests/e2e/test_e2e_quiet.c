/* test_e2e_quiet.c — while nothing is off the device, launches are issued
 * without a look at their arguments, and the first move after them still
 * waits for them.
 *
 * A region is written by a slow kernel on a stream of its own while the
 * pool is far below the card: the launch is not scanned (launches_unscanned
 * grows, the region's use is not recorded anywhere). Allocations then push
 * the pool past its budget until that region is evicted, while the kernel
 * still runs. A move that did not wait for it would remap the region under
 * the running kernel, which the simulated GPU reports as a fault, and copy
 * the bytes from before the kernel's writes. Checked with drain_mode =
 * tracked (the drain waits for streams, and the unscanned launch named
 * none) and device; a launch while a region is on the host is scanned.
 *
 * Then the same with two simulated GPUs, the eviction made while the
 * program has the other device current (a program that drives two cards
 * does that all the time): the move must wait for the managed device's
 * kernels, not for the current context's.
 *
 * Last, with drain_mode = tracked and a region on the host (launches are
 * scanned), a slow kernel that names no region writes one through a table
 * a kernel built on the device, on the stream that last used the region:
 * evicting that region must wait for it, as a tracked drain waits for the
 * streams that used the region and this work is on one of them. A window
 * that waited only for the last launch naming the region would copy it
 * while the kernel still ran.
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
#include "stagehand.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define REGION_MB  8
#define WORDS      (((size_t)REGION_MB << 20) / 4)
#define SLOW_US    200000  /* far longer than the allocations that follow */
#define MAX_FILL   64      /* regions allocated to push the first one out */
#define UNNAMED_US 2000000 /* the unnamed writer: far longer than pushing a region out */

static int preloaded;
static char **saved_argv;

/* fill(p, n, v) */
static void k_fill(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t v = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = v + (uint32_t)i;
}

/* build(table, region): the table's first word is the region's address. */
static void k_build(void **a)
{
    **(void ***)a[0] = *(void **)a[1];
}

static atomic_int unnamed_done;

/* bump(table): adds 1 to the first word of the region the table points to. */
static void k_bump(void **a)
{
    uint32_t *p = **(uint32_t ***)a[0];
    p[0] += 1;
    atomic_store(&unnamed_done, 1);
}

static void stats(stagehand_stats_t *st)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    memset(st, 0, sizeof *st);
    assert_non_null(get);
    assert_int_equal(get(st, sizeof *st), 0);
}

static int residency(const void *p)
{
    int (*get)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    assert_non_null(get);
    return get(p);
}

static cudaError_t fill(void *p, uint32_t v, const void *kernel, cudaStream_t s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &v};
    dim3 one = {1, 1, 1};
    return cudaLaunchKernel(kernel, one, one, args, 0, s);
}

static uint32_t word0(const void *d)
{
    uint32_t v = 0;
    assert_int_equal(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

static void check(const void *d, uint32_t v)
{
    uint32_t *h = malloc(WORDS * 4);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, WORDS * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != v + (uint32_t)i;
    free(h);
    assert_int_equal(bad, 0);
}

/* Allocates until a is evicted; the regions allocated go to more[]. */
static int push_out(const void *a, void **more)
{
    int n = 0;
    while (n < MAX_FILL && residency(a) == 1) {
        assert_int_equal(cudaMalloc(&more[n], (size_t)REGION_MB << 20), cudaSuccess);
        n++;
    }
    assert_int_equal(residency(a), 0);
    return n;
}

/* Allocates through the pluggable entry point, for device 0, with device
 * 1 current, until a is evicted; the regions allocated go to more[]. */
static int push_out_from_device_1(const void *a, void **more)
{
    void *(*pmalloc)(ssize_t, int, void *) =
        (void *(*)(ssize_t, int, void *))dlsym(RTLD_DEFAULT, "stagehand_malloc");
    assert_non_null(pmalloc);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    int n = 0;
    while (n < MAX_FILL && residency(a) == 1) {
        more[n] = pmalloc((ssize_t)REGION_MB << 20, 0, NULL);
        assert_non_null(more[n]);
        n++;
    }
    assert_int_equal(residency(a), 0);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    return n;
}

/* The whole story, in a child with the drain mode set. */
static void quiet_then_evicted(void)
{
    void *a, *more[MAX_FILL];
    cudaStream_t s;
    stagehand_stats_t before, after;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaMalloc(&a, (size_t)REGION_MB << 20), cudaSuccess);
    assert_int_equal(cudaMemset(a, 0, (size_t)REGION_MB << 20), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);

    stats(&before);
    assert_int_equal(fill(a, 77, (const void *)k_fill, s), cudaSuccess);
    stats(&after);
    assert_int_equal(after.launches_unscanned, before.launches_unscanned + 1);
    assert_int_equal(after.launches, before.launches + 1);

    /* the kernel is still running */
    int n = getenv("E2E_QUIET_TWO") ? push_out_from_device_1(a, more) : push_out(a, more);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    check(a, 77);

    /* With a region on the host, a launch is scanned (and restores it). */
    stats(&before);
    assert_int_equal(fill(a, 5, (const void *)k_fill, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    stats(&after);
    assert_int_equal(after.launches_unscanned, before.launches_unscanned);
    assert_true(after.restores > before.restores);
    check(a, 5);

    for (int i = 0; i < n; i++)
        assert_int_equal(cudaFree(more[i]), cudaSuccess);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* The unnamed writer's story (drain_mode = tracked, in a child). */
static void unnamed_writer_waited_for(void)
{
    void *a, *b, *tab, *more[MAX_FILL], *bmore[MAX_FILL];
    cudaStream_t s;
    dim3 one = {1, 1, 1};
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaMalloc(&b, (size_t)REGION_MB << 20), cudaSuccess);
    int nb = push_out(b, bmore); /* a region on the host: launches are scanned */
    assert_int_equal(cudaMalloc(&a, (size_t)REGION_MB << 20), cudaSuccess);
    assert_int_equal(cudaMemset(a, 0, (size_t)REGION_MB << 20), cudaSuccess);
    assert_int_equal(cudaMalloc(&tab, sizeof(void *)), cudaSuccess); /* too small: no region */
    void *bargs[] = {&tab, &a}, *targs[] = {&tab};
    assert_int_equal(cudaLaunchKernel((const void *)k_build, one, one, bargs, 0, s), cudaSuccess);
    assert_int_equal(cudaLaunchKernel((const void *)k_bump, one, one, targs, 0, s), cudaSuccess);
    int n = push_out(a, more);
    assert_int_equal(atomic_load(&unnamed_done), 1); /* the eviction waited for it */
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(word0(a), 1);
    for (int i = 0; i < n; i++)
        assert_int_equal(cudaFree(more[i]), cudaSuccess);
    for (int i = 0; i < nb; i++)
        assert_int_equal(cudaFree(bmore[i]), cudaSuccess);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaFree(b), cudaSuccess);
    assert_int_equal(cudaFree(tab), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

static void test_in_child(void **state)
{
    (void)state;
    if (!preloaded || !getenv("E2E_QUIET_CHILD"))
        skip();
    if (getenv("E2E_QUIET_UNNAMED"))
        unnamed_writer_waited_for();
    else
        quiet_then_evicted();
}

static void test_tracked_unnamed_writer(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_QUIET_CHILD"))
        skip();
    static const char *const env[] = {"E2E_QUIET_CHILD=1", "E2E_QUIET_UNNAMED=1",
                                      "STAGEHAND_TRANSFER_DRAIN_MODE=tracked", NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static void test_tracked_drain(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_QUIET_CHILD"))
        skip();
    static const char *const env[] = {"E2E_QUIET_CHILD=1", "STAGEHAND_TRANSFER_DRAIN_MODE=tracked",
                                      NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static void test_device_drain(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_QUIET_CHILD"))
        skip();
    static const char *const env[] = {"E2E_QUIET_CHILD=1", "STAGEHAND_TRANSFER_DRAIN_MODE=device",
                                      NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static void test_other_device_current(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_QUIET_CHILD"))
        skip();
    static const char *const tracked[] = {"E2E_QUIET_CHILD=1",
                                          "E2E_QUIET_TWO=1",
                                          "SIMCUDA_DEVICES=2",
                                          "SIMCUDA_VRAM_MB=256",
                                          "STAGEHAND_TRANSFER_DRAIN_MODE=tracked",
                                          NULL};
    static const char *const device[] = {"E2E_QUIET_CHILD=1",
                                         "E2E_QUIET_TWO=1",
                                         "SIMCUDA_DEVICES=2",
                                         "SIMCUDA_VRAM_MB=256",
                                         "STAGEHAND_TRANSFER_DRAIN_MODE=device",
                                         NULL};
    assert_int_equal(e2e_rerun(saved_argv, tracked), 0);
    assert_int_equal(e2e_rerun(saved_argv, device), 0);
}

static int setup(void **state)
{
    (void)state;
    size_t sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    return simcuda_register_kernel(k_fill, "fill", 3, sizes, SLOW_US) ||
           simcuda_register_kernel(k_build, "build", 2, sizes, 0) ||
           simcuda_register_kernel(k_bump, "bump", 1, sizes, UNNAMED_US);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_QUIET_CONFIGURED")) {
        setenv("E2E_QUIET_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_CONFIG", "/dev/null", 1); /* the built-in defaults */
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "128", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_child),
        cmocka_unit_test(test_tracked_drain),
        cmocka_unit_test(test_device_drain),
        cmocka_unit_test(test_other_device_current),
        cmocka_unit_test(test_tracked_unnamed_writer),
    };
    return cmocka_run_group_tests_name(preloaded ? "e2e_quiet (preloaded)" : "e2e_quiet (disabled)",
                                       tests, setup, NULL);
}
