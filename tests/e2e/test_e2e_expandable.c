/* test_e2e_expandable.c — a program that maps its own device memory as
 * PyTorch's caching allocator does with expandable_segments:True: one big
 * VA reservation, then per 20 MiB segment cuMemCreate (POSIX_FD handle type
 * requested, as PyTorch asks), cuMemMap, and cuMemSetAccess over the range
 * just mapped; shrinking unmaps and releases handle by handle. It reaches
 * the driver only through cudaGetDriverEntryPoint (PyTorch 2.4 and later)
 * or dlopen("libcuda.so.1") + dlsym (2.1 to 2.3).
 *
 * On a 64 MB budget, ten segments are three times what fits: under the
 * library they must be evicted and restored, byte-exact, at the addresses
 * the program mapped them at. The segment grows two handles at a time: the
 * handles of one growth are created before any is mapped, and unmapped
 * ones cannot be evicted, so one growth must fit the budget (as one
 * cudaMalloc must). The failure paths: out of memory comes back
 * from cuMemCreate as CUDA_ERROR_OUT_OF_MEMORY (what PyTorch acts on), an
 * unmap of part of a mapping is refused and harms nothing, a handle keeps
 * its bytes across unmap and map elsewhere (evicted or not), an exported
 * IPC handle is refused rather than shared while it may move, and memory
 * on another device passes through. Every check holds with the library
 * disabled too, where the simulated driver does it all.
 *
 * A third run does it all on device 1 with [general] devices = all (device
 * 0 the main one): the segments are device 1's regions, evicted within its
 * own budget, and memory on device 0 is a region of device 0's.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB      ((size_t)1 << 20)
#define SEG      (20 * MiB) /* PyTorch's large-pool segment */
#define SEGWORDS (SEG / 4)
#define NSEG     10 /* 200 MB: three times the 64 MB budget */

static struct {
    __typeof__(cuMemAddressReserve) *reserve;
    __typeof__(cuMemAddressFree) *address_free;
    __typeof__(cuMemCreate) *create;
    __typeof__(cuMemRelease) *release;
    __typeof__(cuMemMap) *map;
    __typeof__(cuMemUnmap) *unmap;
    __typeof__(cuMemSetAccess) *set_access;
    __typeof__(cuMemRetainAllocationHandle) *retain;
    __typeof__(cuMemGetAllocationPropertiesFromHandle) *props;
    __typeof__(cuMemExportToShareableHandle) *export_handle;
} drv;

static int seg_dev; /* the device the segments are on (E2E_EXPANDABLE_DEVICE) */
static int other;   /* and the other one */

/* Under the library, with [regions] manage_program_vmm on (a second run
 * turns it off: every call then goes to the driver). */
static int managed(void)
{
    return !getenv("STAGEHAND_DISABLE") && !getenv("E2E_EXPANDABLE_OFF");
}

/* Both devices managed ([general] devices = all). */
static int every_device(void)
{
    const char *v = getenv("STAGEHAND_GENERAL_DEVICES");
    return managed() && v && !strcmp(v, "all");
}

/* The library's figures for device d (all 0 where it manages none). */
static stagehand_stats_t stats_of(int d)
{
    int (*get)(int, stagehand_stats_t *, size_t) = (int (*)(int, stagehand_stats_t *, size_t))dlsym(
        RTLD_DEFAULT, "stagehand_get_device_stats");
    stagehand_stats_t st = {0};
    if (get && get(d, &st, sizeof st) != 0)
        memset(&st, 0, sizeof st);
    return st;
}

static stagehand_stats_t stats(void)
{
    return stats_of(seg_dev);
}

static int from_stagehand(void *f)
{
    Dl_info info;
    return f && dladdr(f, &info) && info.dli_fname && strstr(info.dli_fname, "libstagehand");
}

static dim3 one = {1, 1, 1};

static uint32_t pattern(uint32_t seed, size_t i)
{
    return seed * 2654435761u + (uint32_t)i * 40503u + 7u;
}

