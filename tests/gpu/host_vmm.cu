/* host_vmm.cu — DESIGN.md §2's invariant, on the hardware, with no library.
 *
 * The whole eviction mechanism rests on one capability: physical memory
 * created in host RAM with cuMemCreate (location HOST_NUMA, or HOST since
 * CUDA 13) can be mapped into the device's virtual address space, where
 * kernels and copies use it like device memory. This program proves, with
 * the driver API alone:
 *
 *   1. a host-located handle maps at a reserved device address, a kernel
 *      writes and reads it there, and a second mapping of the same handle
 *      (the staging address) sees the same bytes;
 *   2. restore: the bytes are copied into a device handle mapped at a
 *      scratch address, the host handle is unmapped and the device handle
 *      mapped at the SAME address, and a kernel finds every byte there;
 *   3. eviction: after a kernel changes them, the bytes are copied back
 *      through the staging address, the device handle is unmapped, the host
 *      handle mapped again at the same address, and kernels and copies find
 *      every byte.
 *
 * It also reports the facts the design relies on (granularities, whether a
 * sub-range can be unmapped) and how fast a kernel reads each backing.
 *
 * Usage: host_vmm [SIZE_MB]   (default 256; rounded up to the granularity)
 */
#include "common.cuh"

static CUmemAllocationProp make_prop(CUmemLocationType type, int id)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = type;
    p.location.id = id;
    return p;
}

static void set_access(CUdeviceptr va, size_t size, CUdevice dev)
{
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CKD(cuMemSetAccess(va, size, &a, 1));
}

static unsigned long long *g_bad;

/* Words at va that differ from pattern(seed, i, bumps), counted by a kernel. */
static unsigned long long device_bad(CUdeviceptr va, size_t words, uint32_t seed, uint32_t bumps,
                                     double *seconds)
{
    CK(cudaMemset(g_bad, 0, sizeof *g_bad));
    CK(cudaDeviceSynchronize());
    double t0 = now_s();
    k_count_bad<<<kGrid, kBlock>>>((const uint32_t *)va, words, seed, bumps, g_bad);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (seconds)
        *seconds = now_s() - t0;
    unsigned long long bad = 0;
    CK(cudaMemcpy(&bad, g_bad, sizeof bad, cudaMemcpyDeviceToHost));
    return bad;
}

/* Words at va that differ, through a driver copy to the host. */
static size_t copy_bad(CUdeviceptr va, size_t words, uint32_t seed, uint32_t bumps, uint32_t *h)
{
    CKD(cuMemcpyDtoH(h, va, words * 4));
    return host_mismatches(h, words, seed, bumps);
}

