/* test_sim_devices.c — several simulated GPUs (SIMCUDA_DEVICES): each has
 * its own memory and limit, primary context, default streams, VMM location
 * and peer access; the current device is per thread; allocations land on
 * it and pointer attributes name it; streams and events belong to a device;
 * a kernel on one device that touches another's memory without peer access
 * (or, for VMM memory, without access granted to its device) faults; bad
 * SIMCUDA_DEVICES values stop cuInit with a message naming the variable.
 *
 * This process runs with two devices of 64 and 32 MiB. A fault is sticky to
 * its device for the life of the process, and the device count is read once,
 * so the faulting scenarios and other configurations run in a fresh process:
 * this program again, with the scenario's name as its argument. A child
 * exits 0 if every check held, else 1 after naming the failed check on
 * stderr, which the parent captures.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

#include "child.h"

#define MiB  (1024ull * 1024)
#define GRAN (2 * MiB)

static const dim3 one = {1, 1, 1};

/* ---- kernels and helpers (both sides) ---- */

/* (uint32_t *dst, uint32_t value): *dst = value */
static void k_store(void **args)
{
    **(uint32_t **)args[0] = *(uint32_t *)args[1];
}
/* the same, taking a second */
static void k_store_slow(void **args)
{
    k_store(args);
}

static int register_kernels(void)
{
    const size_t sz[] = {sizeof(void *), sizeof(uint32_t)};
    if (simcuda_register_kernel(k_store, "k_store", 2, sz, 0) != 0)
        return -1;
    return simcuda_register_kernel(k_store_slow, "k_store_slow", 2, sz, 1000 * 1000);
}

static cudaError_t store_on(simcuda_kernel_fn k, void *dst, uint32_t v, cudaStream_t s)
{
    void *args[] = {&dst, &v};
    return cudaLaunchKernel((const void *)k, one, one, args, 0, s);
}

static cudaError_t store(void *dst, uint32_t v)
{
    return store_on(k_store, dst, v, NULL);
}

/* The 32-bit word at a device address, read with a copy. */
static uint32_t peek(const void *p)
{
    uint32_t v = 0xdeadbeef;
    if (cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0xdeadbeef;
    return v;
}

static size_t free_on(int dev)
{
    int was = -1;
    size_t f = 0, t = 0;
    cudaGetDevice(&was);
    cudaSetDevice(dev);
    cudaMemGetInfo(&f, &t);
    cudaSetDevice(was);
    return f;
}

static CUcontext primary(int dev)
{
    CUcontext c = NULL;
    cuDevicePrimaryCtxRetain(&c, dev);
    return c;
}

/* A granule of device-located VMM memory on dev, mapped and opened to the
 * devices whose bit is set in `to`. */
static CUresult vmm_on(int dev, unsigned to, CUdeviceptr *va, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    CUresult r = cuMemAddressReserve(va, GRAN, 0, 0, 0);
    if (r == CUDA_SUCCESS)
        r = cuMemCreate(h, GRAN, &p, 0);
    if (r == CUDA_SUCCESS)
        r = cuMemMap(*va, GRAN, 0, *h, 0);
    for (int d = 0; r == CUDA_SUCCESS && d < 2; d++) {
        CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, d}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (to & (1u << d))
            r = cuMemSetAccess(*va, GRAN, &a, 1);
    }
    return r;
}

static void vmm_free(CUdeviceptr va, CUmemGenericAllocationHandle h)
{
    cuMemUnmap(va, GRAN);
    cuMemRelease(h);
    cuMemAddressFree(va, GRAN);
}

/* ---- the in-process tests: two devices, 64 and 32 MiB ---- */

static int setup(void **state)
{
    (void)state;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    return 0;
}

