/* test_sim_vmm.c — virtual memory management on the simulated GPU:
 * granularity, reservations, physical handles (device, host NUMA, host),
 * mappings, access, unmapping and release, every misuse code, and one handle
 * mapped at two addresses.
 *
 * Mappings are real: the protection of every range is read back from
 * /proc/self/maps, and whether the process can read or write a byte is probed
 * with system calls (EFAULT), never by touching it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

#define MiB  (1024ull * 1024)
#define GRAN (2 * MiB)

/* ---- probes ---- */

/* The permission string ("rw-s", "---p", ...) of the mapping holding addr;
 * "" if nothing is mapped there. */
static void perms_at(uintptr_t addr, char out[5])
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char p[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, p) == 3 && addr >= lo && addr < hi) {
            memcpy(out, p, 5);
            break;
        }
    }
    fclose(f);
}

static void assert_perms(uintptr_t addr, const char *want)
{
    char p[5];
    perms_at(addr, p);
    if (strcmp(p, want) != 0)
        print_error("0x%lx: perms '%s', want '%s'\n", (unsigned long)addr, p, want);
    assert_string_equal(p, want);
}

static int probe_pipe[2] = {-1, -1};

/* Whether this process can read the byte at addr. */
static bool can_read(uintptr_t addr)
{
    if (probe_pipe[0] < 0)
        assert_int_equal(pipe(probe_pipe), 0);
    ssize_t n = write(probe_pipe[1], (const void *)addr, 1);
    if (n == 1) {
        char c;
        assert_int_equal(read(probe_pipe[0], &c, 1), 1);
        return true;
    }
    assert_int_equal(errno, EFAULT);
    return false;
}

/* Whether this process can write the byte at addr (it writes back what is there). */
static bool can_write(uintptr_t addr)
{
    if (!can_read(addr))
        return false;
    assert_int_equal(write(probe_pipe[1], (const void *)addr, 1), 1);
    ssize_t n = read(probe_pipe[0], (void *)addr, 1);
    if (n == 1)
        return true;
    assert_int_equal(errno, EFAULT);
    char c;
    assert_int_equal(read(probe_pipe[0], &c, 1), 1);
    return false;
}

/* ---- helpers ---- */

static CUcontext ctx;

/* (uint8_t *dst, uint8_t value, size_t n): memset */
static void k_fill(void **args)
{
    memset(*(void **)args[0], *(uint8_t *)args[1], *(size_t *)args[2]);
}

static void need_ctx(void)
{
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    if (!ctx) {
        assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        const size_t sizes[] = {sizeof(void *), 1, sizeof(size_t)};
        assert_int_equal(simcuda_register_kernel(k_fill, "k_fill", 3, sizes, 1), 0);
    }
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

static CUmemAllocationProp prop_of(CUmemLocationType type, int id)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = type;
    p.location.id = id;
    return p;
}

static CUmemGenericAllocationHandle create(CUmemLocationType type, size_t size)
{
    CUmemAllocationProp p = prop_of(type, 0);
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(cuMemCreate(&h, size, &p, 0), CUDA_SUCCESS);
    assert_true(h != 0);
    return h;
}

static CUdeviceptr reserve(size_t size)
{
    CUdeviceptr va = 0;
    assert_int_equal(cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
    assert_true(va != 0);
    assert_int_equal(va % GRAN, 0);
    return va;
}

static CUresult set_access(CUdeviceptr va, size_t size, CUmemAccess_flags flags)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = flags;
    return cuMemSetAccess(va, size, &d, 1);
}

static unsigned long long get_access(CUdeviceptr va)
{
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    unsigned long long flags = 0xdead;
    assert_int_equal(cuMemGetAccess(&flags, &loc, va), CUDA_SUCCESS);
    return flags;
}

static void launch_fill(CUdeviceptr dst, uint8_t value, size_t n)
{
    void *p = (void *)(uintptr_t)dst;
    void *args[] = {&p, &value, &n};
    assert_int_equal(
        cuLaunchKernel(simcuda_function(k_fill), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL),
        CUDA_SUCCESS);
}

static size_t dev_in_use(void)
{
    simcuda_stats_t s;
    simcuda_get_stats(&s);
    return s.device_bytes_in_use;
}

