/* test_sim_versions.c — the simulated driver claiming an older CUDA
 * (SIMCUDA_DRIVER_VERSION), as the real drivers of those versions document:
 * cuGetProcAddress refuses a version newer than the driver and lacks the
 * entry points of later releases (names 12.3, parameter layouts 12.4,
 * batched copies 12.8); host-located VMM memory and its attributes start
 * at 12.2; the runtime's cudaGetDriverEntryPoint, which compares a symbol's
 * version with the runtime's only, still finds the driver's symbols when
 * the runtime is newer than the driver.
 *
 * The driver reads its version once, so each version runs in a fresh
 * process: this program again, with the version and a child marker in its
 * environment. A child exits 0 if every check held, else 1 after naming
 * the failed check on stderr.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- the child: checks for the version it runs under ---- */

/* 1 if the driver hands out `name` when asked at its own version. */
static int has_entry(const char *name, int version)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    if (cuGetProcAddress(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS)
        return -1;
    if (!p && q != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        return -1; /* a missing symbol must say so */
    return p != NULL;
}

static CUresult host_numa_create(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}};
    size_t gran = 0;
    CUresult r = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemGenericAllocationHandle h = 0;
    r = cuMemCreate(&h, gran, &prop, 0);
    if (r == CUDA_SUCCESS)
        cuMemRelease(h);
    return r;
}

static int child(int version)
{
    int v = 0;
    CHECK(cuDriverGetVersion(&v) == CUDA_SUCCESS && v == version);
    CHECK(cudaDriverGetVersion(&v) == cudaSuccess && v == version);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    void *p = NULL;
    CHECK(cuGetProcAddress("cuMemCreate", &p, version + 10, CU_GET_PROC_ADDRESS_DEFAULT, NULL) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(has_entry("cuMemCreate", version) == 1);
    CHECK(has_entry("cuFuncGetName", version) == (version >= 12030));
    CHECK(has_entry("cuKernelGetName", version) == (version >= 12030));
    CHECK(has_entry("cuFuncGetParamInfo", version) == (version >= 12040));
    CHECK(has_entry("cuKernelGetParamInfo", version) == (version >= 12040));
    CHECK(has_entry("cuMemcpyBatchAsync", version) == (version >= 12080));

    int attr = -1;
    CUresult r = cuDeviceGetAttribute(
        &attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
    CHECK(version >= 12020 ? r == CUDA_SUCCESS && attr == 1 : r == CUDA_ERROR_INVALID_VALUE);
    CHECK(host_numa_create() == (version >= 12020 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE));

    /* The runtime (CUDA 13 here) asks at the driver's version. */
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CHECK(cudaGetDriverEntryPoint("cuLaunchKernel", &p, cudaEnableDefault, &st) == cudaSuccess);
    CHECK(st == cudaDriverEntryPointSuccess && p);
    p = &v;
    cudaGetDriverEntryPoint("cuFuncGetParamInfo", &p, cudaEnableDefault, &st);
#pragma GCC diagnostic pop
    CHECK(version >= 12040 ? st == cudaDriverEntryPointSuccess && p
                           : st == cudaDriverEntryPointSymbolNotFound && !p);
    return 0;
}

/* ---- the parent ---- */

static int run_version(const char *version)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("SIMCUDA_DRIVER_VERSION", version, 1);
        setenv("TEST_SIM_VERSIONS_CHILD", version, 1);
        execl("/proc/self/exe", "test_sim_versions", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define VERSION(v)                                                                                 \
    static void driver_##v(void **state)                                                           \
    {                                                                                              \
        (void)state;                                                                               \
        assert_int_equal(run_version(#v), 0);                                                      \
    }
VERSION(12000)
VERSION(12020)
VERSION(12030)
VERSION(12040)
VERSION(12080)
VERSION(13000)

int main(void)
{
    const char *c = getenv("TEST_SIM_VERSIONS_CHILD");
    if (c)
        return child(atoi(c));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(driver_12000), cmocka_unit_test(driver_12020),
        cmocka_unit_test(driver_12030), cmocka_unit_test(driver_12040),
        cmocka_unit_test(driver_12080), cmocka_unit_test(driver_13000),
    };
    return cmocka_run_group_tests_name("sim_versions", tests, NULL, NULL);
}