static void devices_are_counted_and_sized(void **state)
{
    (void)state;
    int n = 0, bus0 = -1, bus1 = -1;
    CUdevice d = -1;
    size_t total = 0;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 2);
    assert_int_equal(cuDeviceGetCount(&n), CUDA_SUCCESS);
    assert_int_equal(n, 2);
    assert_int_equal(cuDeviceGet(&d, 1), CUDA_SUCCESS);
    assert_int_equal(d, 1);
    assert_int_equal(cuDeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
    assert_int_equal(total, 64 * MiB);
    assert_int_equal(cuDeviceTotalMem(&total, 1), CUDA_SUCCESS);
    assert_int_equal(total, 32 * MiB);
    assert_int_equal(cuDeviceTotalMem(&total, 2), CUDA_ERROR_INVALID_DEVICE);
    struct cudaDeviceProp p;
    assert_int_equal(cudaGetDeviceProperties(&p, 1), cudaSuccess);
    assert_int_equal(p.totalGlobalMem, 32 * MiB);
    assert_int_equal(cudaGetDeviceProperties(&p, 2), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cuDeviceGetAttribute(&bus0, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGetAttribute(&bus1, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), CUDA_SUCCESS);
    assert_int_not_equal(bus0, bus1);
    assert_int_equal(cuDeviceGetAttribute(&bus1, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 2),
                     CUDA_ERROR_INVALID_DEVICE);
}

static void memory_limits_are_per_device(void **state)
{
    (void)state;
    size_t f0 = free_on(0), f1 = free_on(1);
    void *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc(&a, 24 * MiB), cudaSuccess);
    assert_int_equal(free_on(1), f1 - 24 * MiB);
    assert_int_equal(free_on(0), f0);
    /* Device 1 is full; device 0, with room, still takes the same size. */
    assert_int_equal(cudaMalloc(&b, 16 * MiB), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMalloc(&c, 16 * MiB), cudaSuccess);
    assert_int_equal(free_on(0), f0 - 16 * MiB);
    assert_int_equal(free_on(1), f1 - 24 * MiB);
    size_t f = 0, t = 0;
    assert_int_equal(cudaMemGetInfo(&f, &t), cudaSuccess);
    assert_int_equal(t, 64 * MiB);
    assert_int_equal(cudaFree(a), cudaSuccess); /* freed from another device */
    assert_int_equal(cudaFree(c), cudaSuccess);
    assert_int_equal(free_on(0), f0);
    assert_int_equal(free_on(1), f1);
}

static int ordinal_of(const void *p)
{
    int dev = -1;
    if (cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return -2;
    return dev;
}

static void allocations_land_on_the_current_device(void **state)
{
    (void)state;
    size_t f1 = free_on(1);
    void *a = NULL, *b = NULL;
    CUdeviceptr d = 0;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc(&a, MiB), cudaSuccess);
    assert_int_equal(ordinal_of(a), 1);
    assert_int_equal(cuMemAlloc(&d, MiB), CUDA_SUCCESS); /* the driver: the current context's */
    assert_int_equal(ordinal_of((void *)(uintptr_t)d), 1);
    assert_int_equal(free_on(1), f1 - 2 * MiB);
    /* Stream-ordered memory comes from the pool of the stream's device. */
    cudaStream_t s1 = NULL;
    assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&b, MiB, s1), cudaSuccess);
    assert_int_equal(ordinal_of(b), 1);
    assert_int_equal(cudaFreeAsync(b, s1), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
    assert_int_equal(cudaMalloc(&b, MiB), cudaSuccess);
    assert_int_equal(ordinal_of(b), 0);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaFree(b), cudaSuccess);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
    assert_int_equal(free_on(1), f1);
}

static void pointer_attributes_name_the_owning_device(void **state)
{
    (void)state;
    void *a = NULL, *h = NULL;
    struct cudaPointerAttributes at;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc(&a, 4096), cudaSuccess);
    assert_int_equal(cudaMallocHost(&h, 4096), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess); /* asked from another device */
    assert_int_equal(cudaPointerGetAttributes(&at, (char *)a + 100), cudaSuccess);
    assert_int_equal(at.type, cudaMemoryTypeDevice);
    assert_int_equal(at.device, 1);
    CUcontext owner = NULL;
    assert_int_equal(
        cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)a),
        CUDA_SUCCESS);
    assert_ptr_equal(owner, primary(1));
    assert_int_equal(cudaPointerGetAttributes(&at, h), cudaSuccess);
    assert_int_equal(at.type, cudaMemoryTypeHost);
    assert_int_equal(at.device, 1); /* the device it was allocated on */
    /* VMM memory: where its handle lives. */
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle hd = 0;
    assert_int_equal(vmm_on(1, 1u << 1, &va, &hd), CUDA_SUCCESS);
    assert_int_equal(ordinal_of((void *)(uintptr_t)va), 1);
    vmm_free(va, hd);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaFreeHost(h), cudaSuccess);
    cuDevicePrimaryCtxRelease(1);
}