static void k_fill(void **a) /* (words, n, seed) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t seed = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(seed, i);
}

static void k_bump(void **a) /* (words, n) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    for (size_t i = 0; i < n; i++)
        p[i] += 1;
}

static void fill(CUdeviceptr p, size_t words, uint32_t seed)
{
    void *dp = (void *)(uintptr_t)p;
    void *args[] = {&dp, &words, &seed};
    assert_int_equal(cudaLaunchKernel((const void *)k_fill, one, one, args, 0, NULL), cudaSuccess);
}

static void bump(CUdeviceptr p, size_t words)
{
    void *dp = (void *)(uintptr_t)p;
    void *args[] = {&dp, &words};
    assert_int_equal(cudaLaunchKernel((const void *)k_bump, one, one, args, 0, NULL), cudaSuccess);
}

/* The words of [p, p + words) that differ from pattern(seed) + add. */
static size_t wrong_words(CUdeviceptr p, size_t words, uint32_t seed, uint32_t add)
{
    uint32_t *h = malloc(words * 4);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, (void *)(uintptr_t)p, words * 4, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < words; i++)
        bad += h[i] != pattern(seed, i) + add;
    free(h);
    return bad;
}

/* ---- the driver, as PyTorch finds it ---- */

static void *entry(const char *name)
{
    void *f = NULL;
    enum cudaDriverEntryPointQueryResult q;
    assert_int_equal(cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q),
                     cudaSuccess);
    assert_int_equal(q, cudaDriverEntryPointSuccess);
    return f;
}

static void test_lookups_land_on_the_hooks(void **state)
{
    (void)state;
    assert_int_equal(cudaSetDevice(seg_dev), cudaSuccess);
    assert_int_equal(cudaFree(0), cudaSuccess); /* a context, as PyTorch has by then */
    drv.reserve = entry("cuMemAddressReserve");
    drv.address_free = entry("cuMemAddressFree");
    drv.create = entry("cuMemCreate");
    drv.release = entry("cuMemRelease");
    drv.map = entry("cuMemMap");
    drv.set_access = entry("cuMemSetAccess");
    drv.retain = entry("cuMemRetainAllocationHandle");
    drv.props = entry("cuMemGetAllocationPropertiesFromHandle");
    /* PyTorch 2.1-2.3: dlopen the driver and look the rest up there. */
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(cuda);
    drv.unmap = (__typeof__(drv.unmap))dlsym(cuda, "cuMemUnmap");
    drv.export_handle = (__typeof__(drv.export_handle))dlsym(cuda, "cuMemExportToShareableHandle");
    void *const hooked[] = {(void *)drv.address_free, (void *)drv.create,       (void *)drv.release,
                            (void *)drv.map,          (void *)drv.set_access,   (void *)drv.unmap,
                            (void *)drv.props,        (void *)drv.export_handle};
    for (size_t i = 0; i < sizeof hooked / sizeof *hooked; i++)
        assert_true(from_stagehand(hooked[i]));
    assert_false(from_stagehand((void *)drv.reserve)); /* nothing to manage there */
}

/* ---- an expandable segment ---- */

struct segment {
    CUdeviceptr ptr;
    size_t max;
    CUmemGenericAllocationHandle h[32];
};

/* As PyTorch's expandable segments ask: RDMA-capable wherever the card
 * offers it (an H200 does; the simulated card says so too). */
static CUmemAllocationProp device_prop(int dev)
{
    CUmemAllocationProp p = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                             .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                             .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}};
    int rdma = 0;
    assert_int_equal(cuDeviceGetAttribute(
                         &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev),
                     CUDA_SUCCESS);
    p.allocFlags.gpuDirectRDMACapable = rdma != 0;
    return p;
}

static void seg_open(struct segment *s, size_t max)
{
    memset(s, 0, sizeof *s);
    s->max = max;
    assert_int_equal(drv.reserve(&s->ptr, SEG * max, 0, 0, 0), CUDA_SUCCESS);
}

static void set_access(CUdeviceptr p, size_t size, int dev)
{
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(drv.set_access(p, size, &d, 1), CUDA_SUCCESS);
}

/* PyTorch's map(): a handle per segment, then map each, then one access
 * call over the whole range. CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate
 * releases what this call created and is returned. */
static CUresult seg_grow(struct segment *s, size_t begin, size_t end)
{
    CUmemAllocationProp p = device_prop(seg_dev);
    for (size_t i = begin; i < end; i++) {
        CUresult r = drv.create(&s->h[i], SEG, &p, 0);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            for (size_t j = begin; j < i; j++) {
                assert_int_equal(drv.release(s->h[j]), CUDA_SUCCESS);
                s->h[j] = 0;
            }
            return r;
        }
        assert_int_equal(r, CUDA_SUCCESS);
    }
    for (size_t i = begin; i < end; i++)
        assert_int_equal(drv.map(s->ptr + i * SEG, SEG, 0, s->h[i], 0), CUDA_SUCCESS);
    set_access(s->ptr + begin * SEG, (end - begin) * SEG, seg_dev);
    return CUDA_SUCCESS;
}