static size_t host_in_use(void)
{
    simcuda_stats_t s;
    simcuda_get_stats(&s);
    return s.host_bytes_in_use;
}

/* ---- granularity ---- */

static void granularity(void **state)
{
    (void)state;
    need_ctx();
    static const CUmemLocationType types[] = {
        CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_MEM_LOCATION_TYPE_HOST};
    for (size_t i = 0; i < 3; i++) {
        CUmemAllocationProp p = prop_of(types[i], 0);
        size_t g = 0;
        assert_int_equal(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                         CUDA_SUCCESS);
        assert_int_equal(g, GRAN);
        g = 0;
        assert_int_equal(
            cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            CUDA_SUCCESS);
        assert_int_equal(g, GRAN);
    }
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    size_t g = 7;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, (CUmemAllocationGranularity_flags)2),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAllocationGranularity(NULL, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);
    p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE, 1);
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_DEVICE);
    p = prop_of(CU_MEM_LOCATION_TYPE_INVALID, 0);
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(g, 7);
}

/* ---- reservations ---- */

static void reserve_and_free(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(4 * GRAN);
    /* A reservation is address space only. */
    assert_perms(va, "---p");
    assert_perms(va + 4 * GRAN - 1, "---p");
    assert_false(can_read(va));
    assert_false(can_read(va + 3 * GRAN));
    unsigned long long flags = 0;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    assert_int_equal(cuMemGetAccess(&flags, &loc, va), CUDA_ERROR_INVALID_VALUE);

    /* Frees must name the reservation exactly. */
    assert_int_equal(cuMemAddressFree(va, 2 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressFree(va + GRAN, 3 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressFree(va, 8 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressFree(va, 4 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 4 * GRAN), CUDA_ERROR_INVALID_VALUE);

    /* The address is a hint the simulator honours when it is free. */
    CUdeviceptr again = 0;
    assert_int_equal(cuMemAddressReserve(&again, 4 * GRAN, 0, va, 0), CUDA_SUCCESS);
    assert_int_equal(again, va);
    assert_int_equal(cuMemAddressFree(again, 4 * GRAN), CUDA_SUCCESS);

    /* Alignment. */
    CUdeviceptr al = 0;
    assert_int_equal(cuMemAddressReserve(&al, GRAN, 16 * GRAN, 0, 0), CUDA_SUCCESS);
    assert_int_equal(al % (16 * GRAN), 0);
    assert_perms(al, "---p");
    assert_int_equal(cuMemAddressFree(al, GRAN), CUDA_SUCCESS);
}

static void reserve_errors(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = 0;
    assert_int_equal(cuMemAddressReserve(&va, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&va, GRAN + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&va, GRAN, 3 * GRAN, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&va, GRAN, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(NULL, GRAN, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(va, 0);
    assert_int_equal(cuMemAddressFree(0x1000, GRAN), CUDA_ERROR_INVALID_VALUE);
}

/* cuda.h, cuMemAddressReserve: "The size and address parameters must be a
 * multiple of the host page size". */
static void reserve_accepts_a_host_page_multiple(void **state)
{
    (void)state;
    need_ctx();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    CUdeviceptr va = 0;
    assert_int_equal(cuMemAddressReserve(&va, 16 * page, 0, 0, 0), CUDA_SUCCESS);
    assert_true(va != 0);
    assert_int_equal(cuMemAddressFree(va, 16 * page), CUDA_SUCCESS);
}

/* ---- physical handles ---- */

static void create_each_location_and_release(void **state)
{
    (void)state;
    need_ctx();
    size_t dev0 = dev_in_use(), host0 = host_in_use();

    CUmemGenericAllocationHandle d = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);
    assert_int_equal(dev_in_use(), dev0 + 2 * GRAN);
    assert_int_equal(host_in_use(), host0);

    CUmemGenericAllocationHandle n = create(CU_MEM_LOCATION_TYPE_HOST_NUMA, GRAN);
    assert_int_equal(dev_in_use(), dev0 + 2 * GRAN);
    assert_int_equal(host_in_use(), host0 + GRAN);

    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_HOST, 3 * GRAN);
    assert_int_equal(dev_in_use(), dev0 + 2 * GRAN);
    assert_int_equal(host_in_use(), host0 + 4 * GRAN);
    assert_true(d != n && n != h && d != h);

    size_t free0 = 0, total = 0;
    assert_int_equal(cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
    assert_int_equal(total - free0, dev_in_use());

    assert_int_equal(cuMemRelease(d), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), dev0);
    assert_int_equal(cuMemRelease(n), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(host_in_use(), host0);

    /* Released handles are gone. */
    assert_int_equal(cuMemRelease(d), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemRelease(0x7fffffff), CUDA_ERROR_INVALID_VALUE);
}

static void create_errors(void **state)
{
    (void)state;
    need_ctx();
    size_t dev0 = dev_in_use(), host0 = host_in_use();
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    assert_int_equal(cuMemCreate(&h, GRAN + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, GRAN / 2, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, GRAN, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(NULL, GRAN, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = prop_of(CU_MEM_LOCATION_TYPE_DEVICE, 1);
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_ERROR_INVALID_DEVICE);
    p = prop_of(CU_MEM_LOCATION_TYPE_INVALID, 0);
    assert_int_equal(cuMemCreate(&h, GRAN, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = prop_of(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
    assert_int_equal(cuMemCreate(&h, GRAN + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = prop_of(CU_MEM_LOCATION_TYPE_HOST, 0);
    assert_int_equal(cuMemCreate(&h, 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(h, 0);
    assert_int_equal(dev_in_use(), dev0);
    assert_int_equal(host_in_use(), host0);
}

/* cuda.h, cuMemCreate: "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as
 * the CUmemLocation::type will result in CUDA_ERROR_INVALID_VALUE." */
static void create_host_numa_current_is_invalid_value(void **state)
{
    (void)state;
    need_ctx();
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0);
    CUresult r = cuMemCreate(&h, GRAN, &p, 0);
    if (r == CUDA_SUCCESS)
        cuMemRelease(h);
    assert_int_equal(r, CUDA_ERROR_INVALID_VALUE);
}

/* cuda.h, cuMemCreate: "HOST allocations are not IPC capable and
 * CUmemAllocationProp::requestedHandleTypes must be 0, any other value will
 * result in CUDA_ERROR_INVALID_VALUE." */
static void create_host_with_handle_types_is_invalid_value(void **state)
{
    (void)state;
    need_ctx();
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = prop_of(CU_MEM_LOCATION_TYPE_HOST, 0);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUresult r = cuMemCreate(&h, GRAN, &p, 0);
    if (r == CUDA_SUCCESS)
        cuMemRelease(h);
    assert_int_equal(r, CUDA_ERROR_INVALID_VALUE);
}

/* ---- mapping, access, unmapping ---- */

static void map_then_access_then_unmap(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(2 * GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);

    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    /* Mapped, but not accessible until cuMemSetAccess. */
    assert_perms(va, "---s");
    assert_perms(va + 2 * GRAN - 1, "---s");
    assert_false(can_read(va));
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_NONE);

    assert_int_equal(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    assert_perms(va, "rw-s");
    assert_perms(va + 2 * GRAN - 1, "rw-s");
    assert_true(can_write(va));
    assert_true(can_write(va + 2 * GRAN - 1));
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(get_access(va + GRAN + 5), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    /* The device can use it. */
    launch_fill(va + 100, 0x5a, 3 * 4096);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    uint8_t buf[3 * 4096 + 2];
    assert_int_equal(cuMemcpyDtoH(buf, va + 99, sizeof buf), CUDA_SUCCESS);
    assert_int_equal(buf[0], 0);
    for (size_t i = 1; i <= 3 * 4096; i++)
        assert_int_equal(buf[i], 0x5a);
    assert_int_equal(buf[3 * 4096 + 1], 0);

    assert_int_equal(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READ), CUDA_SUCCESS);
    assert_perms(va, "r--s");
    assert_true(can_read(va));
    assert_false(can_write(va));
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_READ);

    assert_int_equal(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_NONE), CUDA_SUCCESS);
    assert_perms(va, "---s");
    assert_false(can_read(va));
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_NONE);

    /* Unmapping turns the range back into a bare reservation. */
    assert_int_equal(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(va, 2 * GRAN), CUDA_SUCCESS);
    assert_perms(va, "---p");
    assert_perms(va + 2 * GRAN - 1, "---p");
    assert_false(can_read(va));
    unsigned long long flags = 0;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    assert_int_equal(cuMemGetAccess(&flags, &loc, va), CUDA_ERROR_INVALID_VALUE);

    /* A new mapping starts without access, and keeps the handle's bytes. */
    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_perms(va, "---s");
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    assert_int_equal(((uint8_t *)(uintptr_t)va)[100], 0x5a);
    assert_int_equal(((uint8_t *)(uintptr_t)va)[99], 0);

    assert_int_equal(cuMemUnmap(va, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 2 * GRAN), CUDA_SUCCESS);
}

static void map_errors(void **state)
{
    (void)state;
    need_ctx();
    size_t dev0 = dev_in_use();
    CUdeviceptr va = reserve(4 * GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);
    CUmemGenericAllocationHandle h2 = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);

    assert_int_equal(cuMemMap(va, 2 * GRAN, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE); /* offset */
    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h, 1), CUDA_ERROR_INVALID_VALUE);    /* flags */
    assert_int_equal(cuMemMap(va, GRAN + 4096, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va, 0, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va + 4096, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va, 4 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* > handle */
    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, 0x7fffffff, 0), CUDA_ERROR_INVALID_VALUE);
    /* Outside a reservation, or running past its end. */
    assert_int_equal(cuMemMap(va + 4 * GRAN, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va + 3 * GRAN, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr dptr = 0;
    assert_int_equal(cuMemAlloc(&dptr, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(dptr & ~(CUdeviceptr)(GRAN - 1), GRAN, 0, h, 0),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(dptr), CUDA_SUCCESS);
    /* Nothing was mapped by the refused calls. */
    assert_perms(va, "---p");
    assert_perms(va + 3 * GRAN, "---p");

    /* Over a mapped range, whole or in part. */
    assert_int_equal(cuMemMap(va + GRAN, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va + GRAN, 2 * GRAN, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va + 2 * GRAN, 2 * GRAN, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(va + GRAN, GRAN, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    assert_perms(va, "---p");
    assert_perms(va + 3 * GRAN, "---p");
    /* A handle maps whole or not at all, as an H200 answers (driver 580):
     * part of one, at offset 0 too, is not supported. */
    assert_int_equal(cuMemMap(va, GRAN, 0, h2, 0), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(cuMemMap(va + 3 * GRAN, GRAN, 0, h2, 0), CUDA_ERROR_NOT_SUPPORTED);
    CUmemGenericAllocationHandle hh = create(CU_MEM_LOCATION_TYPE_HOST_NUMA, 2 * GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, hh, 0), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(cuMemRelease(hh), CUDA_SUCCESS);
    assert_perms(va, "---p");
    /* The free neighbours are still usable. */
    CUmemGenericAllocationHandle h3 = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    CUmemGenericAllocationHandle h4 = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, h3, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va + 3 * GRAN, GRAN, 0, h4, 0), CUDA_SUCCESS);

    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(va + GRAN, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(va + 3 * GRAN, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h3), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h4), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 4 * GRAN), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), dev0);
}

static void unmap_errors(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(4 * GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);
    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);

    /* Part of a mapping: its first half, its second half. */
    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(va + GRAN, GRAN), CUDA_ERROR_INVALID_VALUE);
    /* More than the mapping, or nothing mapped at all. */
    assert_int_equal(cuMemUnmap(va, 3 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(va + 2 * GRAN, GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(va + 2 * GRAN, 2 * GRAN), CUDA_ERROR_INVALID_VALUE);
    /* Malformed. */
    assert_int_equal(cuMemUnmap(va, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(va + 4096, 2 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(va, 2 * GRAN + 4096), CUDA_ERROR_INVALID_VALUE);
    /* All refused: the mapping is intact. */
    assert_perms(va, "rw-s");
    assert_perms(va + 2 * GRAN - 1, "rw-s");
    assert_perms(va + 2 * GRAN, "---p");

    assert_int_equal(cuMemUnmap(va, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(va, 2 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 4 * GRAN), CUDA_SUCCESS);
}

static void access_errors(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(4 * GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);
    assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);

    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    /* Not (entirely) mapped. */
    assert_int_equal(cuMemSetAccess(va, 3 * GRAN, &d, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(va + 2 * GRAN, GRAN, &d, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(va + 4 * GRAN, GRAN, &d, 1), CUDA_ERROR_INVALID_VALUE);
    /* Malformed. */
    assert_int_equal(cuMemSetAccess(va, 2 * GRAN, &d, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(va, 2 * GRAN, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(va, 0, &d, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(va + 4096, GRAN, &d, 1), CUDA_ERROR_INVALID_VALUE);
    d.location.id = 1;
    assert_int_equal(cuMemSetAccess(va, 2 * GRAN, &d, 1), CUDA_ERROR_INVALID_DEVICE);
    d.location.id = 0;
    d.location.type = CU_MEM_LOCATION_TYPE_INVALID;
    assert_int_equal(cuMemSetAccess(va, 2 * GRAN, &d, 1), CUDA_ERROR_INVALID_VALUE);
    assert_perms(va, "---s");
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_NONE);

    unsigned long long flags = 0;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    assert_int_equal(cuMemGetAccess(&flags, &loc, va + 2 * GRAN), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAccess(NULL, &loc, va), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAccess(&flags, NULL, va), CUDA_ERROR_INVALID_VALUE);
    loc.id = 1;
    assert_int_equal(cuMemGetAccess(&flags, &loc, va), CUDA_ERROR_INVALID_DEVICE);

    assert_int_equal(cuMemUnmap(va, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 4 * GRAN), CUDA_SUCCESS);
}

/* ---- release while mapped ---- */

static void release_of_a_mapped_handle_waits_for_the_unmap(void **state)
{
    (void)state;
    need_ctx();
    size_t dev0 = dev_in_use();
    CUdeviceptr va = reserve(GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    launch_fill(va, 0xc3, GRAN);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);

    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    /* The memory lives on behind its mapping. */
    assert_int_equal(dev_in_use(), dev0 + GRAN);
    assert_perms(va, "rw-s");
    launch_fill(va + GRAN - 16, 0x3c, 16);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    uint8_t buf[32];
    assert_int_equal(cuMemcpyDtoH(buf, va + GRAN - 32, 32), CUDA_SUCCESS);
    for (int i = 0; i < 16; i++) {
        assert_int_equal(buf[i], 0xc3);
        assert_int_equal(buf[16 + i], 0x3c);
    }
    /* But the handle itself is gone. */
    assert_int_equal(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr va2 = reserve(GRAN);
    assert_int_equal(cuMemMap(va2, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), dev0);
    assert_int_equal(cuMemAddressFree(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va2, GRAN), CUDA_SUCCESS);
}

/* ---- one handle, two addresses ---- */

static void one_handle_mapped_twice_shares_its_bytes(void **state)
{
    (void)state;
    need_ctx();
    size_t dev0 = dev_in_use();
    CUdeviceptr a = reserve(2 * GRAN), b = reserve(2 * GRAN);
    assert_true(a != b);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);
    assert_int_equal(cuMemMap(a, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(b, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), dev0 + 2 * GRAN); /* one allocation */
    assert_int_equal(set_access(a, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    /* Access is per mapping. */
    assert_perms(b, "---s");
    assert_int_equal(set_access(b, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);

    /* A kernel writes through a; a copy reads through b. */
    launch_fill(a + GRAN - 8, 0x77, 16);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    uint8_t buf[24];
    assert_int_equal(cuMemcpyDtoH(buf, b + GRAN - 12, sizeof buf), CUDA_SUCCESS);
    for (int i = 0; i < 24; i++)
        assert_int_equal(buf[i], i >= 4 && i < 20 ? 0x77 : 0);
    /* And the other way round, by copy. */
    static const char msg[] = "written through b";
    assert_int_equal(cuMemcpyHtoD(b + 12345, msg, sizeof msg), CUDA_SUCCESS);
    char back[sizeof msg];
    assert_int_equal(cuMemcpyDtoH(back, a + 12345, sizeof msg), CUDA_SUCCESS);
    assert_memory_equal(back, msg, sizeof msg);
    assert_memory_equal((const void *)(uintptr_t)(a + 12345), msg, sizeof msg);

    /* Unmapping one view leaves the other, with its bytes. */
    assert_int_equal(cuMemUnmap(a, 2 * GRAN), CUDA_SUCCESS);
    assert_perms(a, "---p");
    assert_perms(b, "rw-s");
    assert_memory_equal((const void *)(uintptr_t)(b + 12345), msg, sizeof msg);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), dev0 + 2 * GRAN);
    assert_memory_equal((const void *)(uintptr_t)(b + 12345), msg, sizeof msg);
    assert_int_equal(cuMemUnmap(b, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), dev0);
    assert_int_equal(cuMemAddressFree(a, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(b, 2 * GRAN), CUDA_SUCCESS);
}

/* ---- several handles in one reservation ---- */

static void adjacent_mappings_take_one_access_call(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(3 * GRAN);
    CUmemGenericAllocationHandle h1 = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    CUmemGenericAllocationHandle h2 = create(CU_MEM_LOCATION_TYPE_DEVICE, 2 * GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, h1, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va + GRAN, 2 * GRAN, 0, h2, 0), CUDA_SUCCESS);
    assert_int_equal(set_access(va, 3 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    assert_perms(va, "rw-s");
    assert_perms(va + 3 * GRAN - 1, "rw-s");
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(get_access(va + GRAN), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    /* A kernel writes across the boundary of the two handles (new memory
     * holds whatever it held: clear it first, as on a GPU). */
    launch_fill(va, 0, 3 * GRAN);
    launch_fill(va + GRAN - 64, 0xee, 128);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    const uint8_t *p = (const uint8_t *)(uintptr_t)va;
    assert_int_equal(p[GRAN - 65], 0);
    assert_int_equal(p[GRAN - 64], 0xee);
    assert_int_equal(p[GRAN + 63], 0xee);
    assert_int_equal(p[GRAN + 64], 0);

    /* Each mapping is unmapped on its own; the other keeps its bytes. */
    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_SUCCESS);
    assert_perms(va, "---p");
    assert_perms(va + GRAN, "rw-s");
    assert_int_equal(p[GRAN], 0xee);
    assert_int_equal(cuMemUnmap(va + GRAN, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h1), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 3 * GRAN), CUDA_SUCCESS);
}

/* ---- host-located handles ---- */

static void host_located_handles_count_as_host_in_copies(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr dv = reserve(GRAN), hv = reserve(GRAN), nv = reserve(GRAN);
    CUmemGenericAllocationHandle dh = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    CUmemGenericAllocationHandle hh = create(CU_MEM_LOCATION_TYPE_HOST, GRAN);
    CUmemGenericAllocationHandle nh = create(CU_MEM_LOCATION_TYPE_HOST_NUMA, GRAN);
    assert_int_equal(cuMemMap(dv, GRAN, 0, dh, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(hv, GRAN, 0, hh, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(nv, GRAN, 0, nh, 0), CUDA_SUCCESS);
    /* Host-located memory gets its access from a host location too. */
    CUmemAccessDesc d[2];
    memset(d, 0, sizeof d);
    d[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    d[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    assert_int_equal(cuMemSetAccess(dv, GRAN, d, 1), CUDA_SUCCESS);
    assert_int_equal(cuMemSetAccess(nv, GRAN, d, 2), CUDA_SUCCESS);
    d[1].location.type = CU_MEM_LOCATION_TYPE_HOST;
    assert_int_equal(cuMemSetAccess(hv, GRAN, d, 2), CUDA_SUCCESS);
    assert_perms(hv, "rw-s");
    assert_perms(nv, "rw-s");

    simcuda_stats_t s0, s1;
    simcuda_get_stats(&s0);
    launch_fill(dv, 0x11, 1000);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoD(hv, dv, 1000), CUDA_SUCCESS);       /* device -> host */
    assert_int_equal(cuMemcpyDtoD(dv + 4096, nv, 500), CUDA_SUCCESS); /* host -> device */
    assert_int_equal(cuMemcpyDtoD(nv, hv, 300), CUDA_SUCCESS);        /* host -> host */
    assert_int_equal(cuMemcpyDtoD(dv + 8192, dv, 200), CUDA_SUCCESS); /* device -> device */
    simcuda_get_stats(&s1);
    assert_int_equal(s1.copies_d2h - s0.copies_d2h, 1);
    assert_int_equal(s1.bytes_d2h - s0.bytes_d2h, 1000);
    assert_int_equal(s1.copies_h2d - s0.copies_h2d, 1);
    assert_int_equal(s1.bytes_h2d - s0.bytes_h2d, 500);
    const uint8_t *h = (const uint8_t *)(uintptr_t)hv, *n = (const uint8_t *)(uintptr_t)nv;
    assert_int_equal(h[999], 0x11);
    assert_int_equal(h[1000], 0);
    assert_int_equal(n[299], 0x11);
    assert_int_equal(n[300], 0);

    assert_int_equal(cuMemUnmap(dv, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(hv, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(nv, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(dh), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(hh), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(nh), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(dv, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(hv, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(nv, GRAN), CUDA_SUCCESS);
}

static CUmemorytype type_at(CUdeviceptr p)
{
    CUmemorytype t = 0;
    assert_int_equal(cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_SUCCESS);
    return t;
}

/* Pointer queries: a cuMemAlloc allocation is one range of device memory;
 * a VMM mapping is the range of the one handle mapped there, located where
 * the handle lives (a host-located handle reads as host memory: what the
 * library's hooks must correct for regions); pinned host memory is host
 * memory with a host pointer; an address the driver never saw is an error
 * to cuPointerGetAttribute and cuMemGetAddressRange, and zeros to
 * cuPointerGetAttributes. */
static void pointer_queries(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr a = 0, base = 0;
    size_t size = 0;
    assert_int_equal(cuMemAlloc(&a, 10000), CUDA_SUCCESS);
    assert_int_equal(type_at(a + 9999), CU_MEMORYTYPE_DEVICE);
    assert_int_equal(cuMemGetAddressRange(&base, &size, a + 5000), CUDA_SUCCESS);
    assert_int_equal(base, a);
    assert_int_equal(size, 10000);
    int ipc = 0;
    assert_int_equal(
        cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a),
        CUDA_SUCCESS);
    assert_int_equal(ipc, 1);
    void *host = NULL;
    assert_int_equal(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, a),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);

    CUdeviceptr va = reserve(2 * GRAN);
    CUmemGenericAllocationHandle dh = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    CUmemGenericAllocationHandle hh = create(CU_MEM_LOCATION_TYPE_HOST_NUMA, GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, dh, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va + GRAN, GRAN, 0, hh, 0), CUDA_SUCCESS);
    assert_int_equal(type_at(va + 1), CU_MEMORYTYPE_DEVICE);
    assert_int_equal(type_at(va + GRAN + 1), CU_MEMORYTYPE_HOST);
    assert_int_equal(cuMemGetAddressRange(&base, &size, va + GRAN + 7), CUDA_SUCCESS);
    assert_int_equal(base, va + GRAN);
    assert_int_equal(size, GRAN);
    assert_int_equal(
        cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va),
        CUDA_SUCCESS);
    assert_int_equal(ipc, 0);
    assert_int_equal(cuMemUnmap(va, 2 * GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(dh), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(hh), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, 2 * GRAN), CUDA_SUCCESS);

    void *pinned = NULL;
    assert_int_equal(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
    CUdeviceptr pp = (CUdeviceptr)(uintptr_t)pinned;
    assert_int_equal(type_at(pp + 10), CU_MEMORYTYPE_HOST);
    assert_int_equal(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, pp + 10),
                     CUDA_SUCCESS);
    assert_ptr_equal(host, (char *)pinned + 10);
    assert_int_equal(cuMemFreeHost(pinned), CUDA_SUCCESS);

    int local = 0;
    CUdeviceptr lp = (CUdeviceptr)(uintptr_t)&local;
    CUmemorytype t = 7;
    assert_int_equal(cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, lp),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAddressRange(&base, &size, lp), CUDA_ERROR_NOT_FOUND);
    CUpointer_attribute what[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    size = 99;
    void *data[] = {&t, &size};
    assert_int_equal(cuPointerGetAttributes(2, what, data, lp), CUDA_SUCCESS);
    assert_int_equal(t, 0);
    assert_int_equal(size, 0);
}

/* cuMemRetainAllocationHandle: another reference to the handle mapped at
 * an address, VMM memory only. The memory lives until every reference and
 * mapping is gone; a retained handle can be mapped again after its creator
 * released it. Legacy IPC exports cuMemAlloc memory and refuses VMM memory. */
static void retained_handles_and_ipc(void **state)
{
    (void)state;
    need_ctx();
    size_t before = dev_in_use();
    CUdeviceptr va = reserve(GRAN), again = reserve(GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN), r = 0;
    assert_int_equal(cuMemMap(va, GRAN, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    assert_int_equal(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + 100)), CUDA_SUCCESS);
    assert_int_equal(r, h);
    CUipcMemHandle ipc;
    assert_int_equal(cuIpcGetMemHandle(&ipc, va), CUDA_ERROR_INVALID_VALUE);
    launch_fill(va, 0x3c, GRAN);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS); /* the creator's reference */
    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), before + GRAN); /* the retained one holds it */
    assert_int_equal(cuMemMap(again, GRAN, 0, r, 0), CUDA_SUCCESS);
    assert_int_equal(set_access(again, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    assert_int_equal(((const uint8_t *)(uintptr_t)again)[GRAN - 1], 0x3c);
    assert_int_equal(cuMemUnmap(again, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(r), CUDA_SUCCESS);
    assert_int_equal(dev_in_use(), before);
    assert_int_equal(cuMemRelease(r), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressFree(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(again, GRAN), CUDA_SUCCESS);

    CUdeviceptr a = 0;
    assert_int_equal(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
    assert_int_equal(cuIpcGetMemHandle(&ipc, a), CUDA_SUCCESS);
    assert_int_equal(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)a),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
}

/* cuda.h, cuMemSetAccess: "set the access flags for each location specified
 * in desc": a call that names only the host leaves the device's access as it
 * was, and cuMemGetAccess answers for the location it is asked about. */
static void access_is_set_per_location(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_HOST_NUMA, GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc dev, host;
    memset(&dev, 0, sizeof dev);
    memset(&host, 0, sizeof host);
    dev.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    dev.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    host.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    host.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    assert_int_equal(cuMemSetAccess(va, GRAN, &dev, 1), CUDA_SUCCESS);
    assert_int_equal(get_access(va), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUresult r = cuMemSetAccess(va, GRAN, &host, 1);
    unsigned long long devflags = get_access(va);
    char p[5];
    perms_at(va, p);
    /* Leave nothing mapped behind whatever the outcome. */
    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(r, CUDA_SUCCESS);
    assert_int_equal(devflags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_string_equal(p, "rw-s");
}

/* cuda.h, cuMemSetAccess: "Users cannot specify CU_MEM_LOCATION_TYPE_HOST_NUMA
 * accessibility for allocations created on with other location types." */
static void host_numa_access_to_device_memory_is_refused(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr va = reserve(GRAN);
    CUmemGenericAllocationHandle h = create(CU_MEM_LOCATION_TYPE_DEVICE, GRAN);
    assert_int_equal(cuMemMap(va, GRAN, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc host;
    memset(&host, 0, sizeof host);
    host.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    host.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = cuMemSetAccess(va, GRAN, &host, 1);
    assert_int_equal(cuMemUnmap(va, GRAN), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, GRAN), CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        print_error("cuMemSetAccess(HOST_NUMA) on device memory succeeded\n");
    assert_true(r != CUDA_SUCCESS);
}

int main(void)
{
    static const char *const env[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                      "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                      "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(granularity),
        cmocka_unit_test(reserve_and_free),
        cmocka_unit_test(reserve_errors),
        cmocka_unit_test(reserve_accepts_a_host_page_multiple),
        cmocka_unit_test(create_each_location_and_release),
        cmocka_unit_test(create_errors),
        cmocka_unit_test(create_host_numa_current_is_invalid_value),
        cmocka_unit_test(create_host_with_handle_types_is_invalid_value),
        cmocka_unit_test(map_then_access_then_unmap),
        cmocka_unit_test(map_errors),
        cmocka_unit_test(unmap_errors),
        cmocka_unit_test(access_errors),
        cmocka_unit_test(release_of_a_mapped_handle_waits_for_the_unmap),
        cmocka_unit_test(one_handle_mapped_twice_shares_its_bytes),
        cmocka_unit_test(adjacent_mappings_take_one_access_call),
        cmocka_unit_test(host_located_handles_count_as_host_in_copies),
        cmocka_unit_test(access_is_set_per_location),
        cmocka_unit_test(host_numa_access_to_device_memory_is_refused),
        cmocka_unit_test(pointer_queries),
        cmocka_unit_test(retained_handles_and_ipc),
    };
    return cmocka_run_group_tests_name("sim_vmm", tests, NULL, NULL);
}