static void contexts_are_per_device_and_stack(void **state)
{
    (void)state;
    CUcontext c0 = primary(0), c1 = primary(1), c = NULL;
    CUdevice d = -1;
    int rd = -1;
    assert_non_null(c0);
    assert_ptr_not_equal(c0, c1);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, c0); /* the runtime made device 0's current */
    assert_int_equal(cuCtxPushCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(cuCtxGetDevice(&d), CUDA_SUCCESS);
    assert_int_equal(d, 1);
    assert_int_equal(cudaGetDevice(&rd), cudaSuccess); /* the runtime follows the driver */
    assert_int_equal(rd, 1);
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, c1);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, c0); /* popped back to what was under it */
    assert_int_equal(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(cuCtxGetDevice(&d), CUDA_SUCCESS);
    assert_int_equal(d, 1);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, c0);
    assert_int_equal(cudaSetDevice(2), cudaErrorInvalidDevice);
    assert_int_equal(cudaSetDevice(-1), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetDevice(&rd), cudaSuccess);
    assert_int_equal(rd, 0);
    cuDevicePrimaryCtxRelease(0);
    cuDevicePrimaryCtxRelease(1);
}

struct thread_view {
    int dev_before, dev_after, alloc_dev;
};

static void *other_thread(void *arg)
{
    struct thread_view *v = arg;
    void *p = NULL;
    cudaGetDevice(&v->dev_before);
    if (cudaMalloc(&p, 4096) == cudaSuccess)
        v->alloc_dev = ordinal_of(p);
    cudaFree(p);
    cudaSetDevice(1);
    cudaGetDevice(&v->dev_after);
    return NULL;
}

static void current_device_is_per_thread(void **state)
{
    (void)state;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    struct thread_view v = {-1, -1, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &v), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(v.dev_before, 0); /* a new thread starts on device 0 */
    assert_int_equal(v.alloc_dev, 0);
    assert_int_equal(v.dev_after, 1);
    int d = -1;
    assert_int_equal(cudaGetDevice(&d), cudaSuccess);
    assert_int_equal(d, 1); /* untouched by the other thread's choice */
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, 4096), cudaSuccess);
    assert_int_equal(ordinal_of(p), 1);
    assert_int_equal(cudaFree(p), cudaSuccess);
}