/* PyTorch's unmapHandles(): synchronise, then unmap and release each. */
static void seg_shrink(struct segment *s, size_t begin, size_t end)
{
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = begin; i < end; i++) {
        assert_int_equal(drv.unmap(s->ptr + i * SEG, SEG), CUDA_SUCCESS);
        assert_int_equal(drv.release(s->h[i]), CUDA_SUCCESS);
        s->h[i] = 0;
    }
}

static void seg_close(struct segment *s)
{
    for (size_t i = 0; i < s->max; i++)
        if (s->h[i])
            seg_shrink(s, i, i + 1);
    assert_int_equal(drv.address_free(s->ptr, SEG * s->max), CUDA_SUCCESS);
}

static void test_segments_are_evicted_byte_exact(void **state)
{
    (void)state;
    stagehand_stats_t before = stats();
    struct segment s;
    seg_open(&s, 15);                    /* PyTorch reserves 1 1/8 of the card */
    for (size_t i = 0; i < NSEG; i += 2) /* grows as it fills: two segments at a time */
        assert_int_equal(seg_grow(&s, i, i + 2), CUDA_SUCCESS);
    for (size_t i = 0; i < NSEG; i++)
        fill(s.ptr + i * SEG, SEGWORDS, (uint32_t)i);
    for (int round = 0; round < 2; round++) /* every segment is needed back, in turn */
        for (size_t i = 0; i < NSEG; i++)
            bump(s.ptr + i * SEG, SEGWORDS);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < NSEG; i++)
        assert_int_equal(wrong_words(s.ptr + i * SEG, SEGWORDS, (uint32_t)i, 2), 0);
    if (managed()) {
        stagehand_stats_t st = stats();
        assert_true(st.evictions - before.evictions >= NSEG);
        assert_true(st.restores - before.restores >= NSEG);
        assert_true(st.device_bytes <= st.budget_bytes);
        assert_int_equal(st.live_bytes - before.live_bytes, NSEG * SEG);
    } else if (!getenv("STAGEHAND_DISABLE")) {
        assert_int_equal(stats().live_bytes, before.live_bytes); /* the driver's alone */
    }
    /* Shrink the middle, grow it back: the rest keeps its bytes. */
    seg_shrink(&s, 3, 7);
    assert_int_equal(seg_grow(&s, 3, 5), CUDA_SUCCESS);
    assert_int_equal(seg_grow(&s, 5, 7), CUDA_SUCCESS);
    for (size_t i = 3; i < 7; i++)
        fill(s.ptr + i * SEG, SEGWORDS, 100u + (uint32_t)i);
    for (size_t i = 0; i < NSEG; i++) {
        int fresh = i >= 3 && i < 7;
        assert_int_equal(wrong_words(s.ptr + i * SEG, SEGWORDS,
                                     fresh ? 100u + (uint32_t)i : (uint32_t)i, fresh ? 0 : 2),
                         0);
    }
    seg_close(&s);
    if (managed())
        assert_int_equal(stats().live_bytes, before.live_bytes);
}

/* ---- failure paths ---- */

