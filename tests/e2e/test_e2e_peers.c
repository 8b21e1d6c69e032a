/* test_e2e_peers.c — two simulated GPUs in one process.
 *
 * Allocations go where the program asks: stagehand_malloc's device
 * argument, the current device for cudaMalloc, the stream's device for
 * cudaMallocAsync; the managed device's are regions, another device's are
 * CUDA's own on that device, freed there, and the caller's current device
 * is left as it was.
 *
 * Peer access: a kernel on device 0 reads and writes a region of device 1
 * (the managed one) through peer access, while that region is evicted and
 * restored: the simulated GPU faults a kernel whose parameters point into
 * a VMM mapping without access for its device, so every mapping the
 * library makes (device chunks and host slabs at the region's address)
 * must carry the peer's access, whether peer access was enabled before the
 * region existed or after it was evicted. Disabling peer access takes it
 * away again: the next such kernel faults. A slow kernel on device 0 still
 * writing the region while it is evicted must be waited for (the
 * simulated GPU faults a kernel whose memory is remapped while it runs),
 * with either drain mode, scanned or not. So must copies of a region
 * issued on device 0's stream, which need no peer access. Peer access is
 * enabled and disabled by every route: the runtime, the driver called
 * directly, and the driver found by cuGetProcAddress,
 * cudaGetDriverEntryPointByVersion and dlsym.
 *
 * Every case runs in a child of its own (this program again, the case
 * named in E2E_PEERS_CASE): a fault is sticky to its device, and the
 * library picks its device once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "twogpu.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FILL 64

static int preloaded;
static char **saved_argv;

static cudaError_t bump(void *p)
{
    size_t n = WORDS;
    void *args[] = {&p, &n};
    return cudaLaunchKernel((const void *)k_bump, one, one, args, 0, NULL);
}

/* ---- peer access, by the route E2E_PEERS_ROUTE names ---- */

typedef CUresult (*peer_fn)(CUcontext, unsigned int);
typedef CUresult (*unpeer_fn)(CUcontext);

/* The driver's function as the route finds it: a direct call, its
 * cuGetProcAddress, cudaGetDriverEntryPointByVersion or dlsym lookup;
 * NULL for the runtime's. */
static void *driver_fn(const char *name)
{
    const char *route = getenv("E2E_PEERS_ROUTE");
    void *f = NULL;
    if (!route || strcmp(route, "runtime") == 0)
        return NULL;
    if (strcmp(route, "driver") == 0)
        return strcmp(name, "cuCtxEnablePeerAccess") == 0 ? (void *)cuCtxEnablePeerAccess
                                                          : (void *)cuCtxDisablePeerAccess;
    if (strcmp(route, "proc") == 0) {
        CUdriverProcAddressQueryResult q;
        assert_int_equal(cuGetProcAddress(name, &f, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q),
                         CUDA_SUCCESS);
    } else if (strcmp(route, "entry") == 0) {
        enum cudaDriverEntryPointQueryResult q;
        assert_int_equal(cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q),
                         cudaSuccess);
    } else {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        assert_non_null(h);
        f = dlsym(h, name);
    }
    assert_non_null(f);
    return f;
}

