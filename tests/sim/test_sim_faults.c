/* test_sim_faults.c — device faults on the simulated GPU: a kernel or a copy
 * that touches memory with no mapping or no access is caught on the stream's
 * worker, names the address on stderr, counts in simcuda_stats.faults and
 * leaves the sticky CUDA_ERROR_ILLEGAL_ADDRESS that every later call returns.
 * A copy over the bus whose memory is remapped before it ends faults too.
 * Also misuse that would crash the process, and the failures SIMCUDA_FAIL
 * injects.
 *
 * A sticky error poisons the whole process, so every scenario runs in a
 * fork()ed child that initialises the driver itself (this parent never calls
 * CUDA, so the child starts clean) and reports through its exit status: 0 if
 * every check held, 1 with the failed check on stderr otherwise. The child's
 * stderr goes to a temporary file it can read back; CHECK failures go to the
 * real stderr.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

#define MiB  (1024ull * 1024)
#define GRAN (2 * MiB)

/* ---- the child side ---- */

static int real_stderr = -1;
static FILE *child_err;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            dprintf(real_stderr, "%s:%d: check failed in child: %s\n", __FILE__, __LINE__, #c);    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* What the child has written to stderr so far, NUL-terminated. */
static const char *child_stderr(void)
{
    static char buf[8192];
    fflush(stderr);
    long end = ftell(child_err);
    fseek(child_err, 0, SEEK_END);
    size_t n = (size_t)ftell(child_err);
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    fseek(child_err, 0, SEEK_SET);
    n = fread(buf, 1, n, child_err);
    buf[n] = '\0';
    fseek(child_err, end, SEEK_SET);
    return buf;
}

/* (uint32_t *dst, uint32_t value): *dst = value */
static void k_store(void **args)
{
    **(uint32_t **)args[0] = *(uint32_t *)args[1];
}
static void k_store_slow(void **args)
{
    k_store(args);
}
/* (uint32_t *dst, const uint32_t *src): *dst = *src */
static void k_load(void **args)
{
    **(uint32_t **)args[0] = **(const uint32_t **)args[1];
}

static CUcontext ctx;

static int init(void)
{
    const size_t sz[] = {sizeof(void *), sizeof(uint32_t)};
    const size_t pp[] = {sizeof(void *), sizeof(void *)};
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(simcuda_register_kernel(k_store, "k_store", 2, sz, 1) == 0);
    CHECK(simcuda_register_kernel(k_store_slow, "k_store_slow", 2, sz, 100 * 1000) == 0);
    CHECK(simcuda_register_kernel(k_load, "k_load", 2, pp, 1) == 0);
    return 0;
}

static CUresult store(simcuda_kernel_fn k, CUdeviceptr dst, uint32_t v, CUstream s)
{
    void *p = (void *)(uintptr_t)dst;
    void *args[] = {&p, &v};
    return cuLaunchKernel(simcuda_function(k), 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

/* A reservation of one granule with a device handle mapped in it, with the
 * given access (mapped only if map is set). */
static int mapping(CUdeviceptr *va, CUmemGenericAllocationHandle *h, int map,
                   CUmemAccess_flags access)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CHECK(cuMemAddressReserve(va, GRAN, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemCreate(h, GRAN, &p, 0) == CUDA_SUCCESS);
    if (!map)
        return 0;
    CHECK(cuMemMap(*va, GRAN, 0, *h, 0) == CUDA_SUCCESS);
    if (access != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        CUmemAccessDesc d;
        memset(&d, 0, sizeof d);
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.flags = access;
        CHECK(cuMemSetAccess(*va, GRAN, &d, 1) == CUDA_SUCCESS);
    }
    return 0;
}

static unsigned long long faults(void)
{
    simcuda_stats_t s;
    simcuda_get_stats(&s);
    return s.faults;
}

/* The stderr line names exactly this address. */
static int names_address(uintptr_t addr)
{
    char want[64];
    snprintf(want, sizeof want, "illegal address 0x%llx", (unsigned long long)addr);
    CHECK(strstr(child_stderr(), want) != NULL);
    return 0;
}

/* The stderr line names an address in [lo, lo + n). */
static int names_address_in(uintptr_t lo, size_t n)
{
    const char *s = strstr(child_stderr(), "illegal address 0x");
    CHECK(s != NULL);
    unsigned long long a = strtoull(s + strlen("illegal address "), NULL, 16);
    CHECK(a >= lo && a < lo + n);
    return 0;
}

/* Every call that the contract makes sticky, after a fault. */
static int everything_is_sticky(CUdeviceptr live_alloc, CUmemGenericAllocationHandle h)
{
    const CUresult X = CUDA_ERROR_ILLEGAL_ADDRESS;
    CUdeviceptr d = 0;
    CUstream s = NULL;
    CUevent e = NULL;
    CUdevice dev;
    CUcontext c;
    CUmemGenericAllocationHandle h2 = 0;
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    uint32_t word = 0;
    size_t a, b;
    void *hp = NULL;
    unsigned long long launches;
    simcuda_stats_t st;
    simcuda_get_stats(&st);
    launches = st.launches;

    for (int round = 0; round < 2; round++) {
        CHECK(cuCtxSynchronize() == X);
        CHECK(cuStreamSynchronize(NULL) == X);
        CHECK(cuInit(0) == X);
        CHECK(cuMemAlloc(&d, 4096) == X);
        CHECK(cuMemFree(live_alloc) == X);
        CHECK(cuMemcpyHtoD(live_alloc, &word, 4) == X);
        CHECK(cuMemcpyDtoH(&word, live_alloc, 4) == X);
        CHECK(cuMemsetD8(live_alloc, 0, 4) == X);
        CHECK(store(k_store, live_alloc, 5, NULL) == X);
        CHECK(cuStreamCreate(&s, 0) == X);
        CHECK(cuEventCreate(&e, 0) == X);
        CHECK(cuMemCreate(&h2, GRAN, &p, 0) == X);
        CHECK(cuMemRelease(h) == X);
        CHECK(cuMemAddressReserve(&d, GRAN, 0, 0, 0) == X);
        CHECK(cuMemHostAlloc(&hp, 4096, 0) == X);
        CHECK(cuMemGetInfo(&a, &b) == X);
        CHECK(cuDeviceGet(&dev, 0) == X);
        CHECK(cuCtxGetCurrent(&c) == X);
        CHECK(cuCtxSetCurrent(ctx) == X);
        /* And the runtime, which initialises on top of the faulted driver. */
        void *rp = NULL;
        CHECK(cudaMalloc(&rp, 16) == cudaErrorIllegalAddress);
        CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
        CHECK(cudaMemcpy(&word, (void *)(uintptr_t)live_alloc, 4, cudaMemcpyDeviceToHost) ==
              cudaErrorIllegalAddress);
        CHECK(cudaPeekAtLastError() == cudaErrorIllegalAddress);
        CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
        CHECK(cudaGetLastError() == cudaErrorIllegalAddress); /* cannot be cleared */
    }
    CHECK(d == 0 && s == NULL && e == NULL && h2 == 0 && hp == NULL);
    simcuda_get_stats(&st);
    CHECK(st.launches == launches);
    CHECK(st.faults == 1);
    return 0;
}

/* ---- scenarios ---- */

static int s_kernel_after_unmap(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0, live = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == 0);
    CHECK(cuMemAlloc(&live, 4096) == CUDA_SUCCESS);
    uint32_t v = 0;
    CHECK(store(k_store, va + 0x40, 0x1234, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH(&v, va + 0x40, 4) == CUDA_SUCCESS);
    CHECK(v == 0x1234);
    CHECK(faults() == 0);

    CHECK(cuMemUnmap(va, GRAN) == CUDA_SUCCESS);
    /* The launch is asynchronous: it succeeds; the fault comes later. */
    CHECK(store(k_store, va + 0x40, 0x5678, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address(va + 0x40) == 0);
    CHECK(everything_is_sticky(live, h) == 0);
    const char *s = NULL;
    CHECK(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &s) == CUDA_SUCCESS);
    CHECK(strcmp(s, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    return 0;
}

static int s_kernel_in_flight_when_unmapped(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == 0);
    CUstream s = NULL;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(store(k_store_slow, va + GRAN - 4, 1, s) == CUDA_SUCCESS);
    /* Unmapping does not wait for the kernel that still uses the range. */
    CHECK(cuMemUnmap(va, GRAN) == CUDA_SUCCESS);
    CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address(va + GRAN - 4) == 0);
    CHECK(cuStreamQuery(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
    return 0;
}

static int s_copy_from_mapping_without_access(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    char buf[64];
    CHECK(cuMemcpyDtoH(buf, va, sizeof buf) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address_in(va, sizeof buf) == 0);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    return 0;
}

static int s_copy_into_reserved_unmapped_range(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    char buf[64] = "data";
    CUstream s = NULL;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuMemcpyHtoDAsync(va + 4096, buf, sizeof buf, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address_in(va + 4096, sizeof buf) == 0);
    return 0;
}

/* A copy over the bus (SIMCUDA_PCIE_GBPS=0.04: a granule takes about 50 ms)
 * whose device memory is remapped between its issue and its end faults;
 * the same copy left alone lands. */
static int s_copy_in_flight_when_remapped(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == 0);
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CHECK(cuMemCreate(&h2, GRAN, &p, 0) == CUDA_SUCCESS);
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    unsigned char *host = NULL;
    CHECK(cuMemHostAlloc((void **)&host, GRAN, 0) == CUDA_SUCCESS);
    memset(host, 7, GRAN);
    CUstream s = NULL;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuMemcpyHtoDAsync(va, host, GRAN, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(faults() == 0);
    simcuda_stats_t st;
    simcuda_get_stats(&st); /* what it took: never less than 40 bytes a microsecond allow */
    CHECK(st.bytes_h2d == GRAN && st.us_h2d >= GRAN / 40 && st.us_d2h == 0);
    CHECK(cuMemcpyDtoHAsync(host, va, GRAN, s) == CUDA_SUCCESS);
    CHECK(cuMemUnmap(va, GRAN) == CUDA_SUCCESS);
    CHECK(cuMemMap(va, GRAN, 0, h2, 0) == CUDA_SUCCESS);
    CHECK(cuMemSetAccess(va, GRAN, &d, 1) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address(va) == 0);
    CHECK(strstr(child_stderr(), "a copy whose memory was remapped") != NULL);
    return 0;
}

static int s_memset_without_access(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    CHECK(cuMemsetD32(va + 256, 7, 16) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address_in(va + 256, 64) == 0);
    return 0;
}

static int s_write_to_read_only_mapping(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == 0);
    CHECK(store(k_store, va + 8, 0xbeef, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    CHECK(cuMemSetAccess(va, GRAN, &d, 1) == CUDA_SUCCESS);
    /* Reading is allowed ... */
    uint32_t *out = NULL;
    CHECK(cuMemHostAlloc((void **)&out, 4096, 0) == CUDA_SUCCESS);
    const uint32_t *src = (const uint32_t *)(uintptr_t)(va + 8);
    void *args[] = {&out, &src};
    CHECK(cuLaunchKernel(simcuda_function(k_load), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL) ==
          CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(*out == 0xbeef);
    CHECK(faults() == 0);
    /* ... writing is not. */
    CHECK(store(k_store, va + 8, 1, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    CHECK(names_address(va + 8) == 0);
    return 0;
}

static int s_work_after_a_fault_does_not_run(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    uint32_t *flag = NULL;
    CHECK(cuMemHostAlloc((void **)&flag, 4096, 0) == CUDA_SUCCESS);
    *flag = 0;
    CUstream s = NULL;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(store(k_store_slow, va, 1, s) == CUDA_SUCCESS);
    CHECK(store(k_store, (CUdeviceptr)(uintptr_t)flag, 0xf1a9, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(*flag == 0);
    CHECK(faults() == 1);
    return 0;
}

static int s_runtime_launch_fault(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    uint32_t *p = (uint32_t *)(uintptr_t)(va + 12);
    uint32_t v = 3;
    void *args[] = {&p, &v};
    CHECK(cudaLaunchKernel((const void *)k_store, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0,
                           NULL) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(strcmp(cudaGetErrorString(cudaErrorIllegalAddress),
                 "an illegal memory access was encountered") == 0);
    CHECK(cudaMalloc((void **)&p, 16) == cudaErrorIllegalAddress);
    CHECK(names_address(va + 12) == 0);
    CHECK(faults() == 1);
    return 0;
}

/* A GPU fault is not a signal of the host process: an application's own
 * SIGSEGV handler, installed after initialisation (as a test framework or a
 * crash reporter does), must not see it. */
static void exit_77(int sig)
{
    (void)sig;
    _exit(77);
}

static int s_fault_with_an_application_handler_installed_later(void)
{
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_77;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0);
    CHECK(store(k_store, va, 1, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(faults() == 1);
    return 0;
}

/* A fault of the host's own code is not a device fault: it goes to the
 * handler the application had, and leaves the context alone. */
static sigjmp_buf host_fault_jmp;
static volatile sig_atomic_t host_faults;

static void on_host_fault(int sig, siginfo_t *info, void *uc)
{
    (void)sig;
    (void)info;
    (void)uc;
    host_faults++;
    siglongjmp(host_fault_jmp, 1);
}

static int s_host_fault_goes_to_the_application(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_host_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
    CHECK(init() == 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    if (sigsetjmp(host_fault_jmp, 1) == 0) {
        *(volatile char *)(uintptr_t)va = 1;
        CHECK(!"the host store to a mapping without access did not fault");
    }
    CHECK(host_faults == 1);
    CHECK(faults() == 0);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    /* And the device still faults on its own. */
    CHECK(store(k_store, va, 1, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(host_faults == 1);
    CHECK(faults() == 1);
    return 0;
}

/* cuda.h, cuMemUnmap: "cuMemUnmap cannot unmap a sub-range of an address
 * range mapped by cuMemCreate / cuMemMap"; memory from cuMemAlloc was never
 * mapped by cuMemMap, and is released by cuMemFree. Run with a 4 KiB
 * granularity so that any cuMemAlloc address is aligned enough to ask. */
static int s_cuMemAlloc_memory_is_not_unmappable(void)
{
    CHECK(init() == 0);
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc(&d, 4096) == CUDA_SUCCESS);
    CHECK(cuMemUnmap(d, 4096) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    return 0;
}

/* ---- injected failures (SIMCUDA_FAIL, see sim.h and README) ---- */

/* SIMCUDA_FAIL=cuMemMap:2:CUDA_ERROR_OUT_OF_MEMORY,cuMemAlloc:3+,cuEventCreate:1:2,bogus */
static int s_injected_failures(void)
{
    CHECK(init() == 0);
    CHECK(strstr(child_stderr(), "SIMCUDA_FAIL: cannot use 'bogus'") != NULL);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(mapping(&va, &h, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE) == 0);
    CUdeviceptr va2 = 0;
    CHECK(cuMemAddressReserve(&va2, GRAN, 0, 0, 0) == CUDA_SUCCESS);
    /* The nth call fails, valid as it is; the ones around it do not. */
    CHECK(cuMemMap(va, GRAN, 0, h, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va2, GRAN, 0, h, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(child_stderr(),
                 "injected failure of cuMemMap (call 2): CUDA_ERROR_OUT_OF_MEMORY") != NULL);
    CHECK(cuMemMap(va2, GRAN, 0, h, 0) == CUDA_SUCCESS);
    /* With '+', every call from the nth on; cuMemAlloc_v2 counts as cuMemAlloc. */
    CUdeviceptr d[4] = {0, 0, 0, 0};
    CHECK(cuMemAlloc(&d[0], 4096) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&d[1], 4096) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&d[2], 4096) == CUDA_ERROR_UNKNOWN);
    CHECK(cuMemAlloc(&d[3], 4096) == CUDA_ERROR_UNKNOWN);
    CHECK(d[2] == 0 && d[3] == 0);
    /* An error given by number. */
    CUevent ev = NULL;
    CHECK(cuEventCreate(&ev, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(ev == NULL);
    CHECK(cuEventCreate(&ev, 0) == CUDA_SUCCESS);
    /* simcuda_fail_clear ends every rule, persistent ones too. */
    CHECK(cuMemAlloc(&d[2], 4096) == CUDA_ERROR_UNKNOWN);
    simcuda_fail_clear();
    CHECK(cuMemAlloc(&d[2], 4096) == CUDA_SUCCESS);
    CHECK(cuMemFree(d[2]) == CUDA_SUCCESS);
    /* Injected failures are not sticky, and nothing faulted. */
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(faults() == 0);
    CHECK(cuMemFree(d[0]) == CUDA_SUCCESS);
    CHECK(cuMemUnmap(va, GRAN) == CUDA_SUCCESS);
    CHECK(cuMemUnmap(va2, GRAN) == CUDA_SUCCESS);
    return 0;
}

/* SIMCUDA_FAIL=cuptiSubscribe:1 */
static void CUPTIAPI no_callback(void *u, CUpti_CallbackDomain d, CUpti_CallbackId c,
                                 const void *data)
{
    (void)u;
    (void)d;
    (void)c;
    (void)data;
}

static int s_injected_cupti_failure(void)
{
    CHECK(init() == 0);
    CUpti_SubscriberHandle sub = NULL;
    CHECK(cuptiSubscribe(&sub, no_callback, NULL) == CUPTI_ERROR_NOT_INITIALIZED);
    CHECK(cuptiSubscribe(&sub, no_callback, NULL) == CUPTI_SUCCESS);
    CHECK(cuptiUnsubscribe(sub) == CUPTI_SUCCESS);
    return 0;
}

/* README: "the nth call of a driver function" fails: cuStreamCreate and
 * cuStreamCreateWithPriority are driver functions like any other.
 * SIMCUDA_FAIL=cuStreamCreate:1:CUDA_ERROR_OUT_OF_MEMORY,cuStreamCreateWithPriority:1 */
static int s_injection_reaches_stream_creation(void)
{
    CHECK(init() == 0);
    CUstream st = NULL;
    CHECK(cuStreamCreate(&st, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuStreamCreateWithPriority(&st, 0, -1) == CUDA_ERROR_UNKNOWN);
    CHECK(st == NULL);
    return 0;
}

/* README: the error is "a CUresult name or number".
 * SIMCUDA_FAIL=cuLaunchKernel:1:CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES */
static int s_injection_takes_any_cuResult_name(void)
{
    CHECK(init() == 0);
    CHECK(strstr(child_stderr(), "cannot use") == NULL);
    uint32_t *p = NULL;
    CHECK(cuMemHostAlloc((void **)&p, 4096, 0) == CUDA_SUCCESS);
    CHECK(store(k_store, (CUdeviceptr)(uintptr_t)p, 1, NULL) == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    return 0;
}

/* sim.h: "Calls are counted whatever their outcome".
 * SIMCUDA_FAIL=cuMemAlloc:2 */
static void *alloc_without_context(void *arg)
{
    CUdeviceptr d = 0;
    *(CUresult *)arg = cuMemAlloc(&d, 4096);
    return NULL;
}

static int s_injection_counts_every_call(void)
{
    CHECK(init() == 0);
    CUresult first = CUDA_SUCCESS;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, alloc_without_context, &first) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(first == CUDA_ERROR_INVALID_CONTEXT); /* call 1 */
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc(&d, 4096) == CUDA_ERROR_UNKNOWN); /* call 2 */
    return 0;
}

/* ---- the parent side ---- */

/* Runs fn in a fork()ed child with no SIMCUDA_* variables but the given
 * (name, value) pairs; returns its exit status, or 128 + the signal. */
static int in_child(int (*fn)(void), const char *const *vars)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        static const char *const all[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                          "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                          "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            unsetenv(all[i]);
        for (size_t i = 0; vars && vars[i]; i += 2)
            setenv(vars[i], vars[i + 1], 1);
        real_stderr = dup(STDERR_FILENO);
        child_err = tmpfile();
        if (real_stderr < 0 || !child_err)
            _exit(3);
        dup2(fileno(child_err), STDERR_FILENO);
        int rc = fn();
        fflush(stderr);
        _exit(rc);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

#define SCENARIO(name, fn, want)                                                                   \
    static void name(void **state)                                                                 \
    {                                                                                              \
        (void)state;                                                                               \
        assert_int_equal(in_child(fn, NULL), want);                                                \
    }

SCENARIO(kernel_access_after_unmap_is_a_sticky_illegal_address, s_kernel_after_unmap, 0)
SCENARIO(kernel_in_flight_when_its_range_is_unmapped_faults, s_kernel_in_flight_when_unmapped, 0)
SCENARIO(copy_from_a_mapping_without_access_faults, s_copy_from_mapping_without_access, 0)
SCENARIO(copy_into_a_reserved_unmapped_range_faults, s_copy_into_reserved_unmapped_range, 0)
SCENARIO(memset_of_a_mapping_without_access_faults, s_memset_without_access, 0)
SCENARIO(kernel_write_to_a_read_only_mapping_faults, s_write_to_read_only_mapping, 0)
SCENARIO(work_queued_after_a_fault_does_not_run, s_work_after_a_fault_does_not_run, 0)
SCENARIO(runtime_launch_fault_is_sticky_in_the_runtime, s_runtime_launch_fault, 0)
SCENARIO(device_fault_is_caught_with_an_application_handler_installed_later,
         s_fault_with_an_application_handler_installed_later, 0)
SCENARIO(host_fault_goes_to_the_applications_handler, s_host_fault_goes_to_the_application, 0)

static void copy_in_flight_when_its_memory_is_remapped_faults(void **state)
{
    (void)state;
    static const char *const vars[] = {"SIMCUDA_PCIE_GBPS", "0.04", NULL};
    assert_int_equal(in_child(s_copy_in_flight_when_remapped, vars), 0);
}

static void cuMemAlloc_memory_cannot_be_unmapped(void **state)
{
    (void)state;
    static const char *const vars[] = {"SIMCUDA_GRANULARITY_KB", "4", NULL};
    assert_int_equal(in_child(s_cuMemAlloc_memory_is_not_unmappable, vars), 0);
}

static void injected_failures_hit_the_nth_call(void **state)
{
    (void)state;
    static const char *const vars[] = {
        "SIMCUDA_FAIL", "cuMemMap:2:CUDA_ERROR_OUT_OF_MEMORY,cuMemAlloc:3+,cuEventCreate:1:2,bogus",
        NULL};
    assert_int_equal(in_child(s_injected_failures, vars), 0);
}

static void injected_cupti_subscribe_failure(void **state)
{
    (void)state;
    static const char *const vars[] = {"SIMCUDA_FAIL", "cuptiSubscribe:1", NULL};
    assert_int_equal(in_child(s_injected_cupti_failure, vars), 0);
}

static void injection_reaches_stream_creation(void **state)
{
    (void)state;
    static const char *const vars[] = {
        "SIMCUDA_FAIL", "cuStreamCreate:1:CUDA_ERROR_OUT_OF_MEMORY,cuStreamCreateWithPriority:1",
        NULL};
    assert_int_equal(in_child(s_injection_reaches_stream_creation, vars), 0);
}

static void injection_takes_any_cuResult_name(void **state)
{
    (void)state;
    static const char *const vars[] = {"SIMCUDA_FAIL",
                                       "cuLaunchKernel:1:CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", NULL};
    assert_int_equal(in_child(s_injection_takes_any_cuResult_name, vars), 0);
}

static void injection_counts_calls_refused_for_want_of_a_context(void **state)
{
    (void)state;
    static const char *const vars[] = {"SIMCUDA_FAIL", "cuMemAlloc:2", NULL};
    assert_int_equal(in_child(s_injection_counts_every_call, vars), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_access_after_unmap_is_a_sticky_illegal_address),
        cmocka_unit_test(kernel_in_flight_when_its_range_is_unmapped_faults),
        cmocka_unit_test(copy_from_a_mapping_without_access_faults),
        cmocka_unit_test(copy_into_a_reserved_unmapped_range_faults),
        cmocka_unit_test(copy_in_flight_when_its_memory_is_remapped_faults),
        cmocka_unit_test(memset_of_a_mapping_without_access_faults),
        cmocka_unit_test(kernel_write_to_a_read_only_mapping_faults),
        cmocka_unit_test(work_queued_after_a_fault_does_not_run),
        cmocka_unit_test(runtime_launch_fault_is_sticky_in_the_runtime),
        cmocka_unit_test(device_fault_is_caught_with_an_application_handler_installed_later),
        cmocka_unit_test(host_fault_goes_to_the_applications_handler),
        cmocka_unit_test(cuMemAlloc_memory_cannot_be_unmapped),
        cmocka_unit_test(injected_failures_hit_the_nth_call),
        cmocka_unit_test(injected_cupti_subscribe_failure),
        cmocka_unit_test(injection_reaches_stream_creation),
        cmocka_unit_test(injection_takes_any_cuResult_name),
        cmocka_unit_test(injection_counts_calls_refused_for_want_of_a_context),
    };
    return cmocka_run_group_tests_name("sim_faults", tests, NULL, NULL);
}
