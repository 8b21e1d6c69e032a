/* test_e2e_cubin.c — parameter layouts from module images, for drivers
 * without cuFuncGetParamInfo. The simulated driver is made to refuse that
 * call (SIMCUDA_FAIL; a driver older than 12.4 lacks it, and one older than
 * 12.3 cuFuncGetName too); the program registers a real nvcc-built fatbin
 * and its kernel as nvcc-generated code would, and a launch of the kernel it
 * describes must still bring an evicted region back before it runs. A
 * kernel no image describes cannot be scanned: its launch counts as opaque
 * work (it may use any region); so does one whose name two images give
 * two layouts.
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
#include <fatbinary_section.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REGION (16u << 20)
#define NREG   24 /* 384 MB against a 256 MB budget */

static int preloaded;
typedef void (*register_fn_t)(void **, const char *, char *, const char *, int, uint3 *, uint3 *,
                              dim3 *, dim3 *, int *);
static const dim3 one = {1, 1, 1};

/* Registered under the name of the fixture's extern "C" kernel
 * k_ptrs(float *a, const int *b, double *c); writes through a. */
static void k_ptrs(void **args)
{
    uint32_t *a = *(uint32_t **)args[0];
    for (size_t i = 0; i < REGION / 4; i++)
        a[i] += 7;
}

/* Registered with no image: its parameters cannot be read. */
static void k_unknown(void **args)
{
    uint32_t *a = *(uint32_t **)args[0];
    a[0] += 1;
}

/* The same kernel, launched through a stub registered in another module
 * whose k_ptrs has another layout. */
static void k_ptrs_again(void **args)
{
    k_ptrs(args);
}

/* Static, as a program's fatbins and their wrappers are: the runtime
 * keeps pointers to them for the life of the process. */
#define MODULES 2
static unsigned long long images[MODULES][64 << 10];
static __fatBinC_Wrapper_t wrappers[MODULES];
static int nmodules;

static unsigned long long *load_fixture(const char *path, unsigned long long *buf, size_t size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, size, f);
    fclose(f);
    assert_true(n > 1000);
    return buf;
}

/* As a program's static constructor would, for the fatbin at path and its
 * kernel named "k_ptrs" behind stub; the simulated runtime loads no modules
 * itself, so only the library (when preloaded) sees it. */
static void register_module(const char *path, void (*stub)(void **))
{
    assert_true(nmodules < MODULES);
    __fatBinC_Wrapper_t *wrapper = &wrappers[nmodules];
    *wrapper = (__fatBinC_Wrapper_t){
        FATBINC_MAGIC, 1, load_fixture(path, images[nmodules], sizeof images[nmodules]), NULL};
    nmodules++;
    void **(*register_fatbin)(void *) =
        (void **(*)(void *))dlsym(RTLD_DEFAULT, "__cudaRegisterFatBinary");
    register_fn_t register_fn = (register_fn_t)dlsym(RTLD_DEFAULT, "__cudaRegisterFunction");
    if (register_fatbin && register_fn) /* the kernel's name, before cuFuncGetName (12.3) */
        register_fn(register_fatbin(wrapper), (const char *)stub, "k_ptrs", "k_ptrs", -1, NULL,
                    NULL, NULL, NULL, NULL);
}

static stagehand_stats_t stats(void)
{
    stagehand_stats_t st = {0};
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    if (get)
        get(&st, sizeof st);
    return st;
}

static void test_layout_from_fatbin(void **state)
{
    (void)state;
    register_module("tests/unit/cubin/kparams.fatbin", k_ptrs);

    void *r[NREG];
    for (int i = 0; i < NREG; i++) {
        assert_int_equal(cudaMalloc(&r[i], REGION), cudaSuccess);
        assert_int_equal(cudaMemset(r[i], i, REGION), cudaSuccess);
    }
    stagehand_stats_t before = stats();
    void *other = r[1];
    double *none = NULL;
    void *args[] = {&r[0], &other, &none}; /* r[0] and r[1] are the coldest: evicted */
    assert_int_equal(cudaLaunchKernel((const void *)k_ptrs, one, one, args, 0, NULL), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    stagehand_stats_t after = stats();
    if (preloaded) {
        assert_true(before.evictions > 0);
        assert_true(after.restores >= before.restores + 2); /* both pointers were seen */
        assert_int_equal(after.opaque_work, before.opaque_work);
    }
    void *unknown_args[] = {&r[2]};
    assert_int_equal(cudaLaunchKernel((const void *)k_unknown, one, one, unknown_args, 0, NULL),
                     cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    if (preloaded)
        assert_int_equal(stats().opaque_work, after.opaque_work + 1);
    /* Another module with its own k_ptrs: the name no longer tells the
     * layout, and a stub not launched before cannot be read. */
    register_module("tests/unit/cubin/kclash.fatbin", k_ptrs_again);
    after = stats();
    assert_int_equal(cudaLaunchKernel((const void *)k_ptrs_again, one, one, args, 0, NULL),
                     cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    if (preloaded)
        assert_int_equal(stats().opaque_work, after.opaque_work + 1);
    uint8_t *h = malloc(REGION);
    assert_int_equal(cudaMemcpy(h, r[0], REGION, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < REGION; i += 4)
        if (h[i] != 14 || h[i + 1] != 0)
            fail_msg("wrong bytes at %zu", i);
    free(h);
    for (int i = 0; i < NREG; i++)
        cudaFree(r[i]);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_CUBIN_CONFIGURED")) {
        setenv("E2E_CUBIN_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "512", 1);
        setenv("SIMCUDA_FAIL", "cuFuncGetParamInfo:1+:CUDA_ERROR_NOT_SUPPORTED", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "256", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    size_t sizes[] = {sizeof(void *), sizeof(void *), sizeof(void *)};
    if (simcuda_register_kernel(k_ptrs, "k_ptrs", 3, sizes, 0) != 0 ||
        simcuda_register_kernel(k_ptrs_again, "k_ptrs_again", 3, sizes, 0) != 0 ||
        simcuda_register_kernel(k_unknown, "k_unknown", 1, sizes, 0) != 0)
        return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_layout_from_fatbin)};
    return cmocka_run_group_tests_name(preloaded ? "e2e_cubin (preloaded)" : "e2e_cubin (disabled)",
                                       tests, NULL, NULL);
}