static CUcontext primary(int dev)
{
    CUcontext c = NULL;
    assert_int_equal(cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    return c;
}

/* The current device opens, or closes, its access to peer's memory. */
static void enable_peer(int peer)
{
    peer_fn f = (peer_fn)driver_fn("cuCtxEnablePeerAccess");
    if (f)
        assert_int_equal(f(primary(peer), 0), CUDA_SUCCESS);
    else
        assert_int_equal(cudaDeviceEnablePeerAccess(peer, 0), cudaSuccess);
}

static void disable_peer(int peer)
{
    unpeer_fn f = (unpeer_fn)driver_fn("cuCtxDisablePeerAccess");
    if (f)
        assert_int_equal(f(primary(peer)), CUDA_SUCCESS);
    else
        assert_int_equal(cudaDeviceDisablePeerAccess(peer), cudaSuccess);
}

/* ---- helpers ---- */

static size_t free_on(int dev)
{
    int was = current();
    size_t f = 0, t = 0;
    assert_int_equal(cudaSetDevice(dev), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemGetInfo(&f, &t), cudaSuccess);
    assert_int_equal(cudaSetDevice(was), cudaSuccess);
    return f;
}

/* Device dev's access to every granule of the region at p. */
static unsigned long long access_of(const void *p, int dev)
{
    CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    unsigned long long first = 99;
    for (size_t off = 0; off < REGION_MB * MiB; off += 2 * MiB) {
        unsigned long long fl = 99;
        assert_int_equal(cuMemGetAccess(&fl, &l, (CUdeviceptr)(uintptr_t)p + off), CUDA_SUCCESS);
        if (off == 0)
            first = fl;
        assert_int_equal(fl, first); /* one answer for the whole region */
    }
    return first;
}

/* Allocates regions on the managed device (device 1, through
 * stagehand_malloc, from whichever device is current) until a is evicted;
 * they go to more[]. */
static int push_out(const void *a, void **more)
{
    int n = 0;
    while (n < MAX_FILL && residency(a) == 1) {
        more[n] = pmalloc(REGION_MB * MiB, 1);
        assert_non_null(more[n]);
        n++;
    }
    assert_int_equal(residency(a), 0);
    return n;
}

static void free_all(void **more, int n)
{
    for (int i = 0; i < n; i++)
        pfree(more[i], REGION_MB * MiB, 1);
}

/* A region on device 1, filled with v + i by a kernel there. */
static void *region_on_1(uint32_t v)
{
    void *r = NULL;
    int was = current();
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc(&r, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(residency(r), 1);
    assert_int_equal(device_of(r), 1);
    assert_int_equal(fill_on(k_fill, r, v, NULL), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaSetDevice(was), cudaSuccess);
    return r;
}

/* ---- the cases (children) ---- */

/* Device 0 is managed (current at the first allocation); every path asked
 * for device 1 gets device 1's own memory, freed there. */
/* stderr goes to a file from here on; what was written, read back. */
static int log_to_file(void)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(f), STDERR_FILENO) >= 0);
    return saved;
}

static size_t read_log(int saved, char *buf, size_t cap)
{
    assert_true(lseek(STDERR_FILENO, 0, SEEK_SET) == 0);
    ssize_t n = read(STDERR_FILENO, buf, cap - 1);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    buf[n > 0 ? n : 0] = '\0';
    return n > 0 ? (size_t)n : 0;
}

static size_t count_of(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static void case_alloc(void)
{
    void *a = NULL, *b = NULL, *c = NULL;
    /* How a rank of a job learns that its first allocation chose the
     * managed device: a line, once for device 1, naming it and the fix. */
    setenv("LOCAL_RANK", "1", 1);
    int saved = log_to_file();
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMalloc(&a, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(residency(a), 1);
    assert_int_equal(device_of(a), 0);
    size_t f1 = free_on(1);

    /* stagehand_malloc for device 1, device 0 current */
    void *p = pmalloc(REGION_MB * MiB, 1);
    assert_non_null(p);
    assert_int_equal(current(), 0);
    assert_int_equal(residency(p), -1);
    assert_int_equal(device_of(p), 1);
    assert_true(free_on(1) <= f1 - REGION_MB * MiB);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(fill_on(k_fill, p, 9, NULL), cudaSuccess); /* device 1 reaches it */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    check(p, 9, 0);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    pfree(p, REGION_MB * MiB, 1);
    assert_int_equal(current(), 0);
    assert_int_equal(free_on(1), f1);

    /* stagehand_malloc for device 0, device 1 current: a region */
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    p = pmalloc(REGION_MB * MiB, 0);
    assert_non_null(p);
    assert_int_equal(current(), 1);
    assert_int_equal(residency(p), 1);
    pfree(p, REGION_MB * MiB, 0);
    assert_int_equal(residency(p), -1);

    /* cudaMalloc with device 1 current */
    assert_int_equal(cudaMalloc(&b, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(residency(b), -1);
    assert_int_equal(device_of(b), 1);
    assert_int_equal(cudaFree(b), cudaSuccess);
    assert_int_equal(free_on(1), f1);

    /* cudaMallocAsync on a device-1 stream, device 0 current, and on a
     * device-0 stream, device 1 current */
    cudaStream_t s1, s0;
    assert_int_equal(cudaStreamCreate(&s1), cudaSuccess); /* device 1 is current */
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s0), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&c, REGION_MB * MiB, s1), cudaSuccess);
    assert_int_equal(residency(c), -1);
    assert_int_equal(device_of(c), 1);
    assert_int_equal(cudaFreeAsync(c, s1), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
    assert_int_equal(free_on(1), f1);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&c, REGION_MB * MiB, s0), cudaSuccess);
    assert_int_equal(residency(c), 1);
    assert_int_equal(device_of(c), 0);
    assert_int_equal(cudaFreeAsync(c, s0), cudaSuccess);
    assert_int_equal(free_on(1), f1);

    /* a device that is not there: nothing allocated, nothing changed, no
     * error left for the program's next call to find */
    assert_null(pmalloc(REGION_MB * MiB, 7));
    assert_int_equal(current(), 1);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s0), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
    assert_int_equal(cudaFree(a), cudaSuccess);
    char log[8192];
    read_log(saved, log, sizeof log);
    assert_int_equal(count_of(log, "device 1 is not managed"), 1);
    assert_non_null(strstr(log, "stagehand manages device 0 (current at the first allocation, "
                                "LOCAL_RANK is 1); set [general] device = 1"));
    assert_int_equal(count_of(log, "device 7 is not managed"), 0); /* there is none */
}

