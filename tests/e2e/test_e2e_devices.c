/* test_e2e_devices.c — [general] devices = all: two simulated GPUs in one
 * process, each managed, each with its own pool and budget.
 *
 * Allocations on either device become regions of that device, by every
 * path (cudaMalloc with it current, cudaMallocAsync on its stream,
 * stagehand_malloc naming it), and report it (pointer attributes). Filling
 * one device's budget evicts that device's regions and no other's; a
 * kernel on each device brings its regions back with their bytes. A
 * region of one device is freed with the other current. A kernel on
 * device 0 works through peer access on a region of device 1 while it is
 * evicted, and a slow one still writing it while device 1's allocations
 * evict it is waited for, and so is a copy of it on device 0's stream,
 * which needs no peer access. A kernel on device 0 follows a pointer, read
 * from a table in device 0's memory, into a region of device 1 that is on
 * the host: its write is kept. With devices = one (the default) device 1
 * is not managed (test_e2e_peers covers that side). stagehand-top --json
 * lists both devices, each with its own budget and evictions. A window on
 * device 1 holds back no work on device 0 that cannot reach device 1's
 * regions (a kernel on device 1 waits for one on device 0 while device
 * 1's eviction drains it), and holds back a kernel on device 0 once peer
 * access lets it reach them.
 *
 * Every case runs in a child of its own (this program again, the case
 * named in E2E_DEVICES_CASE): a fault is sticky to its device.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "twogpu.h"

#include "stagehand.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <json-c/json.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define BUDGET_MB 64
#define BUMP_US   20000 /* a bump that a move's window could overlap */
#define MAX_FILL  64

static int preloaded;
static char **saved_argv;

/* ---- kernels ---- */

static void k_bump_slow(void **a)
{
    k_bump(a);
}

/* bump_via(table, n): the same on the region whose address table[0] holds */
static void k_bump_via(void **a)
{
    uint32_t *p = **(uint32_t ***)a[0];
    size_t n = *(size_t *)a[1];
    for (size_t i = 0; i < n; i++)
        p[i] = p[i] * 3 + 1;
}

/* wait_go(flag, n): spins until a kernel elsewhere sets *flag, or gives
 * up after wait_go_s (spin_gave_up), so that a test that would hang fails */
#define WAIT_GO_S 10
static double wait_go_s = WAIT_GO_S;
static atomic_int spin_gave_up;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void k_wait_go(void **a)
{
    atomic_int *go = *(atomic_int **)a[0];
    double until = now_s() + wait_go_s;
    while (!atomic_load(go)) {
        if (now_s() > until) {
            atomic_store(&spin_gave_up, 1);
            return;
        }
        sched_yield();
    }
}

/* set_go(flag, n): *flag = 1 */
static void k_set_go(void **a)
{
    atomic_store(*(atomic_int **)a[0], 1);
}

static int register_kernels(void)
{
    size_t two[] = {sizeof(void *), sizeof(size_t)};
    if (register_twogpu_kernels() != 0 ||
        simcuda_register_kernel(k_bump_via, "bump_via", 2, two, 0) != 0 ||
        simcuda_register_kernel(k_wait_go, "wait_go", 2, two, 0) != 0 ||
        simcuda_register_kernel(k_set_go, "set_go", 2, two, 0) != 0)
        return -1;
    return simcuda_register_kernel(k_bump_slow, "bump_slow", 2, two, BUMP_US);
}

static cudaError_t launch2(simcuda_kernel_fn k, void *p)
{
    return launch2_on(k, p, NULL);
}

/* ---- helpers ---- */

/* A region on dev by cudaMalloc (dev current meanwhile), filled with v + i
 * by a kernel there. */
