/* test_e2e_pointers.c — what the program is told about its pointers.
 *
 * NCCL, MPI and PyTorch ask the driver where a buffer lives and where its
 * allocation begins and ends. A region is several VMM mappings, on host
 * slabs while evicted; the answers must still be those for a cudaMalloc
 * allocation: device memory, on device 0, the whole requested range, no host
 * pointer — resident or evicted, asked through the runtime, the driver's
 * exports or an entry point the driver handed out. Pinned host memory and
 * unknown pointers keep the driver's answers. tests/run.sh runs it under
 * the library and with it disabled: the answers must be the same.
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
#include <stdlib.h>

#define BIG    ((40u << 20) + 4096) /* three chunks under the library: 32 + 8 + 2 MB */
#define OTHER  (8u << 20)
#define NOTHER 16 /* 128 MB more against a 96 MB budget */

static int (*residency)(const void *);
static __typeof__(cuMemGetAddressRange_v2) *range_entry; /* from cudaGetDriverEntryPoint */

static void k_touch(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    p[0]++;
}

static void touch(void *p)
{
    void *args[] = {&p};
    dim3 one = {1, 1, 1};
    assert_int_equal(cudaLaunchKernel((const void *)k_touch, one, one, args, 0, NULL), cudaSuccess);
}

/* Every way of asking about p (inside the allocation [base, base + size))
 * says: device memory, device 0, that range, no host pointer. */
static void check_device(const void *p, const void *base, size_t size)
{
    struct cudaPointerAttributes a;
    assert_int_equal(cudaPointerGetAttributes(&a, p), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeDevice);
    assert_int_equal(a.device, 0);
    assert_ptr_equal(a.devicePointer, p);
    assert_null(a.hostPointer);

    CUdeviceptr d = (CUdeviceptr)(uintptr_t)p, b = 0;
    size_t s = 0;
    assert_int_equal(cuMemGetAddressRange(&b, &s, d), CUDA_SUCCESS);
    assert_int_equal(b, (uintptr_t)base);
    assert_int_equal(s, size);
    b = 0, s = 0;
    assert_int_equal(range_entry(&b, &s, d), CUDA_SUCCESS);
    assert_int_equal(b, (uintptr_t)base);
    assert_int_equal(s, size);

    CUmemorytype type = 0;
    assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d),
                     CUDA_SUCCESS);
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    void *host = (void *)1;
    assert_int_equal(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, d),
                     CUDA_ERROR_INVALID_VALUE);

    CUpointer_attribute what[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_HOST_POINTER,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    int ordinal = -1;
    type = 0, b = 0, s = 0, host = (void *)1;
    void *data[] = {&type, &b, &s, &host, &ordinal};
    assert_int_equal(cuPointerGetAttributes(5, what, data, d), CUDA_SUCCESS);
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(b, (uintptr_t)base);
    assert_int_equal(s, size);
    assert_null(host);
    assert_int_equal(ordinal, 0);
}

static int setup(void **state)
{
    (void)state;
    size_t sizes[] = {sizeof(void *)};
    assert_int_equal(simcuda_register_kernel(k_touch, "touch", 1, sizes, 0), 0);
    residency = (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    enum cudaDriverEntryPointQueryResult q;
    assert_int_equal(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&range_entry,
                                                      12000, cudaEnableDefault, &q),
                     cudaSuccess);
    return 0;
}

/* A region of three chunks, asked about in its last chunk, resident and
 * then evicted. */
static void test_region_resident_and_evicted(void **state)
{
    (void)state;
    char *big = NULL;
    assert_int_equal(cudaMalloc((void **)&big, BIG), cudaSuccess);
    touch(big);
    check_device(big + (35u << 20), big, BIG);
    check_device(big + BIG - 1, big, BIG);
    void *other[NOTHER];
    for (int i = 0; i < NOTHER; i++) {
        assert_int_equal(cudaMalloc(&other[i], OTHER), cudaSuccess);
        touch(other[i]);
    }
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    if (residency && !getenv("STAGEHAND_DISABLE")) /* the oldest region went to the host */
        assert_int_equal(residency(big + (35u << 20)), 0);
    check_device(big + (35u << 20), big, BIG);
    check_device(big, big, BIG);
    for (int i = 0; i < NOTHER; i++)
        assert_int_equal(cudaFree(other[i]), cudaSuccess);
    assert_int_equal(cudaFree(big), cudaSuccess);
}

/* A small stream-ordered allocation: its own range, not its slab's. */
static void test_small_async(void **state)
{
    (void)state;
    char *a = NULL, *b = NULL;
    assert_int_equal(cudaMallocAsync((void **)&a, 4096, NULL), cudaSuccess);
    assert_int_equal(cudaMallocAsync((void **)&b, 4096, NULL), cudaSuccess);
    check_device(a + 100, a, 4096);
    check_device(b + 4095, b, 4096);
    assert_int_equal(cudaFreeAsync(a, NULL), cudaSuccess);
    assert_int_equal(cudaFreeAsync(b, NULL), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(NULL), cudaSuccess);
}

/* Pinned host memory and a pointer the driver never saw: its answers. */
static void test_not_regions(void **state)
{
    (void)state;
    void *h = NULL;
    assert_int_equal(cudaMallocHost(&h, 1 << 20), cudaSuccess);
    struct cudaPointerAttributes a;
    assert_int_equal(cudaPointerGetAttributes(&a, (char *)h + 10), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeHost);
    assert_ptr_equal(a.hostPointer, (char *)h + 10);
    assert_int_equal(cudaFreeHost(h), cudaSuccess);

    int local = 0;
    assert_int_equal(cudaPointerGetAttributes(&a, &local), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeUnregistered);
    CUmemorytype type = 0;
    assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           (CUdeviceptr)(uintptr_t)&local),
                     CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr b;
    size_t s;
    assert_int_equal(cuMemGetAddressRange(&b, &s, (CUdeviceptr)(uintptr_t)&local),
                     CUDA_ERROR_NOT_FOUND);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_POINTERS_CONFIGURED")) {
        setenv("E2E_POINTERS_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "96", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "64", 1);
        e2e_reexec(argv);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_region_resident_and_evicted),
        cmocka_unit_test(test_small_async),
        cmocka_unit_test(test_not_regions),
    };
    return cmocka_run_group_tests_name(getenv("STAGEHAND_DISABLE") ? "e2e_pointers (disabled)"
                                                                   : "e2e_pointers (preloaded)",
                                       tests, setup, NULL);
}