/* Device 1 is managed; device 0 opens it (before the region exists, or
 * once it is evicted) and works on the region while it moves. */
static void case_peer_kernel(int late)
{
    void *more[MAX_FILL];
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    if (!late)
        enable_peer(1);
    void *r = region_on_1(40);
    int n = push_out(r, more);
    if (late) {
        assert_int_equal(access_of(r, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
        enable_peer(1);
    }
    /* the host slabs at its address are open to device 0 */
    assert_int_equal(access_of(r, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(access_of(r, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    /* a kernel on device 0 brings it back (new device chunks) and uses it */
    assert_int_equal(current(), 0);
    assert_int_equal(bump(r), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(residency(r), 1);
    assert_int_equal(access_of(r, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    check(r, 40, 1);
    /* out and back once more, the second time by device 0 writing it */
    free_all(more, n);
    n = push_out(r, more);
    assert_int_equal(fill_on(k_fill, r, 77, NULL), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    check(r, 77, 0);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    free_all(more, n);
    assert_int_equal(cudaFree(r), cudaSuccess);
}

/* Peer access disabled: every mapping of the region is closed to device
 * 0 again, evicted or not, and a kernel there faults; device 1's bytes are
 * untouched. */
static void case_peer_disabled(void)
{
    void *more[MAX_FILL];
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    enable_peer(1);
    void *r = region_on_1(5), *q = region_on_1(6);
    assert_int_equal(bump(r), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    int n = push_out(q, more);
    assert_int_equal(access_of(q, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    disable_peer(1);
    assert_int_equal(access_of(q, 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(access_of(more[0], 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(access_of(q, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(bump(more[0]), cudaSuccess); /* launched; it faults as it runs */
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    check(q, 6, 0);
    check(r, 5, 1);
    free_all(more, n);
}

/* A slow kernel on device 0 writes the region while allocations on device
 * 1 evict it: the eviction must wait for the kernel. scanned: something is
 * off the device already, so the launch is scanned (and, with a tracked
 * drain, the region remembers device 0's stream). */
static void case_in_flight(int scanned)
{
    void *more[MAX_FILL], *first[MAX_FILL];
    int nfirst = 0;
    cudaStream_t s;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    void *old = scanned ? region_on_1(1) : NULL;
    if (scanned)
        nfirst = push_out(old, first);
    void *r = region_on_1(2);
    assert_int_equal(fill_on(k_fill_slow, r, 99, s), cudaSuccess);
    int n = push_out(r, more); /* the kernel is still running */
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    check(r, 99, 0);
    if (scanned)
        check(old, 1, 0);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    free_all(more, n);
    free_all(first, nfirst);
}

/* Copies of a device-1 region on a device-0 stream, queued behind a slow
 * kernel there (on device 0's own memory), while the region is evicted:
 * no peer access names device 0, yet the eviction must wait for its
 * stream (the simulated GPU faults a copy whose memory is remapped before
 * it ends). other_current: issued with device 1 current, as a copy may be. */
static void case_copy_in_flight(int other_current)
{
    void *more[MAX_FILL], *buf0 = NULL;
    uint32_t *host = NULL;
    cudaStream_t s;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaMalloc(&buf0, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(residency(buf0), -1); /* device 0 is not managed */
    assert_int_equal(cudaMallocHost((void **)&host, REGION_MB * MiB), cudaSuccess);
    void *r = region_on_1(3), *w = region_on_1(4);
    for (size_t i = 0; i < WORDS; i++)
        host[i] = 50 + (uint32_t)i;
    assert_int_equal(fill_on(k_fill_slow, buf0, 0, s), cudaSuccess); /* keeps s busy */
    assert_int_equal(cudaSetDevice(other_current ? 1 : 0), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(w, host, REGION_MB * MiB, cudaMemcpyHostToDevice, s),
                     cudaSuccess);
    uint32_t *back = NULL;
    assert_int_equal(cudaMallocHost((void **)&back, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(back, r, REGION_MB * MiB, cudaMemcpyDeviceToHost, s),
                     cudaSuccess);
    int n = push_out(w, more); /* r, the older, goes first */
    assert_int_equal(residency(r), 0);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += back[i] != 3 + (uint32_t)i;
    assert_int_equal(bad, 0);
    assert_int_equal(cudaFreeHost(back), cudaSuccess);
    check(w, 50, 0);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaFreeHost(host), cudaSuccess);
    assert_int_equal(cudaFree(buf0), cudaSuccess);
    free_all(more, n);
}

static int run_case(const char *name)
{
    if (register_twogpu_kernels() != 0)
        return 1;
    if (strcmp(name, "alloc") == 0)
        case_alloc();
    else if (strcmp(name, "peer-early") == 0 || strcmp(name, "peer-late") == 0)
        case_peer_kernel(strcmp(name, "peer-late") == 0);
    else if (strcmp(name, "peer-disabled") == 0)
        case_peer_disabled();
    else if (strcmp(name, "in-flight") == 0 || strcmp(name, "in-flight-scanned") == 0)
        case_in_flight(strcmp(name, "in-flight-scanned") == 0);
    else if (strcmp(name, "copy") == 0 || strcmp(name, "copy-other-current") == 0)
        case_copy_in_flight(strcmp(name, "copy-other-current") == 0);
    else
        fail_msg("no case %s", name);
    return 0;
}

static void test_case(void **state)
{
    (void)state;
    const char *name = getenv("E2E_PEERS_CASE");
    if (!preloaded || !name)
        skip();
    assert_int_equal(run_case(name), 0);
}

/* ---- the parent ---- */

static int rerun_by(const char *name, const char *drain, int managed1, const char *route)
{
    char c[64], d[64], r[64];
    snprintf(c, sizeof c, "E2E_PEERS_CASE=%s", name);
    snprintf(d, sizeof d, "STAGEHAND_TRANSFER_DRAIN_MODE=%s", drain);
    snprintf(r, sizeof r, "E2E_PEERS_ROUTE=%s", route);
    /* copies take time on the bus (8 MB: 4 ms), so one can be caught in flight */
    const char *env[] = {
        c, d, r, "SIMCUDA_PCIE_GBPS=2", managed1 ? "STAGEHAND_GENERAL_DEVICE=1" : NULL, NULL};
    return e2e_rerun(saved_argv, env);
}

static int rerun(const char *name, const char *drain, int managed1)
{
    return rerun_by(name, drain, managed1, "runtime");
}

/* Every way a program reaches the peer-access calls. */
static const char *const routes[] = {"runtime", "driver", "proc", "entry", "dlsym"};

#define PARENT()                                                                                   \
    do {                                                                                           \
        if (!preloaded || getenv("E2E_PEERS_CASE"))                                                \
            skip();                                                                                \
    } while (0)

static void test_alloc_follows_the_device(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("alloc", "device", 0), 0);
}

static void test_peer_kernel_while_moved(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("peer-early", "device", 1), 0);
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        assert_int_equal(rerun_by("peer-late", i % 2 ? "device" : "tracked", 1, routes[i]), 0);
}

static void test_peer_access_disabled(void **state)
{
    (void)state;
    PARENT();
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        assert_int_equal(rerun_by("peer-disabled", "device", 1, routes[i]), 0);
}

static void test_peer_kernel_in_flight(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("in-flight", "device", 1), 0);
    assert_int_equal(rerun("in-flight", "tracked", 1), 0);
    assert_int_equal(rerun("in-flight-scanned", "device", 1), 0);
    assert_int_equal(rerun("in-flight-scanned", "tracked", 1), 0);
}

static void test_copy_from_another_device_in_flight(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("copy", "device", 1), 0);
    assert_int_equal(rerun("copy-other-current", "device", 1), 0);
    assert_int_equal(rerun("copy", "tracked", 1), 0);
    assert_int_equal(rerun("copy-other-current", "tracked", 1), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_PEERS_CONFIGURED")) {
        setenv("E2E_PEERS_CONFIGURED", "1", 1);
        setenv("SIMCUDA_DEVICES", "2", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_CONFIG", "/dev/null", 1); /* the built-in defaults */
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_case),
        cmocka_unit_test(test_alloc_follows_the_device),
        cmocka_unit_test(test_peer_kernel_while_moved),
        cmocka_unit_test(test_peer_access_disabled),
        cmocka_unit_test(test_peer_kernel_in_flight),
        cmocka_unit_test(test_copy_from_another_device_in_flight),
    };
    return cmocka_run_group_tests_name(preloaded ? "e2e_peers (preloaded)" : "e2e_peers (disabled)",
                                       tests, NULL, NULL);
}