static void *region_on(int dev, uint32_t v)
{
    void *r = NULL;
    int was = current();
    assert_int_equal(cudaSetDevice(dev), cudaSuccess);
    assert_int_equal(cudaMalloc(&r, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(residency(r), 1);
    assert_int_equal(device_of(r), dev);
    assert_int_equal(fill_on(k_fill, r, v, NULL), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaSetDevice(was), cudaSuccess);
    return r;
}

/* Allocates regions on dev (stagehand_malloc, whichever device is
 * current) until a is evicted; they go to more[]. */
static int push_out(int dev, const void *a, void **more)
{
    int n = 0;
    while (n < MAX_FILL && residency(a) == 1) {
        more[n] = pmalloc(REGION_MB * MiB, dev);
        assert_non_null(more[n]);
        assert_int_equal(device_of(more[n]), dev);
        n++;
    }
    assert_int_equal(residency(a), 0);
    return n;
}

static void free_all(int dev, void **more, int n)
{
    for (int i = 0; i < n; i++)
        pfree(more[i], REGION_MB * MiB, dev);
}

/* cudaMemGetInfo with dev current: the budget view of that device. */
static void info_on(int dev, size_t *f, size_t *t)
{
    int was = current();
    assert_int_equal(cudaSetDevice(dev), cudaSuccess);
    assert_int_equal(cudaMemGetInfo(f, t), cudaSuccess);
    assert_int_equal(cudaSetDevice(was), cudaSuccess);
}

/* stagehand-top --json on this process: its devices list. */
static json_object *top_devices(json_object **whole)
{
    const char *build = getenv("STAGEHAND_TEST_BUILD");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/stagehand-top --json -p %d", build ? build : "build",
             (int)getpid());
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    assert_int_equal(pclose(f), 0);
    *whole = json_tokener_parse(buf);
    json_object *devs = NULL;
    if (!*whole || !json_object_object_get_ex(*whole, "devices", &devs))
        fail_msg("stagehand-top --json: no devices list in %.200s", buf);
    return devs;
}

static int64_t field(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v))
        fail_msg("stagehand-top --json: no '%s' where one was expected", key);
    return json_object_get_int64(v);
}

/* Device 1's moves in flight (prefetches and early evictions started), in
 * stagehand-top --json, once there are any (asked again until the
 * publisher has caught up, for at most 10 s). */
static int64_t device1_moves(void)
{
    struct timespec t0, now, nap = {0, 50 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        json_object *whole = NULL, *devs = top_devices(&whole);
        int64_t v = 0;
        for (size_t i = 0; i < json_object_array_length(devs); i++)
            if (field(json_object_array_get_idx(devs, i), "device") == 1)
                v = field(json_object_array_get_idx(devs, i), "prefetches") +
                    field(json_object_array_get_idx(devs, i), "early_evictions");
        json_object_put(whole);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (v > 0 || now.tv_sec - t0.tv_sec > 10)
            return v;
        nanosleep(&nap, NULL);
    }
}

/* The regions table holds regions of both devices, each saying whose, and
 * counts them all (the same publish's device figures). */
static void regions_of_both(json_object *whole, json_object *devs)
{
    json_object *regs = NULL, *total = NULL;
    assert_true(json_object_object_get_ex(whole, "regions", &regs));
    assert_true(json_object_object_get_ex(whole, "regions_total", &total));
    int64_t on[2] = {0, 0};
    for (size_t i = 0; i < json_object_array_length(regs); i++) {
        int64_t d = field(json_object_array_get_idx(regs, i), "device");
        assert_true(d == 0 || d == 1);
        on[d]++;
    }
    assert_true(on[0] > 0 && on[1] > 0);
    assert_int_equal(json_object_get_int64(total),
                     field(json_object_array_get_idx(devs, 0), "regions") +
                         field(json_object_array_get_idx(devs, 1), "regions"));
}

/* The telemetry shows both devices, device 1 with the evictions its budget
 * forced, once the publisher (every 250 ms) has caught up: asked again
 * until it has, for at most 10 s. */
static void shows_both(void)
{
    struct timespec t0, now, nap = {0, 50 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        json_object *whole = NULL, *devs = top_devices(&whole);
        int ok = json_object_array_length(devs) == 2;
        json_object *d1 = ok ? json_object_array_get_idx(devs, 1) : NULL;
        if (ok && field(d1, "device") == 1 && field(d1, "evictions") > 0) {
            assert_int_equal(field(d1, "budget"), (int64_t)(BUDGET_MB * MiB));
            assert_true(field(d1, "host_bytes") > 0);
            assert_int_equal(field(json_object_array_get_idx(devs, 0), "device"), 0);
            regions_of_both(whole, devs);
            json_object_put(whole);
            return;
        }
        json_object_put(whole);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 10)
            fail_msg("stagehand-top never showed device 1's evictions");
        nanosleep(&nap, NULL);
    }
}