int main(int argc, char **argv)
{
    set_test_name("host_vmm");
    long long size_mb = argc > 1 ? atoll(argv[1]) : 256;
    if (size_mb <= 0)
        fail("bad size %lld MB", size_mb);

    CKD(cuInit(0));
    CUdevice dev;
    CKD(cuDeviceGet(&dev, 0));
    char devname[256] = "";
    cuDeviceGetName(devname, sizeof devname, dev);
    int vmm = 0, host_vmm = 0, numa_id = -1, drv = 0;
    CKD(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    cuDeviceGetAttribute(&host_vmm,
                         CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    cuDeviceGetAttribute(&numa_id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
    cuDriverGetVersion(&drv);
    info("%s, driver API %d.%d, VMM %d, host NUMA VMM %d, host NUMA id %d", devname, drv / 1000,
         drv % 1000 / 10, vmm, host_vmm, numa_id);
    if (!vmm)
        fail("the device has no virtual memory management");

    /* The runtime's primary context, made current here, is the driver's. */
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CK(cudaMalloc((void **)&g_bad, sizeof *g_bad));

    /* The host handle: HOST_NUMA first (CUDA 12.2+), HOST (CUDA 13) after. */
    CUmemAllocationProp hprop =
        make_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, numa_id < 0 ? 0 : numa_id);
    CUmemAllocationProp dprop = make_prop(CU_MEM_LOCATION_TYPE_DEVICE, dev);
    size_t dgran = 0, hgran = 0;
    CKD(cuMemGetAllocationGranularity(&dgran, &dprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const char *host_kind = "HOST_NUMA";
    if (cuMemGetAllocationGranularity(&hgran, &hprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
        CUDA_SUCCESS) {
        hprop = make_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
        host_kind = "HOST";
        CKD(cuMemGetAllocationGranularity(&hgran, &hprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    }
    size_t gran = dgran > hgran ? dgran : hgran;
    size_t size = (((size_t)size_mb << 20) + gran - 1) / gran * gran;
    const size_t words = size / 4;
    CUmemGenericAllocationHandle hh = 0, dh = 0;
    CUresult r = cuMemCreate(&hh, size, &hprop, 0);
    if (r != CUDA_SUCCESS && hprop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
        const char *s = NULL;
        cuGetErrorName(r, &s);
        info("cuMemCreate(HOST_NUMA %d) failed (%s); trying HOST", hprop.location.id, s ? s : "?");
        hprop = make_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
        host_kind = "HOST";
        r = cuMemCreate(&hh, size, &hprop, 0);
    }
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        cuGetErrorName(r, &s);
        fail("no host-located VMM memory on this machine: cuMemCreate(%s) failed: %s", host_kind,
             s ? s : "?");
    }
    CKD(cuMemCreate(&dh, size, &dprop, 0));
    info("granularity: device %zu KB, %s %zu KB; %zu MB per handle", dgran >> 10, host_kind,
         hgran >> 10, size >> 20);

    CUdeviceptr va = 0, staging = 0, scratch = 0;
    CKD(cuMemAddressReserve(&va, size, gran, 0, 0));
    CKD(cuMemAddressReserve(&staging, size, gran, 0, 0));
    CKD(cuMemAddressReserve(&scratch, size, gran, 0, 0));
    uint32_t *h = NULL;
    CK(cudaMallocHost((void **)&h, size));

    /* 1. Host memory at a device address, and at a second one. */
    CKD(cuMemMap(va, size, 0, hh, 0));
    set_access(va, size, dev);
    CKD(cuMemMap(staging, size, 0, hh, 0));
    set_access(staging, size, dev);
    k_fill<<<kGrid, kBlock>>>((uint32_t *)va, words, 11);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    double t_host_read = 0, t_dev_read = 0;
    unsigned long long bad = device_bad(va, words, 11, 0, &t_host_read);
    if (bad)
        fail("step 1: a kernel read back %llu wrong words from host memory at %#llx", bad,
             (unsigned long long)va);
    if ((bad = device_bad(staging, words, 11, 0, NULL)))
        fail("step 1: the staging mapping of the same handle shows %llu wrong words", bad);
    if ((bad = copy_bad(va, words, 11, 0, h)))
        fail("step 1: a copy from the host-backed address shows %llu wrong words", bad);
    info("1. kernel wrote and read %zu MB of %s memory at %#llx; the staging alias agrees",
         size >> 20, host_kind, (unsigned long long)va);

    /* 2. Restore: device handle filled at scratch, then swapped in at va. */
    CKD(cuMemMap(scratch, size, 0, dh, 0));
    set_access(scratch, size, dev);
    CKD(cuMemcpyDtoD(scratch, va, size));
    CKD(cuCtxSynchronize());
    CKD(cuMemUnmap(va, size));
    CKD(cuMemMap(va, size, 0, dh, 0));
    set_access(va, size, dev);
    if ((bad = device_bad(va, words, 11, 0, &t_dev_read)))
        fail("step 2: after the swap to device memory, %llu words differ at the same address", bad);
    k_bump<<<kGrid, kBlock>>>((uint32_t *)va, words);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if ((bad = device_bad(scratch, words, 11, 1, NULL)))
        fail("step 2: the scratch alias of the device handle shows %llu wrong words", bad);
    info("2. restored: device memory now at %#llx holds every byte; a kernel changed them",
         (unsigned long long)va);

    /* 3. Evict: copied back through staging, host handle mapped at va again. */
    CKD(cuMemcpyDtoD(staging, va, size));
    CKD(cuCtxSynchronize());
    CKD(cuMemUnmap(va, size));
    CKD(cuMemMap(va, size, 0, hh, 0));
    set_access(va, size, dev);
    if ((bad = device_bad(va, words, 11, 1, NULL)))
        fail("step 3: after eviction, a kernel finds %llu wrong words at the same address", bad);
    if ((bad = copy_bad(va, words, 11, 1, h)))
        fail("step 3: after eviction, a copy finds %llu wrong words", bad);
    info("3. evicted: host memory at %#llx again, every byte as the kernel left it",
         (unsigned long long)va);

    /* Facts the design relies on: a sub-range cannot be unmapped. */
    int subrange_unmap = -1;
    if (size > gran) {
        r = cuMemUnmap(va, gran);
        subrange_unmap = r == CUDA_SUCCESS;
        const char *s = NULL;
        cuGetErrorName(r, &s);
        info("cuMemUnmap of the first %zu KB of a %zu MB mapping: %s%s", gran >> 10, size >> 20,
             s ? s : "?", subrange_unmap ? " (the design assumes it fails)" : "");
        if (subrange_unmap) /* the context may be in an odd state now: start over */
            CKD(cuMemUnmap(va + gran, size - gran));
        else
            CKD(cuMemUnmap(va, size));
    } else {
        CKD(cuMemUnmap(va, size));
    }
    CKD(cuMemUnmap(staging, size));
    CKD(cuMemUnmap(scratch, size));
    CKD(cuMemRelease(hh));
    CKD(cuMemRelease(dh));
    CKD(cuMemAddressFree(va, size));
    CKD(cuMemAddressFree(staging, size));
    CKD(cuMemAddressFree(scratch, size));
    CK(cudaFreeHost(h));
    CK(cudaFree(g_bad));

    const double gb = (double)size / 1e9;
    printf("RESULT host_vmm host_kind=%s numa_id=%d device_gran_kb=%zu host_gran_kb=%zu "
           "size_mb=%zu kernel_read_host_gbps=%.1f kernel_read_device_gbps=%.1f "
           "subrange_unmap=%s\n",
           host_kind, numa_id, dgran >> 10, hgran >> 10, size >> 20,
           t_host_read > 0 ? gb / t_host_read : 0.0, t_dev_read > 0 ? gb / t_dev_read : 0.0,
           subrange_unmap < 0 ? "n/a"
           : subrange_unmap   ? "allowed"
                              : "refused");
    pass("%s memory mapped at a device address is read and written by kernels and copies; the "
         "same address swapped to device memory and back keeps every byte",
         host_kind);
    return 0;
}