static void peer_access_enable_and_disable(void **state)
{
    (void)state;
    int can = -1;
    assert_int_equal(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
    assert_int_equal(can, 1);
    assert_int_equal(cudaDeviceCanAccessPeer(&can, 1, 1), cudaSuccess);
    assert_int_equal(can, 0);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 1, 0), CUDA_SUCCESS);
    assert_int_equal(can, 1);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 0, 2), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cudaDeviceCanAccessPeer(&can, 2, 0), cudaErrorInvalidDevice);

    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
    assert_int_equal(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice); /* itself */
    assert_int_equal(cudaDeviceEnablePeerAccess(2, 0), cudaErrorInvalidDevice);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
    /* The driver's view of the same, and the errors it documents. */
    CUcontext c0 = primary(0), c1 = primary(1);
    int bogus = 0;
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    assert_int_equal(cuCtxEnablePeerAccess(c0, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxEnablePeerAccess((CUcontext)&bogus, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxDisablePeerAccess((CUcontext)&bogus), CUDA_ERROR_INVALID_CONTEXT);
    /* One way only: device 1 has no access to device 0 until it asks. */
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    assert_int_equal(cuCtxEnablePeerAccess(c0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCtxEnablePeerAccess(c0, 0), CUDA_SUCCESS);
    assert_int_equal(cudaDeviceDisablePeerAccess(0), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDeviceDisablePeerAccess(1), cudaSuccess);
    assert_int_equal(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    assert_int_equal(cudaDeviceDisablePeerAccess(5), cudaErrorInvalidDevice);
    cudaGetLastError();
    cuDevicePrimaryCtxRelease(0);
    cuDevicePrimaryCtxRelease(1);
}

static void peer_access_lets_a_kernel_reach_a_peer(void **state)
{
    (void)state;
    uint32_t *p1 = NULL;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&p1, 4096), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    assert_int_equal(store(p1, 41), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(peek(p1), 41);
    assert_int_equal(cudaDeviceDisablePeerAccess(1), cudaSuccess);
    /* Its own memory needs nothing. */
    uint32_t *p0 = NULL;
    assert_int_equal(cudaMalloc((void **)&p0, 4096), cudaSuccess);
    assert_int_equal(store(p0, 42), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(peek(p0), 42);
    assert_int_equal(cudaFree(p0), cudaSuccess);
    assert_int_equal(cudaFree(p1), cudaSuccess);
}

static void vmm_memory_is_located_and_opened_per_device(void **state)
{
    (void)state;
    size_t f0 = free_on(0), f1 = free_on(1);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(vmm_on(1, 1u << 1, &va, &h), CUDA_SUCCESS);
    assert_int_equal(free_on(1), f1 - GRAN); /* charged to device 1 */
    assert_int_equal(free_on(0), f0);
    CUmemAllocationProp prop;
    assert_int_equal(cuMemGetAllocationPropertiesFromHandle(&prop, h), CUDA_SUCCESS);
    assert_int_equal(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(prop.location.id, 1);
    unsigned long long fl = 99;
    CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1},
                  l2 = {CU_MEM_LOCATION_TYPE_DEVICE, 2};
    assert_int_equal(cuMemGetAccess(&fl, &l0, va), CUDA_SUCCESS);
    assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(cuMemGetAccess(&fl, &l1, va), CUDA_SUCCESS);
    assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(cuMemGetAccess(&fl, &l2, va), CUDA_ERROR_INVALID_DEVICE);
    CUmemAccessDesc bad = {l2, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(cuMemSetAccess(va, GRAN, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
    /* Device 1's kernels reach it; device 0's once it is granted access. */
    uint32_t *p = (uint32_t *)(uintptr_t)va;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(store(p, 7), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(peek(p), 7);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    CUmemAccessDesc grant = {l0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(cuMemSetAccess(va, GRAN, &grant, 1), CUDA_SUCCESS);
    assert_int_equal(cuMemGetAccess(&fl, &l1, va), CUDA_SUCCESS);
    assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_READWRITE); /* left as it was */
    assert_int_equal(store(p, 8), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(peek(p), 8);
    vmm_free(va, h);
    assert_int_equal(free_on(1), f1);
    CUmemAllocationProp p2 = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = l2};
    assert_int_equal(cuMemCreate(&h, GRAN, &p2, 0), CUDA_ERROR_INVALID_DEVICE);
}

static void streams_and_events_belong_to_a_device(void **state)
{
    (void)state;
    cudaStream_t s1 = NULL, s0 = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    uint32_t *p0 = NULL, v = 5;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e1), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s0), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e0), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&p0, 4096), cudaSuccess);
    /* A kernel goes to a stream of the current device only. */
    assert_int_equal(store_on(k_store, p0, 1, s1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    assert_int_equal(store_on(k_store, p0, 2, s0), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s0), cudaSuccess);
    assert_int_equal(store_on(k_store, p0, 3, cudaStreamPerThread), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    assert_int_equal(peek(p0), 3);
    /* A copy may use another device's stream. */
    assert_int_equal(cudaMemcpyAsync(p0, &v, sizeof v, cudaMemcpyHostToDevice, s1), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
    /* An event is recorded on its own device's streams; waited on anywhere. */
    assert_int_equal(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventRecord(e0, s0), cudaSuccess);
    assert_int_equal(cudaStreamWaitEvent(s1, e0, 0), cudaSuccess);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaEventRecord(e1, s1), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(e0), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventElapsedTime(&ms, e1, e1), cudaSuccess);
    cudaGetLastError();
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
    assert_int_equal(cudaEventDestroy(e1), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s0), cudaSuccess);
    assert_int_equal(cudaEventDestroy(e0), cudaSuccess);
    assert_int_equal(cudaFree(p0), cudaSuccess);
}

static void default_streams_are_per_device(void **state)
{
    (void)state;
    uint32_t *p0 = NULL, *p1 = NULL;
    assert_int_equal(cudaMalloc((void **)&p0, 4096), cudaSuccess);
    assert_int_equal(store_on(k_store_slow, p0, 9, NULL), cudaSuccess); /* a second on 0 */
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&p1, 4096), cudaSuccess);
    assert_int_equal(store(p1, 10), cudaSuccess);
    /* Device 1's default stream and device 1 itself wait for device 1's
     * work only: device 0's kernel is still running when they return. */
    assert_int_equal(cudaStreamSynchronize(NULL), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(peek(p1), 10);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamQuery(NULL), cudaErrorNotReady);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(peek(p0), 9);
    assert_int_equal(cudaFree(p0), cudaSuccess);
    assert_int_equal(cudaFree(p1), cudaSuccess);
}

static void peer_copies_need_no_peer_access(void **state)
{
    (void)state;
    uint32_t *p0 = NULL, *p1 = NULL, v = 0x1234, back = 0;
    cudaStream_t s = NULL;
    assert_int_equal(cudaMalloc((void **)&p0, 4096), cudaSuccess);
    assert_int_equal(cudaMemcpy(p0, &v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&p1, 4096), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaMemcpyPeer(p1, 1, p0, 0, sizeof v), cudaSuccess);
    assert_int_equal(peek(p1), 0x1234);
    v = 0x5678;
    assert_int_equal(cudaMemcpy(p1, &v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpyPeerAsync(p0, 0, p1, 1, sizeof v, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaMemcpy(&back, p0, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(back, 0x5678);
    assert_int_equal(cudaMemcpyPeer(p1, 2, p0, 0, sizeof v), cudaErrorInvalidDevice);
    int bogus = 0;
    assert_int_equal(cuMemcpyPeer((CUdeviceptr)(uintptr_t)p1, (CUcontext)&bogus,
                                  (CUdeviceptr)(uintptr_t)p0, primary(0), sizeof v),
                     CUDA_ERROR_INVALID_CONTEXT);
    cuDevicePrimaryCtxRelease(0);
    cudaGetLastError();
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaFree(p1), cudaSuccess);
    assert_int_equal(cudaFree(p0), cudaSuccess);
}

/* ---- the child scenarios ---- */

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static unsigned long long faults(void)
{
    simcuda_stats_t st;
    simcuda_get_stats(&st);
    return st.faults;
}

/* After a fault on device 0: device 0 is unusable, device 1 is not. */
static int only_device0_faulted(const uint32_t *p)
{
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    CHECK(faults() == 1);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(peek(p) == 0); /* the kernel did not run */
    uint32_t *q = NULL;
    CHECK(cudaMalloc((void **)&q, 4096) == cudaSuccess);
    CHECK(store(q, 3) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(peek(q) == 3);
    return 0;
}

/* Device 1 memory, zeroed; the thread left on device 0. */
static uint32_t *zeroed_on_1(bool pool)
{
    uint32_t *p = NULL;
    if (cudaSetDevice(1) != cudaSuccess)
        return NULL;
    cudaError_t e = pool ? cudaMallocAsync((void **)&p, 4096, NULL) : cudaMalloc((void **)&p, 4096);
    if (e != cudaSuccess || cudaMemset(p, 0, 4096) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess || cudaSetDevice(0) != cudaSuccess)
        return NULL;
    return p;
}

static int scenario_peer_fault(void)
{
    uint32_t *p = zeroed_on_1(false);
    CHECK(p);
    CHECK(store(p, 1) == cudaSuccess); /* the launch itself is fine */
    return only_device0_faulted(p);
}

static int scenario_peer_disabled(void)
{
    uint32_t *p = zeroed_on_1(false);
    CHECK(p);
    CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess);
    CHECK(store(p, 4) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(peek(p) == 4);
    CHECK(cudaDeviceDisablePeerAccess(1) == cudaSuccess);
    CHECK(cudaSetDevice(1) == cudaSuccess && cudaMemset(p, 0, 4) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(store(p, 5) == cudaSuccess);
    return only_device0_faulted(p);
}

/* Peer access opens cuMemAlloc memory only: VMM memory needs cuMemSetAccess
 * for the device, a pool's allocations cuMemPoolSetAccess. */
static int scenario_vmm_fault(void)
{
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(vmm_on(1, 1u << 1, &va, &h) == CUDA_SUCCESS);
    CHECK(cudaSetDevice(1) == cudaSuccess && cudaMemset((void *)va, 0, 4) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess);
    CHECK(store((void *)va, 6) == cudaSuccess);
    return only_device0_faulted((const uint32_t *)va);
}

static int scenario_pool_fault(void)
{
    uint32_t *p = zeroed_on_1(true);
    CHECK(p);
    CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess);
    CHECK(store(p, 7) == cudaSuccess);
    return only_device0_faulted(p);
}

/* SIMCUDA_DEVICES names no usable count: no device at all. */
static int scenario_rejected(void)
{
    int n = -1;
    CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE);
    CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE);
    CHECK(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cudaGetDeviceCount(&n) == cudaErrorNoDevice);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4) == cudaErrorNoDevice);
    return 0;
}

/* As many devices as TEST_SIM_DEVICES_WANT says, each with
 * TEST_SIM_DEVICES_MIB of memory. */
static int scenario_count(void)
{
    int want = atoi(getenv("TEST_SIM_DEVICES_WANT")), n = -1;
    size_t mib = (size_t)atoll(getenv("TEST_SIM_DEVICES_MIB")), total = 0;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == want);
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == want);
    for (int d = 0; d < want; d++)
        CHECK(cuDeviceTotalMem(&total, d) == CUDA_SUCCESS && total == mib * MiB);
    CHECK(cuDeviceTotalMem(&total, want) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cudaSetDevice(want - 1) == cudaSuccess);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess && ordinal_of(p) == want - 1);
    return 0;
}