/* ---- the cases (children) ---- */

/* Both devices' memory is regions, each device within its own budget. */
static void case_both(void)
{
    void *more0[MAX_FILL], *more1[MAX_FILL];
    size_t f1, t1;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    void *a = region_on(0, 10);
    void *b = region_on(1, 20);
    info_on(1, &f1, &t1);
    assert_int_equal(t1, BUDGET_MB * MiB); /* device 1's own budget */
    assert_true(f1 <= (BUDGET_MB - REGION_MB) * MiB);

    /* every allocation path, device 0 current */
    void *c = pmalloc(REGION_MB * MiB, 1), *d = NULL;
    assert_non_null(c);
    assert_int_equal(current(), 0);
    assert_int_equal(residency(c), 1);
    assert_int_equal(device_of(c), 1);
    cudaStream_t s1;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&d, REGION_MB * MiB, s1), cudaSuccess);
    assert_int_equal(residency(d), 1);
    assert_int_equal(device_of(d), 1);
    assert_int_equal(cudaFreeAsync(d, s1), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
    pfree(c, REGION_MB * MiB, 1);
    /* a device that is not there: nothing allocated, nothing changed */
    assert_null(pmalloc(REGION_MB * MiB, 7));
    assert_null(pmalloc(REGION_MB * MiB, 7)); /* asked again: still no such device */
    assert_int_equal(current(), 0);
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* no error left for the program */

    /* filling device 1 evicts device 1's regions only */
    int n1 = push_out(1, b, more1);
    assert_int_equal(residency(a), 1);
    shows_both();
    assert_int_equal(device_of(b), 1); /* on the host, still device 1's memory */
    /* and device 0's budget is its own */
    int n0 = push_out(0, a, more0);
    assert_int_equal(n0 >= BUDGET_MB / REGION_MB - 2, 1);

    /* a handle asked of an evicted device-1 region: brought back to its own
     * device first, then pinned there */
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(residency(b), 0);
    assert_int_equal(cuMemRetainAllocationHandle(&h, b), CUDA_SUCCESS);
    assert_int_equal(residency(b), 1);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);

    /* each device's kernel brings its region back, bytes intact */
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(launch2(k_bump, b), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(residency(b), 1);
    check(b, 20, 1);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(launch2(k_bump, a), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(residency(a), 1);
    check(a, 10, 1);

    /* a device-1 region freed with device 0 current, and the reverse */
    free_all(1, more1, n1);
    free_all(0, more0, n0);
    assert_int_equal(cudaFree(b), cudaSuccess);
    assert_int_equal(residency(b), -1);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(residency(a), -1);
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
}

/* Device 0 opens device 1 and works on a region of device 1 while it
 * moves: brought back by a kernel on device 0, and waited for while a slow
 * one writes it. */
static void case_peer(void)
{
    void *more[MAX_FILL], *more2[MAX_FILL];
    cudaStream_t s;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    void *r = region_on(1, 40);
    int n = push_out(1, r, more);
    assert_int_equal(launch2(k_bump, r), cudaSuccess); /* on device 0 */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(residency(r), 1);
    check(r, 40, 1);

    void *w = region_on(1, 0);
    assert_int_equal(fill_on(k_fill_slow, w, 99, s), cudaSuccess);
    int n2 = push_out(1, w, more2); /* the kernel is still running */
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    check(w, 99, 0);
    free_all(1, more, n);
    free_all(1, more2, n2);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* A table in device 0's memory holds the address of a region of device 1,
 * evicted; a kernel on device 0 follows it and writes the region. */
static void case_table(void)
{
    void *more[MAX_FILL], *table = NULL;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    void *r = region_on(1, 7);
    assert_int_equal(cudaMalloc(&table, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(device_of(table), 0);
    assert_int_equal(cudaMemcpy(table, &r, sizeof r, cudaMemcpyHostToDevice), cudaSuccess);
    int n = push_out(1, r, more);
    assert_int_equal(launch2(k_bump_via, table), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    free_all(1, more, n); /* whatever moves next keeps the write */
    void *more2[MAX_FILL];
    int n2 = residency(r) == 1 ? push_out(1, r, more2) : 0;
    check(r, 7, 1);
    free_all(1, more2, n2);
    assert_int_equal(cudaFree(table), cudaSuccess);
}

/* A copy of a device-1 region on a device-0 stream, queued behind a slow
 * kernel there, while device 1's allocations evict it: no peer access,
 * yet the eviction must wait for device 0's work (the simulated GPU
 * faults a copy whose memory is remapped before it ends). */
static void case_copy(void)
{
    void *more[MAX_FILL];
    uint32_t *back = NULL;
    cudaStream_t s;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    void *busy = region_on(0, 0), *r = region_on(1, 3);
    assert_int_equal(cudaMallocHost((void **)&back, REGION_MB * MiB), cudaSuccess);
    assert_int_equal(fill_on(k_fill_slow, busy, 0, s), cudaSuccess); /* keeps s busy */
    assert_int_equal(cudaMemcpyAsync(back, r, REGION_MB * MiB, cudaMemcpyDeviceToHost, s),
                     cudaSuccess);
    int n = push_out(1, r, more);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += back[i] != 3 + (uint32_t)i;
    assert_int_equal(bad, 0);
    assert_int_equal(cudaFreeHost(back), cudaSuccess);
    free_all(1, more, n);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* Windows opened so far, on every device. */
static uint64_t windows(void)
{
    stagehand_stats_t st = {0};
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    assert_non_null(get);
    assert_int_equal(get(&st, sizeof st), 0);
    return st.remap_windows;
}

struct pusher {
    const void *r;
    void *more[MAX_FILL];
    int n, evicted;
};

/* push_out on device 1 from another thread (no cmocka asserts here). */
static void *push_thread(void *arg)
{
    struct pusher *p = arg;
    while (p->n < MAX_FILL && residency(p->r) == 1 &&
           (p->more[p->n] = pmalloc(REGION_MB * MiB, 1)) != NULL)
        p->n++;
    p->evicted = residency(p->r) == 0;
    return NULL;
}

/* What is issued on device 0 while device 1's window is open. */
enum in_window { KERNEL, KERNEL_PEER, COPY };

/* Both devices managed, device 1's eviction opens a window whose drain
 * waits for a kernel on device 1, which waits for work on device 0 issued
 * while the window is open: a kernel that sets the flag, or a copy into
 * it of the first word of the region being evicted (5). Returns whether
 * the kernel on device 1 gave up waiting: the work on device 0 waited for
 * the window. */
static int launch_in_window(enum in_window what)
{
    int peer = what == KERNEL_PEER;
    static atomic_int go;
    cudaStream_t s1;
    atomic_store(&spin_gave_up, 0);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    if (peer)
        assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    void *r0 = region_on(0, 9);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
    void *r = region_on(1, 5);
    atomic_store(&go, 0);
    assert_int_equal(launch2_on(k_wait_go, (void *)&go, s1), cudaSuccess);
    uint64_t before = windows();
    struct pusher p = {.r = r};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, push_thread, &p), 0);
    double until = now_s() + WAIT_GO_S;
    while (windows() == before && now_s() < until) /* the window is open: its drain waits */
        sched_yield();
    assert_true(windows() > before);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    if (what == COPY)
        assert_int_equal(cudaMemcpyAsync((void *)&go, r, sizeof go, cudaMemcpyDeviceToHost, NULL),
                         cudaSuccess);
    else
        assert_int_equal(launch2_on(k_set_go, (void *)&go, NULL), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    pthread_join(t, NULL);
    assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
    assert_true(atomic_load(&go)); /* the work on device 0 ran, in the end */
    assert_true(p.evicted);
    check(r, 5, 0);
    check(r0, 9, 0);
    free_all(1, p.more, p.n);
    assert_int_equal(cudaFree(r), cudaSuccess);
    assert_int_equal(cudaFree(r0), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
    return atomic_load(&spin_gave_up);
}

/* Without peer access the launch on device 0 reaches no region of device
 * 1, so device 1's gate does not hold it back. With one gate for both
 * devices it would wait for the window, and the kernel on device 1 would
 * give up. */
static void case_apart(void)
{
    assert_false(launch_in_window(KERNEL));
}

/* With peer access from device 0 to device 1, a kernel on device 0 may
 * reach device 1's regions: the same launch waits for the window, so the
 * kernel on device 1 gives up (after a second), and the window closes. */
static void case_held(void)
{
    wait_go_s = 1;
    assert_true(launch_in_window(KERNEL_PEER));
}

/* A copy names its memory: one on device 0's stream reading a region of
 * device 1 waits for device 1's window, peer access or not. */
static void case_copy_held(void)
{
    wait_go_s = 1;
    assert_true(launch_in_window(COPY));
}

/* v + i, bumped k times: what check_k expects of word i. */
static uint32_t bumped(uint32_t v, int k)
{
    for (int j = 0; j < k; j++)
        v = v * 3 + 1;
    return v;
}

static void check_k(const void *d, uint32_t v, int k)
{
    uint32_t *h = malloc(WORDS * 4);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, WORDS * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i += 997) /* a word in every page and more */
        bad += h[i] != bumped(v + (uint32_t)i, k);
    free(h);
    assert_int_equal(bad, 0);
}

#define WEIGHTS 12 /* 96 MB of weights on device 1, against its 64 MB budget */
#define STEPS   8

/* Training steps on device 1, more than its budget holds, with step
 * marks, so that its scheduler learns them and prefetches (and evicts
 * early) on device 1's own streams; each step a kernel on device 0 also
 * writes the first weight through a pointer in device 0's memory. The
 * bumps run on a stream of device 1 and last long enough for a window to
 * fall inside one: a move that did not wait for it faults it. Every word
 * must come out bumped as often as it was. */
static void case_train(void)
{
    int64_t (*step)(void) = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "stagehand_step");
    assert_non_null(step);
    void *w[WEIGHTS], *table = NULL;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    assert_int_equal(cudaMalloc(&table, REGION_MB * MiB), cudaSuccess); /* device 0 is main */
    for (int i = 0; i < WEIGHTS; i++)
        w[i] = region_on(1, 100u * (uint32_t)i);
    assert_int_equal(cudaMemcpy(table, &w[0], sizeof w[0], cudaMemcpyHostToDevice), cudaSuccess);
    cudaStream_t s1;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    for (int s = 0; s < STEPS; s++) {
        step();
        assert_int_equal(cudaSetDevice(1), cudaSuccess);
        for (int i = 0; i < WEIGHTS; i++)
            assert_int_equal(launch2_on(k_bump_slow, w[i], s1), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
        assert_int_equal(cudaSetDevice(0), cudaSuccess);
        assert_int_equal(launch2(k_bump_via, table), cudaSuccess);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    }
    check_k(w[0], 0, 2 * STEPS);
    for (int i = 1; i < WEIGHTS; i++)
        check_k(w[i], 100u * (uint32_t)i, STEPS);
    assert_true(device1_moves() > 0); /* the moves under test happened */
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s1), cudaSuccess);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaFree(table), cudaSuccess);
    for (int i = 0; i < WEIGHTS; i++)
        assert_int_equal(cudaFree(w[i]), cudaSuccess);
}

static int run_case(const char *name)
{
    if (register_kernels() != 0)
        return 1;
    if (strcmp(name, "both") == 0)
        case_both();
    else if (strcmp(name, "peer") == 0)
        case_peer();
    else if (strcmp(name, "table") == 0)
        case_table();
    else if (strcmp(name, "copy") == 0)
        case_copy();
    else if (strcmp(name, "train") == 0)
        case_train();
    else if (strcmp(name, "apart") == 0)
        case_apart();
    else if (strcmp(name, "held") == 0)
        case_held();
    else if (strcmp(name, "copy_held") == 0)
        case_copy_held();
    else
        fail_msg("no case %s", name);
    return 0;
}

static void test_case(void **state)
{
    (void)state;
    const char *name = getenv("E2E_DEVICES_CASE");
    if (!preloaded || !name)
        skip();
    assert_int_equal(run_case(name), 0);
}

/* ---- the parent ---- */

/* The case in a child, with one more variable when extra is set. */
static int rerun_with(const char *name, const char *drain, const char *extra)
{
    char c[64], d[64];
    snprintf(c, sizeof c, "E2E_DEVICES_CASE=%s", name);
    snprintf(d, sizeof d, "STAGEHAND_TRANSFER_DRAIN_MODE=%s", drain);
    /* copies take time on the bus (8 MB: 4 ms), so one can be caught in flight */
    const char *env[] = {c, d, "SIMCUDA_PCIE_GBPS=2", extra, NULL};
    return e2e_rerun(saved_argv, env);
}

static int rerun(const char *name, const char *drain)
{
    return rerun_with(name, drain, NULL);
}

/* The per-step lines of a telemetry file: device 1's evictions and
 * restores over all of them, and the lines that listed both devices. */
static int jsonl_devices(const char *path, uint64_t *evictions, uint64_t *restores)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[16384];
    int both = 0;
    *evictions = *restores = 0;
    while (fgets(line, sizeof line, f)) {
        json_object *o = json_tokener_parse(line), *list = NULL;
        assert_non_null(o);
        if (json_object_object_get_ex(o, "devices", &list) && json_object_array_length(list) == 2) {
            both++;
            json_object *d1 = json_object_array_get_idx(list, 1), *v;
            assert_true(json_object_object_get_ex(d1, "device", &v));
            assert_int_equal(json_object_get_int(v), 1);
            assert_true(json_object_object_get_ex(d1, "evictions", &v));
            *evictions += (uint64_t)json_object_get_int64(v);
            assert_true(json_object_object_get_ex(d1, "restores", &v));
            *restores += (uint64_t)json_object_get_int64(v);
        }
        json_object_put(o);
    }
    fclose(f);
    return both;
}

#define PARENT()                                                                                   \
    do {                                                                                           \
        if (!preloaded || getenv("E2E_DEVICES_CASE"))                                              \
            skip();                                                                                \
    } while (0)

static void test_each_device_has_its_own_pool(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("both", "device"), 0);
}

