/* test_e2e_driver.c — a program that reaches the driver only by looking it
 * up (dlsym on libcuda, cuGetProcAddress with the per-thread flag,
 * cudaGetDriverEntryPoint[ByVersion]), as JAX, CuPy and Triton do, and
 * issues driver memsets and copies from one thread while another thread's
 * launches keep evicting and restoring, at three times the budget.
 *
 * Every lookup must hand out the library's wrapper, and every byte must
 * come out as a host reference says: with the default configuration, and
 * again with drain_mode = tracked.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"
#include "stagehand.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NREG      24 /* of REGION_MB: 3x the 64 MB budget */
#define REGION_MB 8
#define WORDS     (((size_t)REGION_MB << 20) / 4)
#define ROUNDS    6

static void *reg[NREG];
static dim3 one = {1, 1, 1};

static void k_bump(void **a) /* (region) */
{
    uint32_t *p = *(uint32_t **)a[0];
    p[0] += 1;
    p[WORDS / 2] += 1;
    p[WORDS - 1] += 1;
}

static int from_stagehand(void *f)
{
    Dl_info info;
    return f && dladdr(f, &info) && info.dli_fname && strstr(info.dli_fname, "libstagehand");
}

typedef CUresult (*memset32_fn)(CUdeviceptr, unsigned, size_t, CUstream);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*sync_fn)(CUstream);

static memset32_fn memset32;
static htod_fn htod;
static sync_fn stream_sync;

static void test_lookups_hand_out_the_wrappers(void **state)
{
    (void)state;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(cuda);
    memset32 = (memset32_fn)dlsym(cuda, "cuMemsetD32Async");
    assert_true(from_stagehand((void *)memset32));
    stream_sync = (sync_fn)dlsym(cuda, "cuStreamSynchronize");
    assert_non_null(stream_sync);

    void *p = NULL;
    CUdriverProcAddressQueryResult q;
    assert_int_equal(cuGetProcAddress("cuMemsetD32Async", &p, 12000,
                                      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q),
                     CUDA_SUCCESS);
    assert_true(from_stagehand(p));

    enum cudaDriverEntryPointQueryResult st;
    assert_int_equal(
        cudaGetDriverEntryPointByVersion("cuMemcpyHtoDAsync", &p, 12000, cudaEnableDefault, &st),
        cudaSuccess);
    assert_int_equal(st, cudaDriverEntryPointSuccess);
    assert_true(from_stagehand(p));
    htod = (htod_fn)p;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    assert_int_equal(cudaGetDriverEntryPoint("cuLaunchKernel", &p, cudaEnableDefault, &st),
                     cudaSuccess);
#pragma GCC diagnostic pop
    assert_true(from_stagehand(p));
    /* What the library does not wrap stays the driver's own. */
    assert_false(from_stagehand(dlsym(cuda, "cuInit")));
}

/* The driver thread: odd regions get a whole-region memset, then a copy of
 * a marker into their first word, each round, on its own stream. */
static void *driver_thread(void *arg)
{
    (void)arg;
    CUstream s = NULL;
    cudaStreamCreateWithFlags((cudaStream_t *)&s, cudaStreamNonBlocking);
    for (uint32_t round = 1; round <= ROUNDS; round++)
        for (int i = 1; i < NREG; i += 2) {
            uint32_t marker = 0x4d000000u | round << 8 | (uint32_t)i;
            memset32((CUdeviceptr)(uintptr_t)reg[i], round * 1000u + (uint32_t)i, WORDS, s);
            htod((CUdeviceptr)(uintptr_t)reg[i], &marker, sizeof marker, s);
            stream_sync(s); /* the marker must be copied before it changes */
        }
    cudaStreamDestroy((cudaStream_t)s);
    return NULL;
}

static uint32_t word(const void *p, size_t i)
{
    uint32_t v = 0;
    cudaMemcpy(&v, (const uint32_t *)p + i, sizeof v, cudaMemcpyDeviceToHost);
    return v;
}

static void test_driver_work_during_eviction(void **state)
{
    (void)state;
    assert_non_null(memset32);
    for (int i = 0; i < NREG; i++) {
        assert_int_equal(cudaMalloc(&reg[i], (size_t)REGION_MB << 20), cudaSuccess);
        assert_int_equal(cudaMemset(reg[i], 0, (size_t)REGION_MB << 20), cudaSuccess);
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, driver_thread, NULL), 0);
    /* This thread's launches bump the even regions, cycling through all of
     * them, so regions keep being restored and evicted meanwhile. */
    for (int round = 0; round < ROUNDS; round++)
        for (int i = 0; i < NREG; i += 2) {
            void *args[] = {&reg[i]};
            assert_int_equal(cudaLaunchKernel((const void *)k_bump, one, one, args, 0, NULL),
                             cudaSuccess);
        }
    pthread_join(t, NULL);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    stagehand_stats_t st = {0};
    if (get && !getenv("STAGEHAND_DISABLE")) { /* the work really raced evictions */
        get(&st, sizeof st);
        assert_true(st.remap_windows > 0);
    }

    uint32_t *h = malloc((size_t)REGION_MB << 20);
    assert_non_null(h);
    int bad = 0;
    for (int i = 0; i < NREG; i++) {
        assert_int_equal(cudaMemcpy(h, reg[i], (size_t)REGION_MB << 20, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        if (i % 2 == 0) {
            bad += h[0] != ROUNDS || h[WORDS / 2] != ROUNDS || h[WORDS - 1] != ROUNDS;
            continue;
        }
        uint32_t fillv = ROUNDS * 1000u + (uint32_t)i;
        bad += h[0] != (0x4d000000u | ROUNDS << 8 | (uint32_t)i);
        for (size_t w = 1; w < WORDS; w++)
            if (h[w] != fillv) {
                bad++;
                break;
            }
    }
    free(h);
    if (bad)
        fprintf(stderr, "%d of %d regions hold the wrong bytes; word 1 of region 1: %u\n", bad,
                NREG, word(reg[1], 1));
    assert_int_equal(bad, 0);
    for (int i = 0; i < NREG; i++)
        cudaFree(reg[i]);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_DRIVER_CONFIGURED")) {
        setenv("E2E_DRIVER_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        setenv("STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB", "80%", 1);
        setenv("STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB", "60%", 1);
        e2e_reexec(argv);
        return 1;
    }
    size_t sizes[] = {sizeof(void *)};
    if (simcuda_register_kernel(k_bump, "bump", 1, sizes, 0) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups_hand_out_the_wrappers),
        cmocka_unit_test(test_driver_work_during_eviction),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (!failed && !getenv("E2E_DRIVER_TRACKED") && !getenv("STAGEHAND_DISABLE")) {
        static const char *const tracked[] = {"E2E_DRIVER_TRACKED=1",
                                              "STAGEHAND_TRANSFER_DRAIN_MODE=tracked", NULL};
        failed = e2e_rerun(argv, tracked) != 0;
    }
    return failed;
}