static int run_scenario(const char *name)
{
    if (register_kernels() != 0)
        return 1;
    static const struct {
        const char *name;
        int (*fn)(void);
    } all[] = {
        {"peer-fault", scenario_peer_fault}, {"peer-disabled", scenario_peer_disabled},
        {"vmm-fault", scenario_vmm_fault},   {"pool-fault", scenario_pool_fault},
        {"rejected", scenario_rejected},     {"count", scenario_count},
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (strcmp(name, all[i].name) == 0)
            return all[i].fn();
    fprintf(stderr, "no scenario %s\n", name);
    return 1;
}

/* ---- the parent side of the scenarios ---- */

/* A kernel on device 0 faults on the given device-1 memory, names it, and
 * leaves device 1 working. */
static void faults_on_device0(const char *scenario, const char *why)
{
    char err[8192];
    assert_int_equal(run_child(scenario, NULL, err, sizeof err), 0);
    assert_non_null(strstr(err, "simcuda: illegal address 0x"));
    assert_non_null(strstr(err, "kernel k_store on device 0"));
    assert_non_null(strstr(err, why));
}

static void kernel_without_peer_access_faults(void **state)
{
    (void)state;
    faults_on_device0("peer-fault", "memory of device 1, with no peer access from device 0");
}

static void disabled_peer_access_faults_again(void **state)
{
    (void)state;
    faults_on_device0("peer-disabled", "memory of device 1, with no peer access");
}

static void vmm_without_access_for_the_device_faults(void **state)
{
    (void)state;
    faults_on_device0("vmm-fault", "a VMM mapping with no access for device 0");
}

static void pool_memory_of_a_peer_faults(void **state)
{
    (void)state;
    faults_on_device0("pool-fault", "a stream-ordered allocation of device 1");
}

static void bad_device_counts_are_rejected(void **state)
{
    (void)state;
    static const char *const bad[] = {"SIMCUDA_DEVICES=0",  "SIMCUDA_DEVICES=9",
                                      "SIMCUDA_DEVICES=-1", "SIMCUDA_DEVICES=two",
                                      "SIMCUDA_DEVICES=2x", "SIMCUDA_DEVICES= 2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *env[] = {bad[i], NULL};
        char err[4096];
        assert_int_equal(run_child("rejected", env, err, sizeof err), 0);
        /* Named once, with the value and what would do. */
        const char *at = strstr(err, bad[i]);
        if (!at)
            print_error("%s: stderr was:\n%s\n", bad[i], err);
        assert_non_null(at);
        assert_null(strstr(at + 1, bad[i]));
        assert_non_null(strstr(err, "from 1 to 8"));
    }
}

static void good_device_counts_are_accepted(void **state)
{
    (void)state;
    static const char *const cases[][4] = {
        {"SIMCUDA_DEVICES=1", "SIMCUDA_VRAM_MB=48", "TEST_SIM_DEVICES_WANT=1", "48"},
        {"SIMCUDA_DEVICES=8", "SIMCUDA_VRAM_MB=16", "TEST_SIM_DEVICES_WANT=8", "16"},
        {"SIMCUDA_DEVICES=", "SIMCUDA_VRAM_MB=16", "TEST_SIM_DEVICES_WANT=1", "16"},
        /* a list that does not match the devices: said so, and the default */
        {"SIMCUDA_DEVICES=2", "SIMCUDA_VRAM_MB=64,32,16", "TEST_SIM_DEVICES_WANT=2", "1024"},
        {"SIMCUDA_DEVICES=2", "SIMCUDA_VRAM_MB=64,", "TEST_SIM_DEVICES_WANT=2", "1024"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char mib[64], err[4096];
        snprintf(mib, sizeof mib, "TEST_SIM_DEVICES_MIB=%s", cases[i][3]);
        const char *env[] = {cases[i][0], cases[i][1], cases[i][2], mib, NULL};
        assert_int_equal(run_child("count", env, err, sizeof err), 0);
        bool fallback = strcmp(cases[i][3], "1024") == 0;
        assert_int_equal(strstr(err, "SIMCUDA_VRAM_MB=") != NULL, fallback);
    }
}

int main(int argc, char **argv)
{
    static const char *const env[] = {
        "SIMCUDA_HOST_MB",     "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS", "SIMCUDA_KERNEL_US",
        "SIMCUDA_NO_HOST_VMM", "SIMCUDA_DRIVER_VERSION", "SIMCUDA_FAIL"};
    if (argc == 2) /* a child: its environment is the parent's and its own */
        return run_scenario(argv[1]);
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    setenv("SIMCUDA_DEVICES", "2", 1);
    setenv("SIMCUDA_VRAM_MB", "64,32", 1);
    if (register_kernels() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(devices_are_counted_and_sized, setup),
        cmocka_unit_test_setup(memory_limits_are_per_device, setup),
        cmocka_unit_test_setup(allocations_land_on_the_current_device, setup),
        cmocka_unit_test_setup(pointer_attributes_name_the_owning_device, setup),
        cmocka_unit_test_setup(contexts_are_per_device_and_stack, setup),
        cmocka_unit_test_setup(current_device_is_per_thread, setup),
        cmocka_unit_test_setup(peer_access_enable_and_disable, setup),
        cmocka_unit_test_setup(peer_access_lets_a_kernel_reach_a_peer, setup),
        cmocka_unit_test_setup(vmm_memory_is_located_and_opened_per_device, setup),
        cmocka_unit_test_setup(streams_and_events_belong_to_a_device, setup),
        cmocka_unit_test_setup(default_streams_are_per_device, setup),
        cmocka_unit_test_setup(peer_copies_need_no_peer_access, setup),
        cmocka_unit_test(kernel_without_peer_access_faults),
        cmocka_unit_test(disabled_peer_access_faults_again),
        cmocka_unit_test(vmm_without_access_for_the_device_faults),
        cmocka_unit_test(pool_memory_of_a_peer_faults),
        cmocka_unit_test(bad_device_counts_are_rejected),
        cmocka_unit_test(good_device_counts_are_accepted),
    };
    return cmocka_run_group_tests_name("sim_devices", tests, NULL, NULL);
}