/* tracked is asked for too: the library keeps to the device-wide drain. */
static void test_peer_kernel_on_a_moving_region(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("peer", "device"), 0);
    assert_int_equal(rerun("peer", "tracked"), 0);
}

static void test_copy_on_another_device_in_flight(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("copy", "device"), 0);
}

static void test_training_steps_on_the_second_device(void **state)
{
    (void)state;
    PARENT();
    char path[] = "/tmp/stagehand-e2e-devices-XXXXXX.jsonl", env[96];
    int fd = mkstemps(path, 6);
    assert_true(fd >= 0);
    close(fd);
    snprintf(env, sizeof env, "STAGEHAND_TELEMETRY_TELEMETRY_FILE=%s", path);
    assert_int_equal(rerun_with("train", "device", env), 0);
    /* The per-step lines list both devices, with device 1's moves. */
    uint64_t evictions, restores;
    assert_true(jsonl_devices(path, &evictions, &restores) >= STEPS - 2);
    assert_true(evictions > 0 && restores > 0);
    unlink(path);
    assert_int_equal(rerun("train", "tracked"), 0);
}

static void test_window_holds_back_only_its_device(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("apart", "device"), 0);
    assert_int_equal(rerun("apart", "tracked"), 0);
    assert_int_equal(rerun("held", "device"), 0);
    assert_int_equal(rerun("copy_held", "device"), 0);
}

static void test_pointer_from_one_device_into_another(void **state)
{
    (void)state;
    PARENT();
    assert_int_equal(rerun("table", "device"), 0);
    assert_int_equal(rerun("table", "tracked"), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_DEVICES_CONFIGURED")) {
        setenv("E2E_DEVICES_CONFIGURED", "1", 1);
        setenv("SIMCUDA_DEVICES", "2", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_CONFIG", "/dev/null", 1); /* the built-in defaults */
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        setenv("STAGEHAND_GENERAL_DEVICES", "all", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_case),
        cmocka_unit_test(test_each_device_has_its_own_pool),
        cmocka_unit_test(test_peer_kernel_on_a_moving_region),
        cmocka_unit_test(test_copy_on_another_device_in_flight),
        cmocka_unit_test(test_pointer_from_one_device_into_another),
        cmocka_unit_test(test_training_steps_on_the_second_device),
        cmocka_unit_test(test_window_holds_back_only_its_device),
    };
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_devices (preloaded)" : "e2e_devices (disabled)", tests, NULL, NULL);
}