static void test_out_of_memory_is_an_error_code(void **state)
{
    (void)state;
    CUmemAllocationProp p = device_prop(seg_dev);
    CUmemGenericAllocationHandle h = 0;
    /* Larger than the card (and the budget): refused at once. */
    assert_int_equal(drv.create(&h, 512 * MiB, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* Grow a segment until the device and the host side are both full, as
     * PyTorch does, filling each piece: every byte survives the refusal. */
    struct segment s;
    seg_open(&s, 32);
    size_t n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < s.max && (r = seg_grow(&s, n, n + 1)) == CUDA_SUCCESS) {
        fill(s.ptr + n * SEG, SEGWORDS, 500u + (uint32_t)n);
        n++;
    }
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_true(n >= 3);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(wrong_words(s.ptr + i * SEG, SEGWORDS, 500u + (uint32_t)i, 0), 0);
    /* Freeing some lets the next request through, as PyTorch's retry expects. */
    seg_shrink(&s, n - 2, n);
    assert_int_equal(seg_grow(&s, n - 2, n - 1), CUDA_SUCCESS);
    seg_close(&s);
}

static void test_partial_unmap_is_refused(void **state)
{
    (void)state;
    struct segment s;
    seg_open(&s, 4);
    assert_int_equal(seg_grow(&s, 0, 3), CUDA_SUCCESS);
    for (size_t i = 0; i < 3; i++)
        fill(s.ptr + i * SEG, SEGWORDS, 900u + (uint32_t)i);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    /* Half a mapping, a range starting inside one, a range past the end. */
    assert_int_equal(drv.unmap(s.ptr, SEG / 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(drv.unmap(s.ptr + SEG / 2, SEG), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(drv.unmap(s.ptr + 2 * SEG, 2 * SEG), CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(wrong_words(s.ptr + i * SEG, SEGWORDS, 900u + (uint32_t)i, 0), 0);
    /* Two whole mappings in one call are fine; the third stays. */
    assert_int_equal(drv.unmap(s.ptr, 2 * SEG), CUDA_SUCCESS);
    assert_int_equal(drv.release(s.h[0]), CUDA_SUCCESS);
    assert_int_equal(drv.release(s.h[1]), CUDA_SUCCESS);
    assert_int_equal(drv.release(s.h[1]), CUDA_ERROR_INVALID_VALUE); /* released twice */
    s.h[0] = s.h[1] = 0;
    assert_int_equal(wrong_words(s.ptr + 2 * SEG, SEGWORDS, 902u, 0), 0);
    /* A reservation with a mapping in it cannot go. */
    assert_int_equal(drv.address_free(s.ptr, SEG * s.max), CUDA_ERROR_INVALID_VALUE);
    seg_close(&s);
}

/* A handle holds its memory: unmapped (after being evicted, or not) and
 * mapped at another address, it has the same bytes. A handle released
 * while mapped lives until its unmap; one retained through its address is
 * the same handle. */
static void test_handle_keeps_its_bytes(void **state)
{
    (void)state;
    struct segment a, b, big;
    seg_open(&a, 2);
    seg_open(&b, 2);
    assert_int_equal(seg_grow(&a, 0, 2), CUDA_SUCCESS);
    fill(a.ptr, SEGWORDS, 41);
    fill(a.ptr + SEG, SEGWORDS, 42);
    /* Push the first out: eight more segments used after it. */
    seg_open(&big, 8);
    for (size_t i = 0; i < 8; i += 2) {
        assert_int_equal(seg_grow(&big, i, i + 2), CUDA_SUCCESS);
        fill(big.ptr + i * SEG, SEGWORDS, 7);
        fill(big.ptr + (i + 1) * SEG, SEGWORDS, 7);
    }
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    CUmemGenericAllocationHandle again = 0;
    assert_int_equal(drv.retain(&again, (void *)(uintptr_t)(a.ptr + SEG / 2)), CUDA_SUCCESS);
    assert_true(again == a.h[0]);
    assert_int_equal(drv.release(again), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(drv.unmap(a.ptr + (size_t)i * SEG, SEG), CUDA_SUCCESS);
        assert_int_equal(drv.map(b.ptr + (size_t)(1 - i) * SEG, SEG, 0, a.h[i], 0), CUDA_SUCCESS);
    }
    set_access(b.ptr, 2 * SEG, seg_dev);
    b.h[1] = a.h[0];
    b.h[0] = a.h[1];
    a.h[0] = a.h[1] = 0;
    assert_int_equal(wrong_words(b.ptr + SEG, SEGWORDS, 41, 0), 0);
    assert_int_equal(wrong_words(b.ptr, SEGWORDS, 42, 0), 0);
    /* Released while mapped: still usable until unmapped. */
    assert_int_equal(drv.release(b.h[0]), CUDA_SUCCESS);
    b.h[0] = 0;
    bump(b.ptr, SEGWORDS);
    assert_int_equal(wrong_words(b.ptr, SEGWORDS, 42, 1), 0);
    assert_int_equal(drv.unmap(b.ptr, SEG), CUDA_SUCCESS);
    seg_close(&big);
    seg_close(&b);
    seg_close(&a);
}

/* PyTorch requests POSIX_FD handles for IPC. Exporting one would give
 * another process pages the library may move: refused under the library,
 * the memory untouched. */
static void test_ipc_handle(void **state)
{
    (void)state;
    struct segment s;
    seg_open(&s, 1);
    assert_int_equal(seg_grow(&s, 0, 1), CUDA_SUCCESS);
    fill(s.ptr, SEGWORDS, 77);
    CUmemAllocationProp got;
    assert_int_equal(drv.props(&got, s.h[0]), CUDA_SUCCESS);
    assert_int_equal(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(got.location.id, seg_dev);
    int fd = -1;
    CUresult r = drv.export_handle(&fd, s.h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (managed()) {
        assert_int_equal(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        /* Asked for, but the pool's chunks are not RDMA-capable: said so. */
        assert_int_equal(got.allocFlags.gpuDirectRDMACapable, 0);
        assert_int_equal(r, CUDA_ERROR_NOT_SUPPORTED);
    }
    assert_int_equal(wrong_words(s.ptr, SEGWORDS, 77, 0), 0);
    seg_close(&s);
}

/* Memory on a device not managed is the driver's; on another managed
 * device it is that device's region. A peer device given
 * access to a managed segment pins it in place. */
static void test_what_passes_through(void **state)
{
    (void)state;
    stagehand_stats_t before = stats(), before_other = stats_of(other);
    CUmemAllocationProp p1 = device_prop(other);
    CUmemGenericAllocationHandle h1 = 0;
    assert_int_equal(drv.create(&h1, SEG, &p1, 0), CUDA_SUCCESS);
    struct segment s;
    seg_open(&s, 2);
    assert_int_equal(drv.map(s.ptr, SEG, 0, h1, 0), CUDA_SUCCESS);
    set_access(s.ptr, SEG, other);
    if (managed()) {
        assert_int_equal(stats().live_bytes, before.live_bytes); /* not this device's */
        assert_int_equal(stats_of(other).live_bytes,
                         before_other.live_bytes + (every_device() ? SEG : 0));
        assert_int_equal(stats_of(other).regions_pinned, before_other.regions_pinned);
    }
    assert_int_equal(drv.unmap(s.ptr, SEG), CUDA_SUCCESS);
    assert_int_equal(drv.release(h1), CUDA_SUCCESS);
    if (managed())
        assert_int_equal(stats_of(other).live_bytes, before_other.live_bytes);

    assert_int_equal(seg_grow(&s, 1, 2), CUDA_SUCCESS);
    fill(s.ptr + SEG, SEGWORDS, 5);
    set_access(s.ptr + SEG, SEG, other);
    if (managed())
        assert_int_equal(stats().regions_pinned, before.regions_pinned + 1);
    assert_int_equal(wrong_words(s.ptr + SEG, SEGWORDS, 5, 0), 0);
    seg_close(&s);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_EXPANDABLE_CONFIGURED")) {
        setenv("E2E_EXPANDABLE_CONFIGURED", "1", 1);
        setenv("SIMCUDA_DEVICES", "2", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        setenv("STAGEHAND_BUDGET_HOST_RAM_BUDGET_MB", "256", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "64", 1);
        e2e_reexec(argv);
        return 1;
    }
    seg_dev = getenv("E2E_EXPANDABLE_DEVICE") ? atoi(getenv("E2E_EXPANDABLE_DEVICE")) : 0;
    other = 1 - seg_dev;
    size_t fill_sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    if (simcuda_register_kernel(k_fill, "fill", 3, fill_sizes, 0) != 0 ||
        simcuda_register_kernel(k_bump, "bump", 2, fill_sizes, 0) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups_land_on_the_hooks),
        cmocka_unit_test(test_segments_are_evicted_byte_exact),
        cmocka_unit_test(test_out_of_memory_is_an_error_code),
        cmocka_unit_test(test_partial_unmap_is_refused),
        cmocka_unit_test(test_handle_keeps_its_bytes),
        cmocka_unit_test(test_ipc_handle),
        cmocka_unit_test(test_what_passes_through),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (!failed && managed() && seg_dev == 0) {
        static const char *const off[] = {"E2E_EXPANDABLE_OFF=1",
                                          "STAGEHAND_REGIONS_MANAGE_PROGRAM_VMM=false", NULL};
        static const char *const all[] = {"E2E_EXPANDABLE_DEVICE=1",
                                          "STAGEHAND_GENERAL_DEVICES=all",
                                          "STAGEHAND_GENERAL_DEVICE=0", NULL};
        failed = e2e_rerun(argv, off) != 0 || e2e_rerun(argv, all) != 0;
    }
    return failed;
}
