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

static void k_touch(void **a) /* reads its region: a use, no change */
{
    volatile uint32_t *p = *(uint32_t **)a[0];
    (void)p[0];
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

/* Allocates and uses n more regions of OTHER bytes, set to v: the oldest
 * unpinned regions go to the host. */
static void pressure(void **r, int n, int v)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(cudaMalloc(&r[i], OTHER), cudaSuccess);
        assert_int_equal(cudaMemset(r[i], v, OTHER), cudaSuccess);
        touch(r[i]);
    }
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

static void release_all(void **r, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(cudaFree(r[i]), cudaSuccess);
}

/* The library's count of pinned regions (stagehand_get_stats). */
static uint64_t pinned_count(void)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    stagehand_stats_t st = {0};
    assert_non_null(get);
    assert_int_equal(get(&st, sizeof st), 0);
    return st.regions_pinned;
}

static int all_bytes(const void *d, size_t n, unsigned char v)
{
    unsigned char *h = malloc(n);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t i = 0;
    while (i < n && h[i] == v)
        i++;
    free(h);
    return i == n;
}

/* A handle retained through a region's address (what NCCL exports to its
 * peers) holds the device's pages: an evicted region is brought back
 * first, a retained one never moves again, and once freed its pages are
 * never another allocation's: the peer's mapping still reads what it had. */
static void test_retained_regions_pinned(void **state)
{
    (void)state;
    if (!residency || getenv("STAGEHAND_DISABLE"))
        skip(); /* cudaMalloc memory is not VMM memory: nothing to retain */
    void *a = NULL, *b = NULL, *r1[NOTHER], *r2[NOTHER];
    assert_int_equal(cudaMalloc(&a, OTHER), cudaSuccess);
    assert_int_equal(cudaMemset(a, 0x5a, OTHER), cudaSuccess);
    pressure(r1, NOTHER, 0x11);
    int k = 0;
    while (k < NOTHER && residency(r1[k]) != 0)
        k++;
    assert_true(k < NOTHER); /* one of them went to the host: b */
    b = r1[k];
    CUmemGenericAllocationHandle ha = 0, hb = 0;
    assert_int_equal(cuMemRetainAllocationHandle(&hb, b), CUDA_SUCCESS);
    assert_int_equal(residency(b), 1);
    CUmemAllocationProp prop;
    assert_int_equal(cuMemGetAllocationPropertiesFromHandle(&prop, hb), CUDA_SUCCESS);
    assert_int_equal(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(cuMemRetainAllocationHandle(&ha, a), CUDA_SUCCESS);
    assert_int_equal(residency(a), 1);
    assert_int_equal(pinned_count(), 2);
    r1[k] = r1[NOTHER - 1];
    release_all(r1, NOTHER - 1);
    pressure(r2, NOTHER, 2);
    assert_int_equal(residency(a), 1);
    assert_int_equal(residency(b), 1);
    int moved = 0; /* the others still move */
    for (int i = 0; i < NOTHER; i++)
        moved += residency(r2[i]) == 0;
    assert_true(moved > 0);
    assert_true(all_bytes(b, OTHER, 0x11));
    /* a is freed while the peer holds its pages; new allocations take its size. */
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(pinned_count(), 1); /* a's pages left with it */
    release_all(r2, NOTHER);
    pressure(r1, NOTHER, 0x77);
    CUdeviceptr peer = 0;
    assert_int_equal(cuMemAddressReserve(&peer, OTHER, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(peer, OTHER, 0, ha, 0), CUDA_SUCCESS);
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(cuMemSetAccess(peer, OTHER, &d, 1), CUDA_SUCCESS);
    assert_true(all_bytes((void *)(uintptr_t)peer, OTHER, 0x5a));
    assert_int_equal(cuMemUnmap(peer, OTHER), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(peer, OTHER), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(ha), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(hb), CUDA_SUCCESS);
    release_all(r1, NOTHER);
    assert_int_equal(cudaFree(b), cudaSuccess);
}

/* Legacy IPC cannot export VMM memory: a region is refused, as the driver
 * refuses it, and the message says what to do instead. */
static void test_ipc(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, OTHER), cudaSuccess);
    cudaIpcMemHandle_t h;
    cudaError_t want =
        residency && !getenv("STAGEHAND_DISABLE") ? cudaErrorInvalidValue : cudaSuccess;
    assert_int_equal(cudaIpcGetMemHandle(&h, p), want);
    assert_int_equal(cudaFree(p), cudaSuccess);
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
        cmocka_unit_test(test_retained_regions_pinned),
        cmocka_unit_test(test_ipc),
    };
    return cmocka_run_group_tests_name(getenv("STAGEHAND_DISABLE") ? "e2e_pointers (disabled)"
                                                                   : "e2e_pointers (preloaded)",
                                       tests, setup, NULL);
}
